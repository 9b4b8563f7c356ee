import Glibc

/// Adding and removing sources, timers and observers. Every method may be called from any
/// thread. The member's binding changes at once, on the calling thread: a member is on one loop
/// at a time (adding it to a second loop traps, naming both), and once removed from its last mode
/// it may be added to any loop at once. The loop applies the change on its own thread: at once
/// when called there, otherwise at the start of its next pass (before it checks whether the mode
/// has anything to watch, and before it runs any block or executor job sent after the change),
/// woken to do so. Changes from one thread are applied in the order they were made.
///
/// "Its last mode" counts mode *names*, `.common` being one: a member added to `.common` stays on
/// the loop until it is removed from `.common` (removing `.default` by name takes it out of that
/// mode only; a mode that joins the common set later still receives it), and removing `.common`
/// undoes adding to `.common` only, leaving the modes the member was also added to by name.
///
/// Adding anything to a loop that has terminated (shut down and drained) invalidates it at once,
/// so that whoever waits on it (a sleeping task, an async sequence) ends instead of hanging.
extension RunLoopThread {
  // MARK: Custom input sources

  /// Schedules `source` in `mode` (every common mode for `.common`). The first time it joins
  /// this loop its `schedule` routine runs on the loop thread. Adding it twice is a no-op; an
  /// invalidated source is ignored. Any thread.
  ///
  /// Traps if the source is on another loop: remove it from every mode there first.
  public func add(_ source: InputSource, to mode: RunLoopMode = .default) {
    bind(source, to: mode)
  }

  /// Removes `source` from `mode`; when that was its last mode here, its `cancel` routine runs on
  /// the loop thread. Removing a source that is not there is a no-op. Any thread.
  public func remove(_ source: InputSource, from mode: RunLoopMode = .default) {
    unbind(source, from: mode)
  }

  // MARK: Timers

  /// Schedules `timer` in `mode` (every common mode for `.common`). Adding it twice is a no-op;
  /// an invalidated timer is ignored. Any thread. Traps if the timer is on another loop.
  public func add(_ timer: LoopTimer, to mode: RunLoopMode = .default) {
    if case .manual(let clock) = shared.timeSource { timer.resolveDelay(now: clock.nowNanoseconds) }
    bind(timer, to: mode)
  }

  /// Removes `timer` from `mode`; it stays valid and can be added again, to this loop or, once
  /// removed from its last mode, to another. Any thread.
  public func remove(_ timer: LoopTimer, from mode: RunLoopMode = .default) {
    unbind(timer, from: mode)
  }

  // MARK: Observers

  /// Adds `observer` to `mode` (every common mode for `.common`). Any thread. Traps if the
  /// observer is on another loop.
  public func add(_ observer: LoopObserver, to mode: RunLoopMode = .default) {
    bind(observer, to: mode)
  }

  /// Removes `observer` from `mode`; once removed from its last mode it may be added to another
  /// loop. Any thread.
  public func remove(_ observer: LoopObserver, from mode: RunLoopMode = .default) {
    unbind(observer, from: mode)
  }

  // MARK: Readiness sources

  /// Schedules a readiness source in `mode`: registers its descriptor with the loop's epoll the
  /// first time. Any thread. Traps if the source is on another loop.
  /// - Throws: `SystemCallError` with `EBADF` when the descriptor is not open, `EPERM` when it
  ///   cannot be polled (a regular file or directory), or what epoll reports when called on the
  ///   loop thread. A thrown error means the add did not happen: the source stays valid, on no
  ///   loop, and may be added again. From other threads, a failure that only epoll can detect
  ///   invalidates the source and reports `[.error]` to its handler on the loop thread, with the
  ///   error in `source.registrationError` (the add is applied there later; the caller does not
  ///   wait for it: see `DescriptorSource`, "When an add fails").
  public func add(_ source: DescriptorSource, to mode: RunLoopMode = .default) throws(SystemCallError) {
    // On the loop thread of a running loop the add is applied here and epoll's own answer
    // (EBADF, EPERM) is returned: checking first would cost every add a system call more.
    if !shared.isOnLoopThread || shared.core.hasTerminated {
      var status = stat()
      guard fstat(source.descriptor, &status) == 0 else {
        throw SystemCallError(call: "fstat(fd \(source.descriptor))", errno: EBADF)
      }
      let kind = status.st_mode & S_IFMT
      if kind == S_IFREG || kind == S_IFDIR {
        throw SystemCallError(call: "epoll_ctl(ADD, fd \(source.descriptor))", errno: EPERM)
      }
    }
    if let failure = bind(source, to: mode) { throw failure }
  }

