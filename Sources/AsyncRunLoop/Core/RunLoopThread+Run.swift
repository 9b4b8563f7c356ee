/// Running the loop: one pass is a list of phases, one small method each, numbered as in SPEC §6
/// and the DocC article "One pass of the loop".
extension RunLoopThread {
  /// Runs the loop in `mode` until it is stopped, its time limit passes, it has nothing to
  /// watch, or (when asked) one input source fired. Loop thread only; runs may nest (a handler may
  /// run the loop again, usually in another mode; the outer run resumes afterwards).
  /// - Parameters:
  ///   - mode: The mode to run in (not `.common`).
  ///   - deadline: When to return `.timedOut`; `.distantFuture` runs without a limit, a deadline
  ///     already passed makes one pass that does not sleep (no `beforeWaiting`).
  ///   - returnAfterSourceHandled: Return `.handledSource` after the first pass in which an input
  ///     source (custom or readiness) fired. Timers never end a run.
  /// - Returns: Why the run ended.
  @discardableResult
  public func run(
    mode: RunLoopMode = .default, until deadline: LoopClock.Instant = .distantFuture,
    returnAfterSourceHandled: Bool = false
  ) -> RunLoopRunResult {
    runLoop(mode: mode, until: deadline, returnAfterSourceHandled: returnAfterSourceHandled, servingExecutor: false)
  }

  /// `run`, plus `servingExecutor`: the owned thread's own top-level run, which stays alive with
  /// nothing to watch because jobs can still arrive (SPEC §1). Loop thread.
  func runLoop(
    mode: RunLoopMode, until deadline: LoopClock.Instant, returnAfterSourceHandled: Bool, servingExecutor: Bool
  ) -> RunLoopRunResult {
    preconditionOnLoopThread("run(mode:until:returnAfterSourceHandled:)")
    precondition(mode != .common, "AsyncRunLoop: .common is a set of modes; run one of its modes instead")
    applyControls()
    let contents = modeTable.contents(for: mode)
    let keepsAlive = servingExecutor
    if isFinished(contents, keepsAlive: keepsAlive) { return .finished }  // no entry/exit told
    notifyObservers(contents, .entry)  // 1
    let result = runPasses(
      contents, deadline: deadline.nanoseconds, returnAfterSourceHandled: returnAfterSourceHandled,
      keepsAlive: keepsAlive)
    notifyObservers(contents, .exit)  // 10
    return result
  }

  /// Runs the loop for at most `duration`. Loop thread only. See `run(mode:until:returnAfterSourceHandled:)`.
  @discardableResult
  public func run(
    mode: RunLoopMode = .default, for duration: Duration, returnAfterSourceHandled: Bool = false
  ) -> RunLoopRunResult {
    run(mode: mode, until: .now.advanced(by: duration), returnAfterSourceHandled: returnAfterSourceHandled)
  }

  /// Passes 2–9 until a pass ends the run.
  private func runPasses(
    _ contents: ModeContents, deadline: Int64, returnAfterSourceHandled: Bool, keepsAlive: Bool
  ) -> RunLoopRunResult {
    // A stop requested while the loop was not running ends this run at once (after entry).
    if consumeStop() { return .stopped }
    while true {
      // The inbox lock is taken a handful of times per pass: `collectInbox` takes everything other
      // threads sent in one go, and the phases below work on the loop's own copies.
      applyControls()
      armDescriptors(for: contents)
      notifyObservers(contents, .beforeTimers)  // 2
      notifyObservers(contents, .beforeSources)  // 3
      runCollectedPerforms(in: contents.mode)
      runCollectedJobs()
      var handledSource = fireSignalledSources(in: contents)  // 4
      applyControls()  // what the sources (and their resumed tasks) sent lands now, not a pass later
      runCollectedPerforms(in: contents.mode)
      runCollectedJobs()
      let mustPoll =
        handledSource && returnAfterSourceHandled
        || mustNotSleep(contents, deadline: deadline, keepsAlive: keepsAlive)
      // A nested run in another mode (from a handler, block or job above) may have silenced
      // this mode's registrations: listen to them again before sleeping. (Free unless it did.)
      armDescriptors(for: contents)
      armTimerfd(contents, runDeadline: deadline)
      // 5–8: wait for readiness, timers, wake-ups or the limit; poll when work is waiting.
      handledSource =
        waitAndHandleReadiness(contents, mayBlock: !mustPoll, runDeadline: deadline, keepsAlive: keepsAlive)
        || handledSource
      // What the timers sent (jobs of the tasks they resumed) lands now, not a pass later.
      if fireDueTimers(in: contents) { applyControls() }  // 9
      runCollectedPerforms(in: contents.mode)
      runCollectedJobs()
      // End of pass: CF's order — handled a source, timed out, stopped, finished.
      if returnAfterSourceHandled && handledSource { return .handledSource }
      if deadline != Int64.max && deadline <= LoopClock.monotonicNanoseconds() { return .timedOut }
      if consumeStop() { return .stopped }
      if isFinished(contents, keepsAlive: keepsAlive) { return .finished }
    }
  }

