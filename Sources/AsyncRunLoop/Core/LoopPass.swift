/// What one run of the loop carries through its passes. Each run (nested ones too) has its own,
/// so a nested run cannot disturb the run it is nested in.
struct RunContext {
  let contents: ModeContents
  /// CLOCK_MONOTONIC nanoseconds; `Int64.max` for no limit.
  let deadline: Int64
  let returnAfterSourceHandled: Bool
  /// The owned thread's top-level run: stays alive with nothing to watch (jobs can still arrive).
  let keepsAlive: Bool
  /// Asked between passes: true ends the run as `.stopped` (an async run whose task was cancelled).
  let shouldEnd: (@Sendable () -> Bool)?
  /// This run's ready sources (step 4), a reused buffer.
  var readySources: [MemberRecord]
}

/// One run of the loop: a list of phases, one small method each, numbered as in the DocC article
/// "One pass of the loop". Loop thread only.
extension LoopCore {
  /// Runs the loop in `mode` until it is stopped, its time limit passes, it has nothing to watch,
  /// `shouldEnd` says so, or (when asked) one input source fired.
  func run(
    mode: RunLoopMode, deadline: Int64, returnAfterSourceHandled: Bool, keepsAlive: Bool,
    shouldEnd: (@Sendable () -> Bool)? = nil
  ) -> RunLoopRunResult {
    let tracksRuns = shared.divertsJobsAtShutdown
    if tracksRuns {
      if runDepth == 0 { enterOutermostRun() }
      runDepth += 1
    }
    defer {
      if tracksRuns {
        runDepth -= 1
        if runDepth == 0 { leaveOutermostRun() }
      }
    }
    applyControls(bounded: true)
    let contents = modeTable.contents(for: mode)
    var run = RunContext(
      contents: contents, deadline: deadline, returnAfterSourceHandled: returnAfterSourceHandled,
      keepsAlive: keepsAlive, shouldEnd: shouldEnd, readySources: spareReadyBuffers.popLast() ?? [])
    defer { spareReadyBuffers.append(run.readySources) }
    if isFinished(run) { return .finished }  // no entry/exit told
    notifyObservers(contents, .entry)  // 1
    let result = runPasses(&run)
    notifyObservers(contents, .exit)  // 10
    return result
  }

  /// A current loop's thread enters a run: from now on it may run jobs (see
  /// `LoopInbox.threadIsInRun`).
  private func enterOutermostRun() {
    shared.inboxLock.withLock { shared.inbox.threadIsInRun = true }
  }

  /// A current loop's thread leaves its outermost run: the jobs the run took and did not run go
  /// back to the front of the inbox (so every accepted job is there while the thread is out of a
  /// run), and if the loop is shut down they leave for the fallback executor with the rest.
  private func leaveOutermostRun() {
    assert(jobDepth == 0, "AsyncRunLoop: the outermost run ended inside a job")
    let diverted: LoopShared.DivertedJobs = shared.inboxLock.withLock {
      if localJobIndex < localJobs.count {
        shared.inbox.jobs.insert(contentsOf: localJobs[localJobIndex...], at: 0)
      }
      localJobs.removeAll(keepingCapacity: true)
      localJobIndex = 0
      shared.inbox.threadIsInRun = false
      return shared.divertJobsLocked(for: loop)
    }
    diverted.finish(for: loop)
  }

  /// Passes 2–9 until a pass ends the run.
  private func runPasses(_ run: inout RunContext) -> RunLoopRunResult {
    // A stop requested while the loop was not running ends this run at once (after entry).
    if consumeStop() { return .stopped }
    // Nested in a source's handler: the sources that step 4 further out has not fired yet are
    // still signalled; consider them here too, instead of leaving them until the nested run ends.
    let outerUnfired = unfiredReadySources
    for record in outerUnfired { spareSignalled.append(SignalledRecord(record: record, sequence: 0)) }
    defer { unfiredReadySources = outerUnfired }
    let mode = run.contents.mode
    while true {
      beginPass(run)  // 2
      notifyObservers(run.contents, .beforeSources)  // 3
      runWork(in: mode, applyingControls: false)  // work point A: blocks and jobs sent so far
      var handledSource = fireSignalledSources(&run)  // 4
      runWork(in: mode, applyingControls: true)  // work point B: what the sources released
      handledSource = waitAndHandleReadiness(run, handledSource: handledSource) || handledSource  // 5–8
      // 9; work point C: what the timers released lands now, not a pass later.
      runWork(in: mode, applyingControls: fireDueTimers(in: run.contents))
      if let result = endOfPass(run, handledSource: handledSource) { return result }
    }
  }

