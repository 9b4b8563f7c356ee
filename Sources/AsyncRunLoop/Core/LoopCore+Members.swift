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
  /// commands accepted meanwhile) still happens. `record` is the member's record here (from its
  /// binding); it attaches on the member's first add here.
  func applyAdd(_ source: InputSource, _ record: MemberRecord, to mode: RunLoopMode) {
    let joins = !record.isAttached
    if joins { modeTable.attach(record, .source(source)) }
    modeTable.add(record, to: mode)
    if joins {
      let (schedule, signalled) = source.joined(loop)
      if signalled { self.signalled.deferSource(record) }  // signalled before it got here
      schedule?(source, loop, mode == .common ? .default : mode)
    }
    detachIfInvalidated(record)
  }

  func applyAdd(_ timer: LoopTimer, _ record: MemberRecord, to mode: RunLoopMode) {
    if !record.isAttached { modeTable.attach(record, .timer(timer)) }
    if modeTable.add(record, to: mode) { pushTimerEntries(record) }
    detachIfInvalidated(record)
  }

  func applyAdd(_ observer: LoopObserver, _ record: MemberRecord, to mode: RunLoopMode) {
    if !record.isAttached { modeTable.attach(record, .observer(observer)) }
    modeTable.add(record, to: mode)
    detachIfInvalidated(record)
  }

  /// Registers the descriptor on the first add, then adds it to the mode.
  /// - Throws: what epoll reports (the record is dropped again).
  func applyAdd(_ source: DescriptorSource, _ record: MemberRecord, to mode: RunLoopMode) throws(SystemCallError) {
    if !record.isAttached {
      try refuseIfHeldBySilencedSource(source.descriptor)
      let token = descriptors.registry.nextToken
      try poller.register(descriptor: source.descriptor, events: source.epollEvents, token: token)
      modeTable.attach(record, .descriptor(DescriptorRegistration(source)))
      record.token = descriptors.registry.insert(record, descriptor: source.descriptor)
      record.isArmed = true
    }
    modeTable.add(record, to: mode)
    // A new registration is armed; a silenced one may have joined the running mode: the next
    // pass looks at the silenced ones again.
    if !record.isArmed { descriptors.forgetArmedMode() }
    detachIfInvalidated(record)
  }

  /// Refuses, as epoll refuses a second registration of an armed one (`EEXIST`), a source on a
  /// descriptor that a silenced source here still holds: the silenced one is out of the epoll set,
  /// so epoll would accept the new one, whose number the loop would then take from the silenced
  /// one for good. The number is only free if it names another file now (closed and reused).
  private func refuseIfHeldBySilencedSource(_ descriptor: Int32) throws(SystemCallError) {
    let registry = descriptors.registry
    guard let holder = registry.record(for: registry.liveToken(for: descriptor)), holder.isAttached, !holder.isArmed,
      let file = holder.file, SystemCall.fileIdentity(of: descriptor) == file
    else { return }
    throw SystemCallError(
      call: "epoll_ctl(ADD)", errno: EEXIST,
      reason: "descriptor \(descriptor) is already watched by another DescriptorSource on this loop")
  }

  // MARK: Removing

  /// Applies an accepted removal from `mode`; a member that left its last mode is detached.
  func applyRemove(_ record: MemberRecord, from mode: RunLoopMode) {
    guard record.isAttached, modeTable.remove(record, from: mode) else { return }
    let member = record.member  // (the detach drops the record's reference)
    detach(record)
    // Still valid, and off this loop: a later invalidation no longer needs this loop (see
    // `MemberBinding.loopLetGo`). Only here, not on every detach: an invalidated member has let go
    // already, so the fire of a one-shot timer takes no extra lock. A custom source decides in
    // `InputSource.left`, under the lock it takes anyway.
    if let member, !(member is InputSource) { member.withBinding { $0.loopLetGo(shared) } }
  }

  /// Applies an invalidation (or a shutdown): the member leaves every mode and is detached.
  /// `record` is its record here, or nil when it was removed from here before (the removal, applied
  /// first, detached it).
  func applyInvalidate(_ member: some LoopMember, _ record: MemberRecord?) {
    guard let record, record.isAttached else {
      member.releaseAfterInvalidation(onThreadOf: loop)  // not here (any more): only its closures are left
      return
    }
    detach(record)
  }

  /// A timer's fire date moved: its entries follow.
  func applyReschedule(_ record: MemberRecord) {
    guard let timer = record.attachedTimer else { return }
    timer.rescheduleApplied(for: record)
    pushTimerEntries(record)
  }

  /// Adds `mode` to the common set: every member already in `.common` joins it.
  func applyAddToCommonModes(_ mode: RunLoopMode) {
    for record in modeTable.addToCommonModes(mode) {
      if record.attachedKind == .timer { pushTimerEntries(record) }  // an entry in the new mode's heap
    }
    descriptors.forgetArmedMode()
  }

  // MARK: Detaching

  private func detachIfInvalidated(_ record: MemberRecord) {
    if let member = record.member, !member.withBinding({ $0.isValid }) { detach(record) }
  }

  /// Removes the record from every mode and the registry, then runs the kind's detach effects:
  /// a custom source's cancel routine, a descriptor's deregistration, a timer's stale entries.
  func detach(_ record: MemberRecord) {
    guard let kind = record.kind, record.isAttached else { return }  // not here (detached already)
    modeTable.removeEverywhere(record)
    switch kind {
    case .source(let source):
      // (Left in the deferred signals, if there: the next scan skips it, detached.)
      let leave = source.left(loop)
      leave.close?(source)
      leave.cancel?(source, loop)
      withExtendedLifetime(leave) {}  // the released routines go here, outside the source's lock
    case .descriptor(let registration):  // (the record, detached now, no longer reaches it)
      descriptors.unlistSilenced(registration)
      let source = registration.source
      if registration.token != 0 {
        // Out of the epoll set unless the number now belongs to a newer registration (the old
        // descriptor was closed and the number reused).
        if descriptors.registry.remove(registration.token, descriptor: source.descriptor) {
          poller.deregister(descriptor: source.descriptor)
        }
        registration.token = 0
        registration.isArmed = false
      }
    case .timer, .observer:
      break  // `removeEverywhere` took a timer's entries out of the heaps
    }
  }

  // MARK: Sequences

  /// Pauses (or resumes) a readiness registration for a sequence consumer whose buffer is full.
  /// Resumed, it is armed at once only if the mode the loop armed last holds it; otherwise it
  /// stays silenced until a run of one of its modes arms it (a mode that does not hold it would
  /// only silence it again at its next event).
  func setPaused(_ source: DescriptorSource, _ paused: Bool) {
    guard let record = source.withBinding({ $0.record(on: shared) }), record.isAttached else { return }
    record.isPaused = paused
    if paused {
      setArmed(record, false)
    } else if let mode = descriptors.armedMode, record.modes.contains(where: { $0.contents.mode == mode }) {
      setArmed(record, true)
    }
  }

  /// Whether `member` is in any mode of this loop (for tests and assertions).
  func modeCount(of member: some LoopMember) -> Int { modes(of: member).count }

  /// The modes of this loop that hold `member` (for tests and assertions).
  func modes(of member: some LoopMember) -> [RunLoopMode] {
    guard let record = member.withBinding({ $0.record(on: shared) }), record.isAttached else { return [] }
    return record.modes.map(\.contents.mode)
  }
}