  /// Whether sleeping now would strand something the inbox does not know about, or overrun the
  /// run: the time limit passed (without one there is nothing to compare: no clock read, the hot
  /// path); jobs left over from a capped pass; the mode emptied by a handler (a source invalidated
  /// itself, a block removed the last timer: nothing would wake the sleep, and the end of the pass
  /// must report finished); a signal deferred or collected after step 4 (the next pass fires it);
  /// a block for this mode that a nested run collected. Loop thread.
  private func mustNotSleep(_ contents: ModeContents, deadline: Int64, keepsAlive: Bool) -> Bool {
    deadline != Int64.max && deadline <= LoopClock.monotonicNanoseconds()
      || hasLocalWork || isFinished(contents, keepsAlive: keepsAlive) || hasDeferredSource(in: contents)
      || !spareSignalled.isEmpty || hasRunnablePerform(in: contents.mode)
  }

  /// Whether a collected block may run in `mode` (it would have run in this pass's step 2–4
  /// unless a nested run collected it since).
  private func hasRunnablePerform(in mode: RunLoopMode) -> Bool {
    guard !localPerforms.isEmpty else { return false }
    let inCommon = modeTable.commonModes.contains(mode)
    return localPerforms.contains { $0.canRun(in: mode, inCommon: inCommon) }
  }

  /// Whether a signalled source waits in `deferredSignalled` although it is in this mode: it
  /// joined the mode after step 4 of this pass (added by a block, a job or a cross-thread change
  /// applied after step 4, already signalled). Its signal is kept only here, not in the inbox, so
  /// sleeping would strand it until some other wake-up.
  private func hasDeferredSource(in contents: ModeContents) -> Bool {
    deferredSignalled.contains { source in source.memberships.contains { $0 === contents } }
  }

  /// Whether the loop has work of its own that must not wait for an event (jobs left over from a
  /// capped pass; collected blocks that can run in this mode ran already).
  private var hasLocalWork: Bool { localJobIndex < localJobs.count }

  /// SPEC §1: nothing to watch in the mode, and no jobs or blocks for this mode waiting (CF
  /// counts pending blocks too). A loop that serves as an executor (`keepsAlive`) never finishes.
  private func isFinished(_ contents: ModeContents, keepsAlive: Bool) -> Bool {
    guard contents.hasNothingToWatch, !keepsAlive, !hasLocalWork else { return false }
    // Only blocks that can run in this mode keep it alive (as in CF): one waiting for another
    // mode would otherwise keep an empty run asleep with nothing to wake it.
    let inCommon = modeTable.commonModes.contains(contents.mode)
    if localPerforms.contains(where: { $0.canRun(in: contents.mode, inCommon: inCommon) }) { return false }
    return inboxLock.withLock {
      inbox.jobs.isEmpty && inbox.controls.isEmpty
        && !inbox.performs.contains { $0.canRun(in: contents.mode, inCommon: inCommon) }
    }
  }

  /// Consumes a pending `stop()`. During shutdown every run, at every nesting level, stops.
  private func consumeStop() -> Bool {
    inboxLock.withLock {
      if inbox.lifecycle != .active { return true }
      guard inbox.stopRequested else { return false }
      inbox.stopRequested = false
      return true
    }
  }