  /// Removes a readiness source from `mode`; when that was its last mode, its descriptor is
  /// deregistered. Any thread.
  public func remove(_ source: DescriptorSource, from mode: RunLoopMode = .default) {
    unbind(source, from: mode)
  }

  // MARK: Common modes

  /// Adds `mode` to the common set: everything already in `.common` joins it. Any thread.
  public func addModeToCommonModes(_ mode: RunLoopMode) {
    shared.onLoopThread { core in core.applyAddToCommonModes(mode) }
  }

  /// The modes in the common set. Loop thread only.
  public var commonModes: Set<RunLoopMode> {
    preconditionOnLoopThread()
    return core.modeTable.commonModes
  }

  // MARK: The shared lifecycle

  private enum SendOutcome {
    case sent(LoopInbox.WakeAction)
    case ignored
    case refusedTerminated
    case onAnotherLoop(LoopShared)
  }

  // On the loop thread, the changes other threads sent are applied around the binding's change:
  // before it, so that their callouts (a cancel routine, a command source's closing delivery),
  // which may add or remove this same member here, find the binding as it was before this call;
  // and after it, for a change of this member that another thread sent in between (senders hold
  // the member's lock while they send, so such a change was made before this one and must be
  // applied first), but only through the last change sent before the binding changed: one sent
  // after (the opposite call on this member from another thread, say) must not overtake this
  // call (`LoopCore.sequenceOfWaitingChanges`). Each application takes only what is in the inbox
  // when it begins, so a flood of changes from another thread does not hold the call.
  //
  // A call made inside the loop's application of changes (from a schedule or cancel routine, say)
  // applies the queue only as far as this member's own earlier add or removal, if one waits
  // (`LoopCore.changeBindingInOrder`): applying the whole rest there recursed once per waiting
  // change (20,000 waiting adds whose schedule routines add a timer overflowed the stack), and
  // let changes sent after the outer call overtake it.

  /// Binds `member` to this loop in `mode` and has the loop apply the add
  /// (`LoopMember.applyAdd`): inline on the loop thread (after the changes other threads sent
  /// before, so they keep their order), returning its failure; from other threads sent while the
  /// member's lock is held, so the loop applies every thread's calls on this member in the order
  /// their bindings changed. A loop that has terminated refuses: the member is invalidated. Traps
  /// when the member is on another loop. (No closure is made on the loop thread: adds there
  /// allocate nothing beyond the member's record.)
  @discardableResult
  func bind<Member: LoopMember>(_ member: Member, to mode: RunLoopMode) -> SystemCallError? {
    let shared = self.shared
    if shared.isOnLoopThread {
      let core = shared.core
      guard !core.hasTerminated else {  // (a cancel routine of the drain's last detach adding)
        member.invalidateMember()
        return nil
      }
      switch core.changeBindingInOrder(of: member, { $0.bind(to: shared, mode: mode) }) {
      case .accepted(let record):
        // A record that left this loop already (see `MemberRecord.hasLeft`): a stale add.
        return record.hasLeft ? nil : member.applyAdd(on: core, record: record, mode: mode, callerWaits: true)
      case .refused:
        return nil
      case .onAnotherLoop(let other):
        Self.trapOnAnotherLoop(Member.kindName, current: other, requested: self)
      }
    }
    let outcome: SendOutcome = member.withBinding { binding in
      let lastLoop = binding.lastLoop  // what a refused add restores
      // Already bound here: an earlier add, accepted, is on its way or applied (a shutting-down
      // loop past its drain cap refuses this one but still applies that one, then detaches the
      // member), so a refusal must not undo that add's binding or its pending join.
      let boundHereBefore = binding.record(on: shared) != nil
      switch binding.bind(to: shared, mode: mode) {
      case .accepted(let record):
        guard let (wake, sequence) = shared.sendNumbered(.add(member, record, mode)) else {
          if !boundHereBefore { binding.forget(shared, restoringLastLoop: lastLoop) }
          return .refusedTerminated
        }
        binding.noteSent(sequence, to: shared)
        return .sent(wake)
      case .refused:
        return .ignored
      case .onAnotherLoop(let other):
        return .onAnotherLoop(other)
      }
    }
    switch outcome {
    case .sent(let wake): perform(wake)
    case .ignored: break
    case .refusedTerminated: member.invalidateMember()
    case .onAnotherLoop(let other): Self.trapOnAnotherLoop(Member.kindName, current: other, requested: self)
    }
    return nil
  }

