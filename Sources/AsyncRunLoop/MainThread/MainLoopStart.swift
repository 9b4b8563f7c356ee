/// Waiting for the main loop to start: threads and tasks started during setup, before the main
/// thread reaches `runMainLoop()` (or before an `async` main on `AsyncRunLoopExecutorFactory`
/// reaches its first `await`).
extension RunLoopThread {
  /// Blocks the calling thread until the main thread runs the main loop (it has served a block
  /// for this caller). Any thread; on the main thread it returns at once while the main loop runs
  /// and throws otherwise (waiting there would never end). For plain threads; from async code
  /// prefer `await waitUntilMainLoopRuns()`.
  /// - Throws: `RunLoopError.wouldDeadlock` when the main loop cannot start or resume serving: it
  ///   is shut down, `dispatchMain()` gave the main queue away, or it ran and has stopped.
  public static func waitUntilMainLoopRuns() throws(RunLoopError) {
    if isMainThread {
      guard isMainLoopRunning else {
        throw .wouldDeadlock("waitUntilMainLoopRuns() on the main thread, which is not running the main loop")
      }
      return
    }
    do {
      try runOnMainAndWait {}
    } catch let error as RunLoopError {
      throw error
    } catch {
      preconditionFailure("AsyncRunLoop: an empty main-thread block threw \(error)")
    }
  }

  /// Suspends the calling task until the main thread runs the main loop (a main-actor job queued
  /// now has run: the main loop serves the main queue). Any task; it does not block a thread.
  /// - Throws: `RunLoopError.wouldDeadlock` when the main loop cannot start or resume serving (as
  ///   for the blocking form), checked when called.
  public static func waitUntilMainLoopRuns() async throws(RunLoopError) {
    if let refusal = MainLoopControl.waitRefusal {
      throw .wouldDeadlock("waitUntilMainLoopRuns() would wait forever: \(refusal)")
    }
    if isMainThread && isMainLoopRunning { return }
    await MainActor.run {}
  }
}