  /// Takes everything other threads sent since the last look, under one lock: registration
  /// changes, blocks, a new batch of jobs (when the current one is used up) and signalled
  /// sources. `afterWake` also records that the loop is awake (producers need not wake it)
  /// and that the pass a `wakeUp()` asked for is happening.
  func collectInbox(afterWake: Bool = false) {
    let needJobs = localJobIndex >= localJobs.count
    if needJobs && !localJobs.isEmpty {
      localJobs.removeAll(keepingCapacity: true)
      localJobIndex = 0
    }
    inboxLock.lock()
    if afterWake {
      inbox.didWake()
      inbox.wakeRequested = false
    }
    if !inbox.controls.isEmpty { swap(&inbox.controls, &collectedControls) }
    if !inbox.performs.isEmpty {
      localPerforms.append(contentsOf: inbox.performs)
      inbox.performs.removeAll(keepingCapacity: true)
    }
    if needJobs && !inbox.jobs.isEmpty { swap(&inbox.jobs, &localJobs) }
    if !inbox.signalled.isEmpty {
      spareSignalled.append(contentsOf: inbox.signalled)
      inbox.signalled.removeAll(keepingCapacity: true)
    }
    inboxLock.unlock()
  }

  /// Collects the inbox and applies the registration changes other threads sent
  /// (`onLoopThread`), in the order they were sent, before any block or job collected with them
  /// runs (FIFO with respect to both).
  func applyControls(afterWake: Bool = false) {
    collectInbox(afterWake: afterWake)
    guard !collectedControls.isEmpty else { return }
    let controls = collectedControls
    collectedControls.removeAll()
    for change in controls { change() }
  }

  /// Tells the mode's observers about `activity`, in order. Cheap when nobody asked for it.
  @inline(__always)
  func notifyObservers(_ contents: ModeContents, _ activity: LoopActivity) {
    guard contents.observedActivities.contains(activity) else { return }
    for observer in contents.observers where observer.activities.contains(activity) {
      observer.notify(activity)
    }
  }

  /// Runs the collected blocks that may run in `mode`, oldest first; keeps the others.
  /// (Performed blocks are not input sources: they never end a run as "handled a source".)
  private func runCollectedPerforms(in mode: RunLoopMode) {
    guard !localPerforms.isEmpty else { return }
    let pending = localPerforms
    localPerforms.removeAll()
    let inCommon = modeTable.commonModes.contains(mode)
    for request in pending {
      if request.canRun(in: mode, inCommon: inCommon) {
        request.block()
      } else {
        localPerforms.append(request)
      }
    }
  }

  /// Collects the inbox, then runs up to `jobsPerPass` jobs. For callers outside a pass.
  func runJobs() {
    applyControls()
    runCollectedJobs()
  }

  /// Runs collected executor jobs, oldest first, at most `jobsPerPass` per call, so timers and
  /// sources get their turn (a job that re-enqueues itself lands in the inbox, not in the batch
  /// being run, so it runs at most once per call).
  private func runCollectedJobs() {
    guard localJobIndex < localJobs.count else { return }
    let end = min(localJobs.count, localJobIndex + Self.jobsPerPass)
    let serial = asUnownedSerialExecutor()
    let task = asUnownedTaskExecutor()
    while localJobIndex < end {
      let job = localJobs[localJobIndex]
      localJobIndex += 1
      // Each job runs in the role it was enqueued in, so its awaits do not hop (see `JobRole`).
      switch job.role {
      case .serial: job.job.runSynchronously(on: serial)
      case .task: job.job.runSynchronously(on: task)
      }
    }
  }