  /// Step 2: registration changes from other threads, the mode's descriptors armed (a nested run
  /// in another mode may have silenced them), then observers are told beforeTimers.
  @inline(__always)
  private func beginPass(_ run: RunContext) {
    applyControls(bounded: true)
    armDescriptors(for: run.contents)
    notifyObservers(run.contents, .beforeTimers)
  }

  /// End of pass, in CF's order: handled a source, timed out, stopped (or asked to end, or the
  /// loop is shutting down), finished. nil: another pass.
  @inline(__always)
  private func endOfPass(_ run: RunContext, handledSource: Bool) -> RunLoopRunResult? {
    if run.returnAfterSourceHandled && handledSource { return .handledSource }
    if run.deadline != Int64.max && run.deadline <= LoopClock.monotonicNanoseconds() { return .timedOut }
    if consumeStop() { return .stopped }
    if let shouldEnd = run.shouldEnd, shouldEnd() { return .stopped }
    if isFinished(run) { return .finished }
    return nil
  }

  /// Whether sleeping now would strand something the inbox does not know about, or overrun the
  /// run: the time limit passed (without one there is nothing to compare: no clock read, the hot
  /// path); jobs left over from a capped work point; the mode emptied by a handler (nothing would
  /// wake the sleep, and the end of the pass must report finished); a signal deferred or collected
  /// after step 4 (the next pass fires it); a block for this mode that a nested run collected; a
  /// run that was asked to end.
  private func mustNotSleep(_ run: RunContext) -> Bool {
    run.deadline != Int64.max && run.deadline <= LoopClock.monotonicNanoseconds()
      || hasWaitingControls || hasRunnableJobs || isFinished(run) || hasDeferredSource(in: run.contents)
      || !spareSignalled.isEmpty || hasRunnablePerform(in: run.contents.mode)
      || (run.shouldEnd?() ?? false)
  }

  /// Whether a signalled source waits in `deferredSignalled` although it is in this mode: it
  /// joined the mode after step 4 of this pass, already signalled. Its signal is kept only here,
  /// not in the inbox, so sleeping would strand it until some other wake-up.
  private func hasDeferredSource(in contents: ModeContents) -> Bool {
    deferredSignalled.contains { $0.isIn(contents) }
  }

  /// Nothing to watch in the mode, and no jobs (that may run here) or blocks for this mode
  /// waiting (CF counts pending blocks too). A loop that serves as an executor never finishes.
  private func isFinished(_ run: RunContext) -> Bool {
    guard run.contents.hasNothingToWatch, !run.keepsAlive, !hasRunnableJobs, !hasWaitingControls else {
      return false
    }
    // Only blocks that can run in this mode keep it alive (as in CF): one waiting for another
    // mode would otherwise keep an empty run asleep with nothing to wake it.
    let mode = run.contents.mode
    if hasRunnablePerform(in: mode) { return false }
    let inCommon = modeTable.commonModes.contains(mode)
    let countsJobs = mayRunJobs
    return shared.inboxLock.withLock {
      (!countsJobs || shared.inbox.jobs.isEmpty) && shared.inbox.controls.isEmpty
        && !shared.inbox.performs.contains { $0.canRun(in: mode, inCommon: inCommon) }
    }
  }

  /// Consumes a pending `stop()`. During shutdown every run, at every nesting level, stops.
  private func consumeStop() -> Bool {
    shared.inboxLock.withLock {
      if shared.inbox.lifecycle != .active { return true }
      guard shared.inbox.stopRequested else { return false }
      shared.inbox.stopRequested = false
      return true
    }
  }

