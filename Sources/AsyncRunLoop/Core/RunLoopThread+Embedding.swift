/// Embedding a loop in another event loop (a host: Foundation's run loop, GLib's, a game loop)
/// that runs on the loop's thread: the host watches one descriptor, sleeps until the deadline the
/// loop names, and makes non-blocking passes. See the DocC article "Embedding a loop".
extension RunLoopThread {
  /// What the host does before it sleeps (`prepareForHostWait(mode:)`).
  public enum EmbeddedWait: Equatable, Sendable {
    /// Work is waiting: make a pass (`runEmbeddedPass(mode:)`) before sleeping, then ask again.
    case passNow
    /// Sleep until `embeddingDescriptor` is readable or `deadline` passes (nil: no deadline),
    /// then make a pass.
    case wait(deadline: LoopClock.Instant?)
    /// The loop has shut down: make one last pass (for the main loop it drains the loop; see
    /// the article) and stop hosting it.
    case shutDown
  }

  /// The descriptor a host polls for readability (`POLLIN`/`EPOLLIN`): it becomes readable when
  /// the loop has work — a source signalled, a timer due, a job or block sent, a `wakeUp()` or
  /// `stop()`, a watched descriptor ready — provided the host called
  /// `prepareForHostWait(mode:)` since its last pass. It is the loop's epoll instance: poll it,
  /// never read it. Loop thread only. It can change after a pass (the loop rebuilds its epoll set
  /// when a closed descriptor lingers in it): read it again after every pass.
  public var embeddingDescriptor: Int32 {
    preconditionOnLoopThread("embeddingDescriptor")
    return poller.pollableDescriptor
  }

  /// Starts embedding: the host serves this loop on its thread from now on. Loop thread only; only
  /// for loops that do not own their thread (`RunLoopThread.current`, `RunLoopThread.main`).
  /// For the main loop this makes `isMainLoopRunning` true (so `runOnMainAndWait` waits instead
  /// of throwing `wouldDeadlock`) until `endEmbedding()`. Calls nest; balance each with
  /// `endEmbedding()`.
  public func beginEmbedding() {
    preconditionOnLoopThread("beginEmbedding()")
    precondition(!ownsThread, "AsyncRunLoop: loop '\(name)' runs on a thread of its own; it cannot be embedded")
    if isMainLoop { MainLoopControl.beginHosting() }
  }

  /// Ends an embedding started with `beginEmbedding()`. Loop thread only. For the main loop,
  /// callers blocked in `runOnMainAndWait` are released with an error when nothing serves the main
  /// loop any more.
  public func endEmbedding() {
    preconditionOnLoopThread("endEmbedding()")
    if isMainLoop { MainLoopControl.endHosting() }
  }

  /// `endEmbedding()` for a host that runs again soon (a program calling
  /// `RunLoop.main.run(mode:before:)` in a loop): when nothing else serves the main loop, it
  /// still counts as served until the next host run, `runMainLoop()`, a run of its own or its
  /// shutdown, so callers blocked in `runOnMainAndWait` wait instead of being refused. Main
  /// thread; for other loops the same as `endEmbedding()`.
  package func endEmbeddingUntilTheHostRunsAgain() {
    preconditionOnLoopThread("endEmbedding()")
    if isMainLoop { MainLoopControl.endHosting(holdingBetweenRuns: true) }
  }

  /// Tells the loop its host is about to sleep, and says until when. Loop thread only, between
  /// passes (also from a callout of this loop: see the article).
  ///
  /// Unless it returns `.passNow`, producers on other threads now wake the loop through the
  /// wake-up eventfd (never the futex), so `embeddingDescriptor` becomes readable for every kind
  /// of work; the loop's timerfd is armed for the mode's next timer, so it becomes readable then
  /// too (a host may sleep on the descriptor alone, or also use the deadline, e.g. to arm a timer
  /// of its own).
  /// - Parameter mode: The mode the host's next pass will run (not `.common`).
  public func prepareForHostWait(mode: RunLoopMode = .default) -> EmbeddedWait {
    preconditionOnLoopThread("prepareForHostWait(mode:)")
    precondition(mode != .common, "AsyncRunLoop: .common is a set of modes; embed one of its modes instead")
    guard !isShutDown else { return .shutDown }
    guard let deadline = core.prepareForHostWait(mode: mode) else { return .passNow }
    return .wait(deadline: deadline.map { LoopClock.Instant(nanoseconds: $0) })
  }