  /// Unbinds `member` from `mode` of this loop (a no-op when it is not here) and has the loop
  /// apply the removal, in order with the member's other calls (see `bind`).
  func unbind<Member: LoopMember>(_ member: Member, from mode: RunLoopMode) {
    let shared = self.shared
    if shared.isOnLoopThread {
      let core = shared.core
      guard let record = core.changeBindingInOrder(of: member, { $0.unbind(from: shared, mode: mode) }) else {
        return
      }
      core.applyRemove(record, from: mode)
      return
    }
    let wake: LoopInbox.WakeAction? = member.withBinding { binding in
      guard let record = binding.unbind(from: shared, mode: mode) else { return nil }
      // Refused: the loop has terminated and detached every member already.
      guard let (wake, sequence) = shared.sendNumbered(.remove(record, mode)) else { return nil }
      binding.noteSent(sequence, to: shared)
      return wake
    }
    if let wake { perform(wake) }
  }
}

// The loop's side of an accepted add, per kind (see `LoopMember.applyAdd`).

extension InputSource {
  func applyAdd(on core: LoopCore, record: MemberRecord, mode: RunLoopMode, callerWaits: Bool) -> SystemCallError? {
    core.applyAdd(self, record, to: mode)
    return nil
  }
}

extension LoopTimer {
  func applyAdd(on core: LoopCore, record: MemberRecord, mode: RunLoopMode, callerWaits: Bool) -> SystemCallError? {
    core.applyAdd(self, record, to: mode)
    return nil
  }
}

extension LoopObserver {
  func applyAdd(on core: LoopCore, record: MemberRecord, mode: RunLoopMode, callerWaits: Bool) -> SystemCallError? {
    core.applyAdd(self, record, to: mode)
    return nil
  }
}

extension DescriptorSource {
  /// A registration epoll refuses is returned to a caller waiting on the loop thread, and the
  /// source stays valid: the add did not happen, as when another thread's add is refused by its
  /// `fstat` check. Otherwise nobody waits for an answer: the handler is told `[.error]`, and the
  /// source is invalidated.
  func applyAdd(on core: LoopCore, record: MemberRecord, mode: RunLoopMode, callerWaits: Bool) -> SystemCallError? {
    do throws(SystemCallError) {
      try core.applyAdd(self, record, to: mode)
      return nil
    } catch {
      // A stale add (the source was removed from this loop meanwhile, and may be on another
      // loop now): nothing here to report or drop; its record is settled, never attached.
      let isCurrent = withBinding { binding in
        guard binding.record(on: core.shared) === record else {
          binding.recordSettled()
          return false
        }
        return true
      }
      guard isCurrent else { return callerWaits ? error : nil }
      guard !callerWaits else {
        // Left as an add and a removal here leave it: on no loop, valid, free to be added again
        // (once its descriptor can be polled), to this loop or another.
        withBinding { binding in
          binding.forget(core.shared, restoringLastLoop: core.shared)
          binding.loopLetGo(core.shared)
        }
        return error
      }
      recordRegistrationError(error)  // before the handler hears of it: it may look
      fire(.error, on: core.shared)
      withBinding { $0.forget(core.shared, restoringLastLoop: core.shared) }
      invalidate()
      return nil
    }
  }
}

extension LoopMember {
  /// The kind's `invalidate()`.
  func invalidateMember() {
    switch self {
    case let source as InputSource: source.invalidate()
    case let source as DescriptorSource: source.invalidate()
    case let timer as LoopTimer: timer.invalidate()
    case let observer as LoopObserver: observer.invalidate()
    default: preconditionFailure("AsyncRunLoop: unknown member kind \(Self.kindName)")
    }
  }
}

extension LoopCore {
  /// Loop thread: runs `change` on the member's binding, under its lock, with the changes other
  /// threads sent applied around it in order (see the comment above `RunLoopThread.bind`). Outside
  /// the application of changes: everything sent before, then, after the binding changed, what
  /// was sent up to that moment. Inside it (a callout of a change): only as far as this member's
  /// own earlier add or removal, if one waits, before and after.
  func changeBindingInOrder<Member: LoopMember, Result>(
    of member: Member, _ change: (inout MemberBinding) -> Result
  ) -> Result {
    guard isApplyingControls else {
      applyControlsIfAny()
      let (result, sentBefore) = member.withBinding { binding in (change(&binding), sequenceOfWaitingChanges()) }
      if let sentBefore { applyControls(through: sentBefore) }
      return result
    }
    let sentBefore = member.withBinding { $0.lastSentSequence(on: shared) }
    if changes.mayWait(sentBefore) { applyControls(through: sentBefore) }
    let (result, sentSince) = member.withBinding { binding in
      (change(&binding), binding.lastSentSequence(on: shared))
    }
    if changes.mayWait(sentSince) { applyControls(through: sentSince) }
    return result
  }
}