  /// Tells the mode's observers about `activity`, in order. Cheap when nobody asked for it. An
  /// observer removed by an earlier callout of the same notification is not told.
  @inline(__always)
  func notifyObservers(_ contents: ModeContents, _ activity: LoopActivity) {
    guard contents.observedActivities.contains(activity) else { return }
    for case let record? in contents.observers {
      guard case .observer(let observer)? = record.kind, observer.activities.contains(activity),
        record.isIn(contents)
      else { continue }
      observer.notify(activity, on: shared)
    }
  }

  /// Step 4: fires every signalled custom source that is in this mode, lower orders first (equal
  /// orders in signalling order), once every registration change that arrived before its signal
  /// was applied. Sources signalled while in other modes only wait in `deferredSignalled`.
  /// Returns whether any fired. Allocates nothing in the steady state.
  private func fireSignalledSources(_ run: inout RunContext) -> Bool {
    if spareSignalled.isEmpty && deferredSignalled.isEmpty { return false }
    run.readySources.removeAll(keepingCapacity: true)
    if !deferredSignalled.isEmpty {
      // Signalled before everything collected since: first, so equal orders keep signalling order.
      spareSignalled.insert(
        contentsOf: deferredSignalled.lazy.map { SignalledRecord(record: $0, sequence: 0) }, at: 0)
      deferredSignalled.removeAll(keepingCapacity: true)
    }
    // A change sent before a signal that still waits (a bounded pass left it) may end the
    // source's registration: that signal waits with it (the loop stays awake), while signals
    // that arrived before every waiting change fire now, so a flood of changes from another
    // thread does not hold every source back.
    let barrier = changeBarrier
    var sameOrder = true
    var waiting = 0
    for index in spareSignalled.indices {
      let signalled = spareSignalled[index]
      if signalled.sequence >= barrier {
        spareSignalled[waiting] = signalled  // kept, in order, at the front
        waiting += 1
        continue
      }
      let record = signalled.record
      // Not on this loop (removed, or moved away): the signal stays on the source for the loop it
      // joins next. A source listed twice fires once (`consumeSignal` answers once per signal).
      guard record.isAttached else { continue }
      if record.isIn(run.contents) {
        if let first = run.readySources.first, first.order != record.order { sameOrder = false }
        run.readySources.append(record)
      } else {
        deferredSignalled.append(record)  // in other modes: fires when one of them runs
      }
    }
    spareSignalled.removeSubrange(waiting...)
    if !sameOrder {
      // Stable: equal orders keep signalling order.
      let sorted = run.readySources.enumerated().sorted { lhs, rhs in
        lhs.element.order != rhs.element.order ? lhs.element.order < rhs.element.order : lhs.offset < rhs.offset
      }
      run.readySources = sorted.map(\.element)
    }
    var fired = false
    let ready = run.readySources
    let outerUnfired = unfiredReadySources
    for index in ready.indices {
      // Detached by an earlier handler of this step: not here any more.
      guard let source = ready[index].source, let perform = source.consumeSignal(on: shared) else { continue }
      unfiredReadySources = ready[(index + 1)...]
      perform(source)
      fired = true
    }
    unfiredReadySources = outerUnfired
    run.readySources.removeAll(keepingCapacity: true)
    return fired
  }

  /// Arms the timerfd for the earlier of the mode's next timer (delayed by at most its
  /// tolerance, never past the next timer's date) and the run's deadline.
  private func armTimerfd(_ run: RunContext) {
    let contents = run.contents
    var wake = run.deadline == Int64.max ? nil : run.deadline as Int64?
    if let first = contents.timers.first {
      var timerWake = first.deadline.addingSaturating(first.element.timer.toleranceNanoseconds)
      if let next = contents.timers.deadlineAfterFirst { timerWake = min(timerWake, max(next, first.deadline)) }
      wake = min(wake ?? Int64.max, timerWake)
    }
    poller.setTimer(deadline: wake)
  }