  /// Step 4: fires every signalled custom source that is in this mode, lower orders first.
  /// Sources signalled while scheduled only in other modes wait in `deferredSignalled`.
  /// Returns whether any fired. Allocates nothing in the steady state (buffers are reused).
  private func fireSignalledSources(in contents: ModeContents) -> Bool {
    if spareSignalled.isEmpty && deferredSignalled.isEmpty { return false }
    readySources.removeAll(keepingCapacity: true)
    if !deferredSignalled.isEmpty {
      spareSignalled.append(contentsOf: deferredSignalled)
      deferredSignalled.removeAll(keepingCapacity: true)
    }
    for source in spareSignalled {
      if source.memberships.contains(where: { $0 === contents }) {
        if !readySources.contains(where: { $0 === source }) { readySources.append(source) }
      } else if !source.memberships.isEmpty, !deferredSignalled.contains(where: { $0 === source }) {
        deferredSignalled.append(source)  // scheduled in other modes: fires when one of them runs
      }
    }
    spareSignalled.removeAll(keepingCapacity: true)
    if readySources.count > 1 { readySources.sort { $0.order < $1.order } }
    var fired = false
    for source in readySources {
      guard let perform = source.consumeSignal() else { continue }
      perform(source)
      fired = true
    }
    readySources.removeAll(keepingCapacity: true)
    return fired
  }

  /// Arms the timerfd for the earlier of the mode's next timer (delayed by at most its
  /// tolerance, never past the next timer's date) and the run's deadline.
  private func armTimerfd(_ contents: ModeContents, runDeadline: Int64) {
    var wake = runDeadline == Int64.max ? nil : runDeadline as Int64?
    dropStaleTimerEntries(contents)
    if let first = contents.timers.first {
      var timerWake = first.deadline.addingSaturating(first.payload.timer.toleranceNanoseconds)
      if let next = contents.timers.deadlineAfterFirst { timerWake = min(timerWake, max(next, first.deadline)) }
      wake = min(wake ?? Int64.max, timerWake)
    }
    poller.setTimer(deadline: wake)
  }

  /// Steps 5–8. Polls (no sleep, no beforeWaiting/afterWaiting) when `mayBlock` is false or work
  /// arrived; otherwise tells observers, sleeps, and tells them it woke. Delivers readiness
  /// events. Returns whether a readiness source fired.
  ///
  /// A loop that watches no descriptor and no timer can only be woken by another thread: it
  /// sleeps on its futex word instead of in `epoll_wait`, and a poll asks the kernel nothing.
  private func waitAndHandleReadiness(
    _ contents: ModeContents, mayBlock: Bool, runDeadline: Int64, keepsAlive: Bool
  ) -> Bool {
    var mechanism = sleepMechanism
    var ticket: UInt32 = 0
    var sleeps = mayBlock && decideToSleep(on: mechanism, ticket: &ticket)
    let announcesSleep = sleeps
    if sleeps && contents.observedActivities.contains(.beforeWaiting) {
      notifyObservers(contents, .beforeWaiting)  // 6
      // The callouts may have added a timer or a descriptor, or moved a timer: watch them in
      // this sleep. They may also have sent work, or run the loop nested, which took work into
      // the loop's own hands or woke it up in the inbox's eyes (producers would then stay
      // silent): decide again, everything step 5 checks, with a fresh ticket.
      armDescriptors(for: contents)
      armTimerfd(contents, runDeadline: runDeadline)
      mechanism = sleepMechanism
      sleeps =
        !mustNotSleep(contents, deadline: runDeadline, keepsAlive: keepsAlive)
        && decideToSleep(on: mechanism, ticket: &ticket)
    }
    var fired = false
    switch mechanism {
    case .futex:
      if sleeps { poller.sleepOnFutex(ticket: ticket) }  // 7
    case .epoll:
      poller.wait(block: sleeps) { token, events in  // 7
        fired = handleReadiness(token: token, events: events, contents: contents) || fired
      }
    }
    applyControls(afterWake: true)  // awake again; this pass is the one a wake-up asked for
    if announcesSleep { notifyObservers(contents, .afterWaiting) }  // 8
    return fired
  }

  /// Tells the inbox the loop is about to sleep on `mechanism`, unless work is waiting; reads the
  /// futex ticket under the same lock (a wake-up after the decision changes the word, so the
  /// futex sleep then returns at once). Returns whether the loop may sleep.
  private func decideToSleep(on mechanism: LoopInbox.SleepMechanism, ticket: inout UInt32) -> Bool {
    inboxLock.lock()
    defer { inboxLock.unlock() }
    guard inbox.prepareToSleep(on: mechanism) else { return false }
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
    guard let source = descriptorsByToken[token] else { return false }  // stale: removed already
    guard source.memberships.contains(where: { $0 === contents }) else {
      setArmed(source, false)  // level-triggered: would fire forever in a mode that ignores it
      return false
    }
    source.fire(DescriptorEvents(rawValue: events))
    return true
  }

