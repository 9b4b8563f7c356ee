/// Running the loop (the pass itself is `LoopCore`'s, in `LoopPass.swift`).
extension RunLoopThread {
  /// Runs the loop in `mode` until it is stopped, its time limit passes, it has nothing to
  /// watch, or (when asked) one input source fired. Loop thread only; runs may nest (a handler may
  /// run the loop again, usually in another mode; the outer run resumes afterwards).
  ///
  /// A run nested inside one of the loop's own executor jobs (an actor method on this loop, a
  /// task that prefers it) runs the mode's sources, timers, observers and performed blocks but no
  /// jobs: a second job starting while one is on the stack would break the loop's serial-executor
  /// contract. The jobs run once the outer job returns. From async code, prefer
  /// `runModal(mode:until:returnAfterSourceHandled:)`, which suspends the caller instead of
  /// blocking its executor. A run nested in a source handler, timer or observer callout or a
  /// performed block runs jobs as usual.
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
    preconditionOnLoopThread("run(mode:until:returnAfterSourceHandled:)")
    precondition(mode != .common, "AsyncRunLoop: .common is a set of modes; run one of its modes instead")
    return core.run(
      mode: mode, deadline: deadline.nanoseconds, returnAfterSourceHandled: returnAfterSourceHandled,
      keepsAlive: false)
  }

  /// Runs the loop for at most `duration`. Loop thread only. See `run(mode:until:returnAfterSourceHandled:)`.
  @discardableResult
  public func run(
    mode: RunLoopMode = .default, for duration: Duration, returnAfterSourceHandled: Bool = false
  ) -> RunLoopRunResult {
    run(mode: mode, until: clockNow.advanced(by: duration), returnAfterSourceHandled: returnAfterSourceHandled)
  }

  /// Has the loop run `mode` (a modal run) while the calling task is suspended, and returns why
  /// that run ended. Any task, on any executor — including an actor on this loop or `@MainActor`
  /// code on the main loop, whose executor is not blocked: the run happens as a block performed on
  /// the loop (in whatever mode the loop runs then), nested in that loop's current pass, so the
  /// loop keeps running executor jobs during it, the caller's actor's other work included.
  ///
  /// `@MainActor` jobs are not the main loop's executor jobs but main-queue blocks, which the main
  /// loop serves only in its common modes (as CF serves the main queue): during a modal run from
  /// `@MainActor` code in a mode outside the common set, other main-actor work waits until the run
  /// ends. Add the mode to the common modes (`addModeToCommonModes`) to keep it served.
  ///
  /// Modal runs are runs of the loop's one thread, so they nest, and an outer run cannot return
  /// before the runs nested in it:
  /// - A `runModal` requested while another is running (from another task) starts inside it. The
  ///   outer one's end (its cancellation, time limit or `stop()`) takes effect when the inner one
  ///   has returned; the inner one is not cut short.
  /// - A `runModal` that starts while the loop is inside one of its own executor jobs (an actor
  ///   method that runs the loop nested with `run(mode:until:)`) is nested in that job: like any
  ///   run there it runs no jobs until the job returns.
  ///
  /// Cancelling the task ends the run (it returns `.stopped`); cancelled before the run started,
  /// it returns `.stopped` at once and the run never starts. For the main loop, the main thread
  /// must be running it (`runMainLoop()`). On a `RunLoopThread.current` loop shut down while its
  /// thread is out of a run (or when it leaves the run it is in), a run that has not started
  /// throws `RunLoopError.shutDown` at once instead of waiting for the thread to exit.
  /// - Parameters: as `run(mode:until:returnAfterSourceHandled:)`.
  /// - Returns: Why the run ended.
  /// - Throws: `RunLoopError.shutDown` when the loop has shut down and refused the run, or gave it
  ///   up before it started (above).
  @discardableResult
  public func runModal(
    mode: RunLoopMode, until deadline: LoopClock.Instant = .distantFuture, returnAfterSourceHandled: Bool = false
  ) async throws(RunLoopError) -> RunLoopRunResult {
    precondition(mode != .common, "AsyncRunLoop: .common is a set of modes; run one of its modes instead")
    let request = ModalRunRequest()
    let result: Result<RunLoopRunResult, RunLoopError> = await withTaskCancellationHandler {
      await withCheckedContinuation { continuation in
        guard request.suspend(continuation) else { return }  // cancelled already: .stopped
        requestModalRun(request) { [self] in
          core.run(
            mode: mode, deadline: deadline.nanoseconds, returnAfterSourceHandled: returnAfterSourceHandled,
            keepsAlive: false, shouldEnd: { request.isEndRequested })
        }
      }
    } onCancel: {
      // Running: wake the loop so the run sees the request. Otherwise it will not start: its
      // hand-off (if any) is no longer needed.
      if request.cancel() { wakeUp() } else { shared.unregisterHandOff(request) }
    }
    return try result.get()
  }

  /// Performs `run` for `request` in whatever mode the loop runs. A current loop shut down while
  /// its thread is out of a run (now, or when it leaves its run) releases the caller with
  /// `RunLoopError.shutDown` instead of keeping it until the thread exits (`LoopLifecycle`).
  private func requestModalRun(_ request: ModalRunRequest, _ run: @escaping @Sendable () -> RunLoopRunResult) {
    let shutDown = RunLoopError.shutDown(loop: name)
    let handsOff = shared.divertsJobsAtShutdown
    if handsOff, !shared.registerHandOff(request, { request.abandon(shutDown) }) {
      return request.abandon(shutDown)  // its jobs left already: it will not run the loop for us
    }
    let block = PerformRequest(modes: [], anyMode: true) { [shared] in
      if handsOff { shared.unregisterHandOff(request) }
      guard request.start() else { return }  // the caller was resumed (cancelled, or abandoned)
      request.finish(.success(run()))
    }
    guard let wake = shared.arrive({ shared.inbox.perform(block) }) else {
      if handsOff { shared.unregisterHandOff(request) }
      return request.finish(.failure(shutDown))
    }
    perform(wake)
  }

  /// `runModal(mode:until:returnAfterSourceHandled:)` for at most `duration`.
  @discardableResult
  public func runModal(
    mode: RunLoopMode, for duration: Duration, returnAfterSourceHandled: Bool = false
  ) async throws(RunLoopError) -> RunLoopRunResult {
    try await runModal(
      mode: mode, until: clockNow.advanced(by: duration), returnAfterSourceHandled: returnAfterSourceHandled)
  }
}