  /// Steps 5–8. Polls (no sleep, no beforeWaiting/afterWaiting) when the run must return after a
  /// source that fired, or work is waiting; otherwise tells observers, sleeps, and tells them it
  /// woke. Delivers readiness events. Returns whether a readiness source fired.
  ///
  /// A loop that watches no descriptor and no timer can only be woken by another thread: it
  /// sleeps on its futex word instead of in `epoll_wait`, and a poll asks the kernel nothing.
  private func waitAndHandleReadiness(_ run: RunContext, handledSource: Bool) -> Bool {
    let mayBlock = !(handledSource && run.returnAfterSourceHandled) && !mustNotSleep(run)
    // A nested run in another mode (from a handler, block or job above) may have silenced this
    // mode's registrations: listen to them again before sleeping. (Free unless it did.)
    armDescriptors(for: run.contents)
    armTimerfd(run)
    var mechanism = sleepMechanism
    var ticket: UInt32 = 0
    var sleeps = mayBlock && decideToSleep(on: mechanism, ticket: &ticket)
    let announcesSleep = sleeps
    if sleeps && run.contents.observedActivities.contains(.beforeWaiting) {
      notifyObservers(run.contents, .beforeWaiting)  // 6
      // The callouts may have added a timer or a descriptor, or moved a timer: watch them in
      // this sleep. They may also have sent work, or run the loop nested, which took work into
      // the loop's own hands or woke it up in the inbox's eyes (producers would then stay
      // silent): decide again, everything step 5 checks, with a fresh ticket.
      armDescriptors(for: run.contents)
      armTimerfd(run)
      mechanism = sleepMechanism
      sleeps = !mustNotSleep(run) && decideToSleep(on: mechanism, ticket: &ticket)
    }
    var fired = false
    // The owned thread's own run lets go of its handle while it sleeps (see `LoopCore+Thread`).
    let letsGo = sleeps && run.keepsAlive
    if letsGo { releaseHandleForSleep() }
    switch mechanism {
    case .futex:
      if sleeps { poller.sleepOnFutex(ticket: ticket) }  // 7
      if letsGo { reacquireHandleAfterSleep() }
    case .epoll:
      poller.wait(block: sleeps, afterWait: { if letsGo { reacquireHandleAfterSleep() } }) { token, events in  // 7
        fired = handleReadiness(token: token, events: events, contents: run.contents) || fired
      }
      noteUnknownTokensAfterWait()
    }
    applyControls(afterWake: true, bounded: true)  // awake again; this pass is the one a wake-up asked for
    if announcesSleep { notifyObservers(run.contents, .afterWaiting) }  // 8
    return fired
  }

  /// Tells the inbox the loop is about to sleep on `mechanism`, unless work is waiting; reads the
  /// futex ticket under the same lock (a wake-up after the decision changes the word, so the
  /// futex sleep then returns at once). Inside a job, waiting jobs do not keep the loop awake (it
  /// cannot run them): they wake it when they arrive, and run once the job returns.
  private func decideToSleep(on mechanism: LoopInbox.SleepMechanism, ticket: inout UInt32) -> Bool {
    let ignoresJobs = !mayRunJobs
    shared.inboxLock.lock()
    defer { shared.inboxLock.unlock() }
    guard shared.inbox.prepareToSleep(on: mechanism, ignoringJobs: ignoresJobs) else { return false }
    ticket = poller.futexTicket()
    return true
  }

  /// How the loop would sleep now: on the futex when only another thread can wake it (no
  /// descriptor registered, the timerfd disarmed), else in `epoll_wait`.
  private var sleepMechanism: LoopInbox.SleepMechanism {
    descriptorsByToken.isEmpty && !poller.isTimerArmed ? .futex : .epoll
  }

  /// Delivers one readiness event; silences a registration that is not in the running mode.
  private func handleReadiness(token: UInt64, events: UInt32, contents: ModeContents) -> Bool {
    guard let record = descriptorsByToken[token], let source = record.registration?.source else {
      // Removed already (by a handler earlier in this wait), or kept by epoll for a closed number.
      if unknownTokensLastWait.contains(token) { needsEpollPurge = true }
      unknownTokensThisWait.insert(token)
      return false
    }
    guard tokenByDescriptor[source.descriptor] == token else {
      // The number was closed and now belongs to a newer registration, but epoll still reports
      // this one (a `dup` keeps its file open): it reports another file than the number names,
      // so it never fires again, and epoll must forget it.
      record.markRegistrationLost()
      needsEpollPurge = true
      return false
    }
    guard record.isIn(contents) else {
      setArmed(record, false)  // level-triggered: would fire forever in a mode that ignores it
      return false
    }
    source.fire(DescriptorEvents(rawValue: events), on: shared)
    return true
  }

