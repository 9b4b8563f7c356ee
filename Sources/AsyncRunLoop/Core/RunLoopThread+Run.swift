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
    run(mode: mode, until: .now.advanced(by: duration), returnAfterSourceHandled: returnAfterSourceHandled)
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
  /// Cancelling the task ends the run (it returns `.stopped`). For the main loop, the main thread
  /// must be running it (`runMainLoop()`).
  /// - Parameters: as `run(mode:until:returnAfterSourceHandled:)`.
  /// - Returns: Why the run ended.
  /// - Throws: `RunLoopError.shutDown` when the loop has shut down and refused the run.
  @discardableResult
  public func runModal(
    mode: RunLoopMode, until deadline: LoopClock.Instant = .distantFuture, returnAfterSourceHandled: Bool = false
  ) async throws(RunLoopError) -> RunLoopRunResult {
    precondition(mode != .common, "AsyncRunLoop: .common is a set of modes; run one of its modes instead")
    let ending = ModalRunEnding()
    let result: Result<RunLoopRunResult, RunLoopError> = await withTaskCancellationHandler {
      await withCheckedContinuation {
        (continuation: CheckedContinuation<Result<RunLoopRunResult, RunLoopError>, Never>) in
        let request = PerformRequest(modes: [], anyMode: true) { [self] in
          let result = core.run(
            mode: mode, deadline: deadline.nanoseconds, returnAfterSourceHandled: returnAfterSourceHandled,
            keepsAlive: false, shouldEnd: { ending.isRequested })
          continuation.resume(returning: .success(result))
        }
        guard let wake = shared.inboxLock.withLock({ shared.inbox.perform(request) }) else {
          continuation.resume(returning: .failure(.shutDown(loop: name)))
          return
        }
        perform(wake)
      }
    } onCancel: {
      ending.request()
      wakeUp()
    }
    return try result.get()
  }

  /// `runModal(mode:until:returnAfterSourceHandled:)` for at most `duration`.
  @discardableResult
  public func runModal(
    mode: RunLoopMode, for duration: Duration, returnAfterSourceHandled: Bool = false
  ) async throws(RunLoopError) -> RunLoopRunResult {
    try await runModal(
      mode: mode, until: .now.advanced(by: duration), returnAfterSourceHandled: returnAfterSourceHandled)
  }
}

/// The cancellation flag of one `runModal` (set by the task's cancellation handler, read by the
/// loop between passes).
final class ModalRunEnding: Sendable {
  private let requested = LockedValue(false)
  var isRequested: Bool { requested.withLock { $0 } }
  func request() { requested.withLock { $0 = true } }
}
