/// What a run was asked for, the same in each of its passes: its mode's contents, time limit,
/// whether it returns after a handled source, and when to end early. The innermost run publishes
/// its own as `LoopCore.innermostRun` (early fires ask it).
struct RunTerms {
  let contents: ModeContents
  /// CLOCK_MONOTONIC nanoseconds; `Int64.max` for no limit.
  let deadline: Int64
  let returnAfterSourceHandled: Bool
  /// Asked between passes: true ends the run as `.stopped` (an async run whose task was cancelled).
  let shouldEnd: (@Sendable () -> Bool)?
}

/// What one run of the loop carries through its passes. Each run (nested ones too) has its own,
/// so a nested run cannot disturb the run it is nested in.
struct RunContext {
  let terms: RunTerms
  /// The owned thread's top-level run: stays alive with nothing to watch (jobs can still arrive).
  let keepsAlive: Bool
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
    // The run's first pass begins here (its changes come before entry): one budget for both.
    let outerPassBudget = changes.beginRun()
    defer { changes.endRun(restoring: outerPassBudget) }
    // (Up to a signal collected and not fired yet, as step 2: it fires in this run's first pass.)
    applyControls(bounded: true, stoppingAtSignals: true)
    let contents = modeTable.contents(for: mode)
    let terms = RunTerms(
      contents: contents, deadline: deadline, returnAfterSourceHandled: returnAfterSourceHandled, shouldEnd: shouldEnd)
    var run = RunContext(terms: terms, keepsAlive: keepsAlive, readySources: signalled.takeReadyBuffer())
    defer { signalled.returnReadyBuffer(run.readySources) }
    // No entry/exit told. A shutdown ends every run `.stopped`, also one that a block of its
    // drain starts in a mode it emptied.
    if isFinished(run) { return shared.isShutDown ? .stopped : .finished }
    let outerRun = innermostRun
    innermostRun = terms
    defer { innermostRun = outerRun }
    monitor.runBegan(mode)
    defer { monitor.runEnded() }
    notifyObservers(contents, .entry)  // 1
    let result = runPasses(&run)
    notifyObservers(contents, .exit)  // 10
    return result
  }

  /// A current loop's thread enters a run: from now on it may run jobs, and counts as isolated
  /// unless the jobs left already (see `LoopLifecycle.threadIsInRun`).
  private func enterOutermostRun() {
    shared.inboxLock.withLock {
      shared.inbox.setThreadIsInRun(true)
      shared.publishIsolationLocked()
    }
  }

  /// A current loop's thread leaves its outermost run: the jobs the run took and did not run go
  /// back to the front of the inbox (so every accepted job is there while the thread is out of a
  /// run), and if the loop is shut down they leave for the fallback executor with the rest.
  private func leaveOutermostRun() {
    assert(jobs.mayRun, "AsyncRunLoop: the outermost run ended inside a job")
    let leftover = ChunkedQueue<LoopJob>.chunks(of: jobs.remaining)  // cut outside the lock
    let diverted: LoopShared.DivertedJobs = shared.arrive {
      shared.inbox.jobs.prepend(leftover)
      jobs.discardBatch()
      shared.inbox.setThreadIsInRun(false)
      shared.publishIsolationLocked()  // out of a run: not isolated (the jobs may leave now)
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
    let outerUnfired = signalled.beginNestedRun()
    defer { signalled.endNestedRun(restoring: outerUnfired) }
    let mode = run.terms.contents.mode
    while true {
      let pass = monitor.passBegan()
      beginPass(run)  // 2
      notifyObservers(run.terms.contents, .beforeSources)  // 3
      runWork(in: mode, applyingControls: false)  // work point A: blocks and jobs sent so far
      var handledSource = fireSignalledSources(&run)  // 4
      runWork(in: mode, applyingControls: true)  // work point B: what the sources released
      let firedReadiness = waitAndHandleReadiness(run, handledSource: handledSource)  // 5–9
      handledSource = firedReadiness || handledSource
      // 9; work point C: what the readiness handlers and the timers released lands now, not a
      // pass later.
      let firedTimers = fireDueTimers(in: run.terms.contents)
      let firedScheduledJobs = fireEveryModeTimers(besides: run.terms.contents)
      runWork(in: mode, applyingControls: firedReadiness || firedTimers || firedScheduledJobs)
      monitor.passEnded(pass)
      if let result = endOfPass(run, handledSource: handledSource) { return result }
      changes.beginPass()
    }
  }

  /// Step 2: registration changes from other threads, the mode's descriptors armed (a nested run
  /// in another mode may have silenced them), then observers are told beforeTimers.
  @inline(__always)
  private func beginPass(_ run: RunContext) {
    applyControls(bounded: true, stoppingAtSignals: true)
    armDescriptors(for: run.terms.contents)
    notifyObservers(run.terms.contents, .beforeTimers)
  }

  /// End of pass, in CF's order: handled a source, timed out, stopped (or asked to end, or the
  /// loop is shutting down), finished. nil: another pass.
  @inline(__always)
  private func endOfPass(_ run: RunContext, handledSource: Bool) -> RunLoopRunResult? {
    if run.terms.returnAfterSourceHandled && handledSource { return .handledSource }
    if run.terms.deadline != Int64.max && run.terms.deadline <= shared.nowNanoseconds { return .timedOut }
    if consumeStop() { return .stopped }
    if let shouldEnd = run.terms.shouldEnd, shouldEnd() { return .stopped }
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
    run.terms.deadline != Int64.max && run.terms.deadline <= shared.nowNanoseconds
      || changes.hasWaiting || hasRunnableJobs || isFinished(run) || hasDeferredSource(in: run.terms.contents)
      || signalled.hasCollected || hasRunnablePerform(in: run.terms.contents.mode)
      || (run.terms.shouldEnd?() ?? false)
  }

  /// Whether a signalled source waits among the deferred ones although it is in this mode: it
  /// joined the mode after step 4 of this pass, already signalled. Its signal is kept only here,
  /// not in the inbox, so sleeping would strand it until some other wake-up.
  func hasDeferredSource(in contents: ModeContents) -> Bool {
    signalled.hasDeferred(in: contents, sourceJoins: modeTable.sourceJoins)
  }

  /// Executor jobs due later (a `Task.sleep` in a task that prefers the loop) keep a run of an
  /// empty mode from finishing only when it is a current loop's outermost run (nothing else would
  /// fire them on that thread), or when one is due now (the pass fires it: a thread that keeps
  /// running an empty mode, as a modal wait does, must not starve the sleepers). Any other run
  /// finishes as its mode says (SPEC §6), whatever other tasks sleep: a nested run returns to a
  /// run that fires them, and an owned or the main loop's outermost run stays anyway.
  private var sleepsKeepRunAlive: Bool {
    guard let sleeps = modeTable.everyModeContents, let first = sleeps.timers.firstDeadline else { return false }
    return (shared.divertsJobsAtShutdown && runDepth == 1) || first <= shared.nowNanoseconds
  }

  /// Nothing to watch in the mode, and no jobs (that may run here) or blocks for this mode
  /// waiting (CF counts pending blocks too). A loop that serves as an executor never finishes.
  private func isFinished(_ run: RunContext) -> Bool {
    guard run.terms.contents.hasNothingToWatch, !run.keepsAlive, !hasRunnableJobs, !changes.hasWaiting,
      !sleepsKeepRunAlive
    else {
      return false
    }
    // Only blocks that can run in this mode keep it alive (as in CF): one waiting for another
    // mode would otherwise keep an empty run asleep with nothing to wake it.
    let mode = run.terms.contents.mode
    if hasRunnablePerform(in: mode) { return false }
    guard shared.arrivalsWaiting.load(ordering: .acquiring) else { return true }  // the inbox is empty
    let inCommon = modeTable.commonModes.contains(mode)
    let countsJobs = mayRunJobs
    return shared.inboxLock.withLock {
      (!countsJobs || shared.inbox.jobs.isEmpty) && shared.inbox.controls.isEmpty
        && !shared.inbox.performs.contains { $0.canRun(in: mode, inCommon: inCommon) }
    }
  }

  /// Consumes a pending `stop()`. During shutdown every run, at every nesting level, stops.
  private func consumeStop() -> Bool {
    guard shared.arrivalsWaiting.load(ordering: .acquiring) else { return false }  // no stop, no shutdown
    return shared.inboxLock.withLock {
      if shared.inbox.life.isShutDown { return true }
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
    // Copies (retained buffers): a callout that adds or removes observers does not disturb this
    // notification. The one added is told from the next; the one removed is skipped, also when
    // it was added again meanwhile (a new slot) or stays on the loop through another mode: slots
    // keep their numbers while a notification runs.
    contents.beginObserverNotification()
    defer { contents.endObserverNotification() }
    for bucket in contents.observerBuckets {
      for (slot, entry) in bucket.slots.enumerated() {
        guard let record = entry, let observer = record.attachedObserver, observer.activities.contains(activity),
          record.observerSlot(in: contents) == slot, let claim = record.claim(in: contents)
        else { continue }
        observer.notify(activity, on: shared, record: record, in: claim)
      }
    }
  }

  /// Step 4: fires every signalled custom source that is in this mode, lower orders first (equal
  /// orders in signalling order), once every registration change that arrived before its signal
  /// was applied (see `SignalledSources.sortOut`; sources signalled while in other modes only wait
  /// there). Returns whether any fired. Allocates nothing in the steady state.
  private func fireSignalledSources(_ run: inout RunContext) -> Bool {
    // A change sent before a signal that still waits (a bounded pass left it) may end the
    // source's registration: that signal waits with it (the loop stays awake), while signals
    // that arrived before every waiting change fire now, so a flood of changes from another
    // thread does not hold every source back.
    guard
      signalled.sortOut(
        for: run.terms.contents, sourceJoins: modeTable.sourceJoins, barrier: changes.barrier, into: &run.readySources)
    else { return false }
    var fired = false
    let ready = run.readySources
    let outerUnfired = signalled.unfired
    for index in ready.indices {
      let record = ready[index]
      // Detached by an earlier handler of this step: not here any more.
      guard let source = record.source else { continue }
      // Taken out of this mode by an earlier handler, still in another: its signal waits there.
      guard record.isIn(run.terms.contents) else {
        signalled.deferSource(record)
        continue
      }
      guard let (perform, signalledAt) = source.consumeSignal(on: shared) else { continue }
      signalled.unfired = ready[(index + 1)...]
      observed(.sourceHandler, label: source.label, since: signalledAt) { perform(source) }
      fired = true
    }
    signalled.unfired = outerUnfired
    run.readySources.removeAll(keepingCapacity: true)
    return fired
  }

  /// Arms the timerfd for the earlier of the mode's next timer (delayed by at most its
  /// tolerance, never past the next timer's date) and the run's deadline.
  func armTimerfd(_ terms: RunTerms) {
    var wake = terms.deadline == Int64.max ? nil : terms.deadline as Int64?
    if let timerWake = Self.timerWake(of: terms.contents) { wake = min(wake ?? Int64.max, timerWake) }
    if let everyMode = modeTable.everyModeContents, let timerWake = Self.timerWake(of: everyMode) {
      wake = min(wake ?? Int64.max, timerWake)
    }
    if case .manual(let clock) = shared.timeSource { return clock.loopWillWake(at: wake) }  // no timerfd
    poller.setTimer(deadline: wake)
  }

  /// When `contents`' first timer needs the loop awake: its date delayed by at most its tolerance,
  /// never past the next timer's date; nil without timers.
  @inline(__always)
  private static func timerWake(of contents: ModeContents) -> Int64? {
    guard let first = contents.timers.first else { return nil }
    let timerWake = first.deadline.addingSaturating(first.element.timer.toleranceNanoseconds)
    guard let next = contents.timers.deadlineAfterFirst else { return timerWake }
    return min(timerWake, max(next, first.deadline))
  }

  /// Steps 5–8, and the readiness part of step 9. Polls (no sleep, no beforeWaiting/afterWaiting)
  /// when the run must return after a source that fired, or work is waiting; otherwise tells
  /// observers, sleeps, and tells them it woke, then delivers the readiness events. Returns
  /// whether a readiness source fired.
  ///
  /// A loop that watches no descriptor and no timer can only be woken by another thread: it
  /// sleeps on its futex word instead of in `epoll_wait`, and a poll asks the kernel nothing.
  private func waitAndHandleReadiness(_ run: RunContext, handledSource: Bool) -> Bool {
    let mayBlock = !(handledSource && run.terms.returnAfterSourceHandled) && !mustNotSleep(run)
    // A nested run in another mode (from a handler, block or job above) may have silenced this
    // mode's registrations: listen to them again before sleeping. (Free unless it did.)
    armDescriptors(for: run.terms.contents)
    armTimerfd(run.terms)
    var mechanism = sleepMechanism
    var ticket: UInt32 = 0
    var sleeps = mayBlock && decideToSleep(on: mechanism, ticket: &ticket)
    let announcesSleep = sleeps
    if sleeps && run.terms.contents.observedActivities.contains(.beforeWaiting) {
      notifyObservers(run.terms.contents, .beforeWaiting)  // 6
      // The callouts may have added a timer or a descriptor, or moved a timer: watch them in
      // this sleep. They may also have sent work, or run the loop nested, which took work into
      // the loop's own hands or woke it up in the inbox's eyes (producers would then stay
      // silent): decide again, everything step 5 checks, with a fresh ticket.
      armDescriptors(for: run.terms.contents)
      armTimerfd(run.terms)
      mechanism = sleepMechanism
      sleeps = !mustNotSleep(run) && decideToSleep(on: mechanism, ticket: &ticket)
    }
    // A virtual clock moves here: the "sleep" until the next timer is a jump of its time. Under
    // the inbox lock, and only if nothing arrived since the decision above (a change, a job, a
    // wake-up): a timer added from another thread just before an `advance` is then on the loop
    // before the time jumps past its date, instead of firing late.
    if sleeps, case .manual(let clock) = shared.timeSource {
      let (virtualSleeps, idle) = shared.inboxLock.withLock {
        shared.inbox.wakePending ? (false, []) : clock.loopWouldSleep()
      }
      for waiter in idle { waiter.resume() }
      sleeps = virtualSleeps
    }
    // The owned thread's own run lets go of its handle while it sleeps (see `LoopCore+Thread`).
    let letsGo = sleeps && run.keepsAlive
    if letsGo { releaseHandleForSleep() }
    if sleeps { monitor.willSleep() }
    var readinessWait: UInt64?
    switch mechanism {
    case .futex:
      if sleeps { poller.sleepOnFutex(ticket: ticket) }  // 7
      if sleeps { monitor.didWake() }
      if letsGo { reacquireHandleAfterSleep() }
    case .epoll:
      let slept = sleeps
      readinessWait = poller.wait(  // 7
        block: sleeps,
        afterWait: {
          if slept { monitor.didWake() }
          if letsGo { reacquireHandleAfterSleep() }
        })
    }
    applyControls(afterWake: true, bounded: true)  // awake again; this pass is the one a wake-up asked for
    if announcesSleep { notifyObservers(run.terms.contents, .afterWaiting) }  // 8
    // Then what woke it (CF's order: afterWaiting first). After the look at the inbox above,
    // which records that the loop is awake: work the handlers hand their own loop wakes nothing.
    guard var readinessWait else { return false }
    if !poller.isLatest(wait: readinessWait) {
      // A callout since the wait (an afterWaiting observer, a change's) ran the loop nested: its
      // wait reused the buffer, and a run of another mode silenced this mode's registrations.
      // Poll again, so that this run handles what is ready now (else a callout that nests on
      // every wake-up would keep this run from ever handling it).
      armDescriptors(for: run.terms.contents)
      readinessWait = poller.wait(block: false)
    }
    var fired = false
    poller.deliverReadiness(ofWait: readinessWait) { token, events in
      fired = handleReadiness(token: token, events: events, contents: run.terms.contents) || fired
    }
    noteUnknownTokensAfterWait()
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
    descriptors.isEmpty && !poller.isTimerArmed ? .futex : .epoll
  }

}