  /// Step 9: fires the mode's due timers in (date, scheduling) order, popping them one by one, so
  /// a run nested in a callout still finds the other due timers. A timer scheduled by a callout
  /// waits for the next pass, and a timer never fires inside its own callout (a nested run in
  /// another of its modes leaves it). Returns whether any fired.
  private func fireDueTimers(in contents: ModeContents) -> Bool {
    guard let head = contents.timers.firstDeadline, head <= LoopClock.monotonicNanoseconds() else { return false }
    let now = LoopClock.monotonicNanoseconds()
    let newest = timerSequence
    // With their records (held: a callout may invalidate a set-aside timer, freeing the record
    // that an extra entry only points at).
    var setAside: [(entry: IndexedTimerHeap<TimerEntry>.Entry, record: MemberRecord)] = []
    var fired = false
    while let deadline = contents.timers.firstDeadline, deadline <= now {
      let first = contents.timers.popFirst().unsafelyUnwrapped
      let record = first.element.record
      if record.isFiring {
        // Its callout is running further out: the entry stays out of the heap (a due entry left
        // in would arm the timerfd in the past and make this nested run spin) until the callout
        // returns and `fire` puts the timer's entries back. (A new record of the timer, or one on
        // another loop, is told by `LoopTimer.fire`: `.busy`.)
        continue
      }
      if first.sequence > newest {
        setAside.append((first, record))  // scheduled by a callout of this pass
        continue
      }
      fired = true
      fire(record, first.element.timer, firedAt: first.deadline)
    }
    for (entry, record) in setAside where entry.element.heapSlot < 0 && record.isAttached {
      // Still this mode's entry of the timer (not removed, or replaced by a remove and re-add)
      // and not re-timed meanwhile: back in the heap as it was.
      guard let membership = record.modes.first(where: { $0.contents === contents }),
        membership.timerEntry(of: record) === entry.element
      else { continue }
      contents.timers.insert(entry.element, deadline: entry.deadline, sequence: entry.sequence)
    }
    return fired
  }

  /// Fires one timer, then moves a repeating timer to the next point of its grid, keeps a fire
  /// date set during the callout, or invalidates a one-shot timer, whatever the callout did to the
  /// timer's modes (as CF does). The timer's entries then all follow its date: the one this pass
  /// popped and any a nested run parked go back into their heaps, and so do those of a new record
  /// when the callout removed the timer and added it here again. A timer whose handler did not run
  /// (moved to another loop, invalidated, or moved later by a `setFireDate` not applied yet) is
  /// left to the change on its way here.
  ///
  /// A timer whose callout is running already (`LoopTimer.FireOutcome.busy`: this record is new,
  /// made by a callout further out that removed the timer and added it again, or the timer was
  /// moved here from a callout on another loop) is not run: its entry stays out of the heap until
  /// that callout returns and re-times it.
  private func fire(_ record: MemberRecord, _ timer: LoopTimer, firedAt fireDate: Int64) {
    record.isFiring = true
    let outcome = timer.fire(on: shared, dueAt: fireDate)
    record.isFiring = false
    let after: LoopTimer.AfterFire
    let recordHere: MemberRecord?
    switch outcome {
    case .ran(let left, let record):
      (after, recordHere) = (left, record)
    case .busy:
      return
    case .skipped:
      if record.isAttached && timer.isBound(to: shared) { pushTimerEntries(record) }  // back at its date
      return
    }
    let current: MemberRecord? = record.isAttached ? record : recordHere
    switch after {
    case .rescheduled, .advanced:
      if let current, current.isAttached { pushTimerEntries(current) }
    case .finished:
      // One-shot: done (`afterFire` invalidated it); also its new record, if it came back here.
      detach(record)
      if let current { detach(current) }
    }
  }

