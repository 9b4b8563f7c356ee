import Glibc

/// The loop-thread side of the member lifecycle: applying the adds, removals and invalidations
/// that `RunLoopThread` accepted (at once on the loop thread, otherwise in the order they were
/// made, at the loop's next look at its inbox). One shape for every kind: a record is created on
/// the first add, joins and leaves modes, and is detached when it leaves its last mode or its
/// member is invalidated; only the kind's join and detach effects differ.
extension LoopCore {
  // MARK: Adding

  /// Applies an accepted add. A member invalidated after its add was accepted is still scheduled
  /// and then detached at once, so what was promised for it (its cancel routine, the delivery of
  /// commands accepted meanwhile) still happens.
  func applyAdd(_ source: InputSource, to mode: RunLoopMode) {
    let (record, created) = modeTable.recordCreatingIfNeeded(source, .source(source))
    modeTable.add(record, to: mode)
    if created {
      let (schedule, signalled) = source.joined(loop)
      if signalled { deferredSignalled.append(source) }  // signalled before it got here
      schedule?(source, loop, mode == .common ? .default : mode)
    }
    detachIfInvalidated(record)
  }

  func applyAdd(_ timer: LoopTimer, to mode: RunLoopMode) {
    let (record, _) = modeTable.recordCreatingIfNeeded(timer, .timer(timer))
    if !modeTable.add(record, to: mode).isEmpty { pushTimerEntries(record) }
    detachIfInvalidated(record)
  }

  func applyAdd(_ observer: LoopObserver, to mode: RunLoopMode) {
    let (record, _) = modeTable.recordCreatingIfNeeded(observer, .observer(observer))
    modeTable.add(record, to: mode)
    detachIfInvalidated(record)
  }

  /// Registers the descriptor on the first add, then adds it to the mode.
  /// - Throws: what epoll reports (the record is dropped again).
  func applyAdd(_ source: DescriptorSource, to mode: RunLoopMode) throws(SystemCallError) {
    let (record, created) = modeTable.recordCreatingIfNeeded(source, .descriptor(source))
    if created {
      let token = nextToken
      nextToken += 1
      do {
        try poller.register(descriptor: source.descriptor, events: source.epollEvents, token: token)
      } catch {
        modeTable.forget(record)
        throw error
      }
      record.token = token
      record.isArmed = true
      descriptorsByToken[token] = record
      tokenByDescriptor[source.descriptor] = token
    }
    modeTable.add(record, to: mode)
    armedMode = nil  // re-evaluate which registrations the running mode needs
    detachIfInvalidated(record)
  }

  // MARK: Removing

  /// Applies an accepted removal from `mode`; a member that left its last mode is detached.
  func applyRemove(_ member: AnyObject, from mode: RunLoopMode) {
    guard let record = modeTable.record(for: member) else { return }
    if modeTable.remove(record, from: mode) {
      detach(record)
    } else if case .timer = record.kind {
      record.generation &+= 1  // its modes changed (its entry left that mode's heap)
    }
  }

  /// Applies an invalidation (or a shutdown): the member leaves every mode and is detached.
  func applyInvalidate(_ member: some LoopMember) {
    guard let record = modeTable.takeRecord(for: member) else {
      member.releaseAfterInvalidation(onThreadOf: loop)  // not here (any more): only its closures are left
      return
    }
    detach(record)
  }

  /// A timer's fire date moved: its entries follow.
  func applyReschedule(_ timer: LoopTimer) {
    guard let record = modeTable.record(for: timer) else { return }
    pushTimerEntries(record)
  }

  /// Adds `mode` to the common set: every member already in `.common` joins it.
  func applyAddToCommonModes(_ mode: RunLoopMode) {
    for record in modeTable.addToCommonModes(mode) {
      if case .timer = record.kind { pushTimerEntries(record) }  // an entry in the new mode's heap
    }
    armedMode = nil
  }

  // MARK: Detaching

  private func detachIfInvalidated(_ record: MemberRecord) {
    if !record.member.withBinding({ $0.isValid }) { detach(record) }
  }

  /// Removes the record from every mode and the registry, then runs the kind's detach effects:
  /// a custom source's cancel routine, a descriptor's deregistration, a timer's stale entries.
  func detach(_ record: MemberRecord) {
    guard !record.isDetached else { return }  // detached already
    modeTable.removeEverywhere(record)
    switch record.kind {
    case .source(let source):
      if !deferredSignalled.isEmpty { deferredSignalled.removeAll { $0 === source } }
      let leave = source.left(loop)
      leave.close?(source)
      leave.cancel?(source, loop)
    case .descriptor(let source):
      if record.token != 0 {
        descriptorsByToken[record.token] = nil
        // Unless the number now belongs to a newer registration (the old descriptor was closed
        // and the number reused).
        if tokenByDescriptor[source.descriptor] == record.token {
          tokenByDescriptor[source.descriptor] = nil
          poller.deregister(descriptor: source.descriptor)
        }
        record.token = 0
        record.isArmed = false
      }
    case .timer:
      record.generation &+= 1  // `removeEverywhere` took its entries out of the heaps
    case .observer:
      break
    }
  }

  // MARK: Sequences

  /// Pauses (or resumes) a readiness registration for a sequence consumer whose buffer is full.
  func setPaused(_ source: DescriptorSource, _ paused: Bool) {
    guard let record = modeTable.record(for: source) else { return }
    record.isPaused = paused
    setArmed(record, !paused)
  }

  /// Whether `member` is in any mode of this loop (for tests and assertions).
  func modeCount(of member: AnyObject) -> Int {
    modeTable.record(for: member)?.modes.count ?? 0
  }
}
