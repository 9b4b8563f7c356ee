import CAsyncRunLoop

/// Waits until `stopMainLoop()` is called, in an `async` main that runs on the main loop
/// (`AsyncRunLoopExecutorFactory`): the `async` counterpart of `runMainLoop()`. Main actor.
///
/// There the main loop already runs — the factory's executor serves it on the main thread for the
/// whole program — so this only suspends the caller; main-actor work, `DispatchQueue.main`
/// blocks, `runOnMain` bodies and `RunLoopThread.main`'s sources and timers keep running on the
/// main thread meanwhile. It returns after `stopMainLoop()` (from any thread), once every
/// main-queue block accepted before the stop has run; a stop requested before the call is
/// remembered and makes it return at once (after those blocks). It ignores task cancellation.
/// Returning from `main` then ends the program, as in any Swift program.
///
/// ```swift
/// @main struct App {
///   typealias DefaultExecutorFactory = AsyncRunLoopExecutorFactory
///   static func main() async {
///     let app = App()        // set up sources, timers, delegates...
///     await runMainLoop()    // returns after stopMainLoop()
///   }
/// }
/// ```
///
/// Traps with a message naming the fix when the main loop is not the main executor (an `async`
/// main without the factory: nothing would serve the main loop), or when another
/// `runMainLoop()` is active.
@MainActor
public func runMainLoop() async {
  precondition(
    MainLoopExecutor.isInstalled,
    """
    AsyncRunLoop: await runMainLoop() needs the main loop as the program's main executor: declare \
    `typealias DefaultExecutorFactory = AsyncRunLoopExecutorFactory` in the @main type (with \
    `@_spi(ExperimentalCustomExecutors) import AsyncRunLoop`) and build the executable with \
    `-Xfrontend -disable-availability-checking` (see the AsyncMain article). In a synchronous \
    main, call runMainLoop() without await.
    """)
  switch MainLoopControl.beginAsyncServing() {
  case .serve:
    // The resumption is a main-actor job queued by stopMainLoop(), behind every block queued
    // before the stop.
    await withCheckedContinuation { AsyncMainLoopRun.wait($0) }
  case .returnAtOnce:
    await Task.yield()  // a main-queue job: queued behind every block accepted before the stop
  case .alreadyServing:
    preconditionFailure("AsyncRunLoop: runMainLoop() is already running; await it in one place only")
  }
}

/// The continuation of the one `await runMainLoop()` in progress, and the stop that may reach
/// it first. Any thread (under its lock).
enum AsyncMainLoopRun {
  private enum Slot {
    /// No wait, and no stop delivered yet.
    case empty
    /// `await runMainLoop()` waits here.
    case waiting(CheckedContinuation<Void, Never>)
    /// The stop came before the caller stored its continuation.
    case ended
  }

  private static let slot = LockedValue(Slot.empty)

  /// The caller: waits for `end()` (at once if it already came).
  static func wait(_ continuation: CheckedContinuation<Void, Never>) {
    let endedAlready: Bool = slot.withLock { slot in
      switch slot {
      case .empty:
        slot = .waiting(continuation)  // end() resumes it
        return false
      case .ended:
        slot = .empty  // consumed: the next run starts clean
        return true
      case .waiting:
        preconditionFailure("AsyncRunLoop: two await runMainLoop() calls at once")
      }
    }
    if endedAlready { continuation.resume() }
  }

  /// `stopMainLoop()`, once per started wait: resumes the caller (or tells it to return).
  static func end() {
    let waiting: CheckedContinuation<Void, Never>? = slot.withLock { slot in
      switch slot {
      case .empty:
        slot = .ended  // the caller has not stored its continuation yet
        return nil
      case .waiting(let continuation):
        slot = .empty
        return continuation
      case .ended:
        preconditionFailure("AsyncRunLoop: an await runMainLoop() was ended twice")
      }
    }
    waiting?.resume()
  }
}