  /// Step 9: fires the mode's due timers in (date, scheduling) order. Due timers are collected
  /// first, then fired, so a timer scheduled by a callout waits for the next pass. Returns
  /// whether any fired.
  private func fireDueTimers(in contents: ModeContents) -> Bool {
    guard !contents.timers.isEmpty else { return false }
    let now = LoopClock.monotonicNanoseconds()
    dueTimers.removeAll(keepingCapacity: true)
    while let first = contents.timers.first, first.deadline <= now {
      contents.timers.popFirst()
      let timer = first.payload.timer
      guard first.payload.generation == timer.generation else { continue }  // stale entry
      dueTimers.append((timer, first.deadline, timer.generation))
    }
    var fired = false
    for (timer, fireDate, generation) in dueTimers {
      guard timer.generation == generation else { continue }  // moved or removed by a callout
      fired = true
      timer.fire()
      guard timer.generation == generation else { continue }  // the callout moved or removed it
      if timer.advanceAfterFire(firedAt: fireDate, now: LoopClock.monotonicNanoseconds()) {
        pushTimerEntries(timer)
      } else {
        timer.invalidate()
      }
    }
    dueTimers.removeAll(keepingCapacity: true)
    return fired
  }

  /// Drops stale entries from the top of the mode's timer heap; compacts it when stale entries
  /// outnumber live ones.
  private func dropStaleTimerEntries(_ contents: ModeContents) {
    contents.timers.dropStaleHead { $0.payload.generation == $0.payload.timer.generation }
    if contents.timers.count > 64 && contents.timers.count > 2 * contents.timerCount {
      contents.timers.compact { $0.payload.generation == $0.payload.timer.generation }
    }
  }

  /// Loop thread: makes a timer's heap entries match its fire date and modes (bumps its
  /// generation so older entries go stale, then pushes one entry per mode).
  func pushTimerEntries(_ timer: LoopTimer) {
    timer.generation &+= 1
    guard !timer.memberships.isEmpty else { return }
    let date = timer.fireDateNanoseconds
    for contents in timer.memberships {
      timerSequence &+= 1
      contents.timers.push(
        deadline: date, sequence: timerSequence, payload: TimerHeapPayload(timer: timer, generation: timer.generation))
    }
  }

  /// Arms the readiness registrations of `contents`' mode after a mode switch (lazy: the loop
  /// silences registrations of other modes only when they report events).
  private func armDescriptors(for contents: ModeContents) {
    guard armedMode != contents.mode else { return }
    armedMode = contents.mode
    for source in contents.descriptors where !source.isArmed { setArmed(source, true) }
  }

  /// Listens to a readiness registration again, or silences it. Silencing takes it out of the
  /// epoll set: a registration with no interest bits still reports errors and hang-ups (the
  /// kernel always adds them), so in a mode that ignores it a hung-up descriptor would end every
  /// wait at once. Loop thread.
  func setArmed(_ source: DescriptorSource, _ armed: Bool) {
    guard source.token != 0, source.isArmed != armed else { return }
    guard armed else {
      poller.deregister(descriptor: source.descriptor)  // already gone (closed) is fine
      source.isArmed = false
      return
    }
    // The number may belong to a newer registration by now (this descriptor was closed and the
    // number reused): then this one can never fire again.
    guard tokenByDescriptor[source.descriptor] == source.token else { return }
    do {
      try poller.register(descriptor: source.descriptor, events: source.epollEvents, token: source.token)
      source.isArmed = true
    } catch {
      // The descriptor was closed behind our back: it can never fire again. Drop it.
      source.isArmed = false
    }
  }
}

extension PerformRequest {
  /// Whether the block may run during a pass in `mode` (`inCommon`: `mode` is in the common set).
  @inline(__always)
  func canRun(in mode: RunLoopMode, inCommon: Bool) -> Bool {
    modes.contains(mode) || (inCommon && modes.contains(.common))
  }
}