  /// Makes one non-blocking pass in `mode`: what `run(mode:until:)` with a deadline already
  /// passed does (observers told entry, the pass's steps but no sleep — no `beforeWaiting` —,
  /// exit). Loop thread only. A pass may be made from a callout of this loop (it is then a
  /// nested run, as any run there). After the loop has shut down, a pass of the main loop
  /// drains it, as `runMainLoop()` does when it returns; a current loop drains when its thread
  /// exits.
  /// - Returns: Why the pass's run ended: `.timedOut` after an ordinary pass, `.finished` when the
  ///   mode has nothing to watch, `.stopped` after `stop()` or shutdown.
  @discardableResult
  public func runEmbeddedPass(mode: RunLoopMode = .default) -> RunLoopRunResult {
    preconditionOnLoopThread("runEmbeddedPass(mode:)")
    precondition(mode != .common, "AsyncRunLoop: .common is a set of modes; run one of its modes instead")
    // A deadline in the past: one pass that polls instead of sleeping.
    let result = core.run(mode: mode, deadline: 1, returnAfterSourceHandled: false, keepsAlive: false)
    if result == .finished { core.consumeWakeEdge() }
    if isMainLoop && isShutDown && !core.hasTerminated && !MainLoopControl.isRunningItself {
      core.drainForShutdown()
    }
    return result
  }
}

extension LoopCore {
  /// Loop thread, between passes: arms the mode's descriptors and the timerfd, then either finds
  /// work waiting (returns nil: make a pass now) or records, under the inbox lock, that the loop
  /// sleeps in epoll (producers write the wake-up eventfd from now on) and returns the timerfd's
  /// deadline (`.some(nil)`: none).
  func prepareForHostWait(mode: RunLoopMode) -> Int64?? {
    let contents = modeTable.contents(for: mode)
    armDescriptors(for: contents)
    let terms = RunTerms(contents: contents, deadline: Int64.max, returnAfterSourceHandled: false, shouldEnd: nil)
    // A run about to sleep (this is called from its `beforeWaiting` observer) armed the timerfd
    // for its own time limit too: keep that if it comes first. A stale one costs one extra pass.
    let armedByRun = poller.timerDeadline.flatMap { $0 > LoopClock.monotonicNanoseconds() ? $0 : nil }
    armTimerfd(terms)
    if let armedByRun, armedByRun < poller.timerDeadline ?? Int64.max { poller.setTimer(deadline: armedByRun) }
    // What the loop holds that the inbox does not know about (as `mustNotSleep`, without the
    // "mode is empty" case: an empty mode waits for work like any other).
    if changes.hasWaiting || hasRunnableJobs || signalled.hasCollected || hasDeferredSource(in: contents)
      || hasRunnablePerform(in: mode)
    {
      return nil
    }
    let sleeps = shared.inboxLock.withLock {
      shared.inbox.prepareToSleep(on: .epoll, ignoringJobs: !mayRunJobs)
    }
    return sleeps ? .some(poller.timerDeadline) : nil
  }

  /// After a pass that found its mode empty (it returned before waiting): takes the wake-up
  /// eventfd's edge out of the epoll set, which would otherwise keep the host's descriptor
  /// readable. Readiness events are left alone (they are level-triggered: the next pass in a mode
  /// that holds them handles them).
  func consumeWakeEdge() {
    poller.wait(block: false)
  }
}