  /// Makes a timer's heap entries match its fire date and modes: each mode's entry is moved to
  /// the date (or put back, after a fire popped it), in O(log n).
  func pushTimerEntries(_ record: MemberRecord) {
    guard !record.modes.isEmpty, let timer = record.attachedTimer else { return }
    let date = timer.fireDateNanoseconds
    for membership in record.modes {
      guard let entry = membership.timerEntry(of: record) else { continue }
      timerSequence &+= 1
      if entry.heapSlot >= 0 {
        membership.contents.timers.update(entry, deadline: date, sequence: timerSequence)
      } else {
        membership.contents.timers.insert(entry, deadline: date, sequence: timerSequence)
      }
    }
  }

  /// Arms the readiness registrations of `contents`' mode after a mode switch (lazy: the loop
  /// silences registrations of other modes only when they report events).
  private func armDescriptors(for contents: ModeContents) {
    guard armedMode != contents.mode else { return }
    armedMode = contents.mode
    for record in contents.descriptors.values where !record.isArmed && !record.isPaused {
      setArmed(record, true)
    }
  }

  /// After a wait: keeps this wait's unknown tokens for the next one, and rebuilds the epoll set
  /// when one of them must go (`unknownTokensLastWait`). Free unless a wait reported one.
  private func noteUnknownTokensAfterWait() {
    if needsEpollPurge { purgeLingeringRegistrations() }
    guard !unknownTokensThisWait.isEmpty || !unknownTokensLastWait.isEmpty else { return }
    swap(&unknownTokensLastWait, &unknownTokensThisWait)
    unknownTokensThisWait.removeAll(keepingCapacity: true)
  }

  /// Rebuilds the epoll set with the registrations that are armed and still own their numbers:
  /// what epoll kept for closed numbers is dropped with the old set (see `EpollPoller.rebuild`).
  func purgeLingeringRegistrations() {
    needsEpollPurge = false
    unknownTokensLastWait.removeAll()
    unknownTokensThisWait.removeAll()
    var keep: [(descriptor: Int32, events: UInt32, token: UInt64)] = []
    for (token, record) in descriptorsByToken where record.isArmed {
      guard let source = record.registration?.source, tokenByDescriptor[source.descriptor] == token else {
        record.markRegistrationLost()
        continue
      }
      keep.append((source.descriptor, source.epollEvents, token))
    }
    guard let refused = poller.rebuild(keeping: keep) else { return }
    for token in refused {
      descriptorsByToken[token]?.markRegistrationLost()  // closed meanwhile
    }
  }

  /// Listens to a readiness registration again, or silences it. Silencing takes it out of the
  /// epoll set: a registration with no interest bits still reports errors and hang-ups (the
  /// kernel always adds them), so in a mode that ignores it a hung-up descriptor would end every
  /// wait at once.
  func setArmed(_ record: MemberRecord, _ armed: Bool) {
    guard record.token != 0, record.isArmed != armed, let source = record.registration?.source else { return }
    guard armed else {
      // Only while the number is still this registration's: if the descriptor was closed and
      // the number reused, epoll dropped this one already, and the number's set entry belongs
      // to the newer registration. The file is noted only if the registration was still in the
      // set (the number still named its file); gone already, the descriptor was closed and the
      // source can never fire again.
      record.file = nil
      if tokenByDescriptor[source.descriptor] == record.token, poller.deregister(descriptor: source.descriptor) {
        record.file = SystemCall.fileIdentity(of: source.descriptor)
      }
      record.isArmed = false
      return
    }
    // The number may belong to a newer registration by now (this descriptor was closed and the
    // number reused): then this one can never fire again.
    guard tokenByDescriptor[source.descriptor] == record.token else { return }
    // Silenced, the registration was out of the epoll set: if the number names another file now
    // (closed and reused meanwhile), registering it would report that file's events here.
    guard let file = record.file, SystemCall.fileIdentity(of: source.descriptor) == file else { return }
    do {
      try poller.register(descriptor: source.descriptor, events: source.epollEvents, token: record.token)
      record.isArmed = true
    } catch {
      // The descriptor was closed behind our back: it can never fire again.
      record.isArmed = false
    }
  }
}
