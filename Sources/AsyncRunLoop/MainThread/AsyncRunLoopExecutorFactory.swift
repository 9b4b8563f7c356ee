@_spi(ExperimentalCustomExecutors) import _Concurrency

/// The executor factory that puts an `async` main on the main loop: the program's main executor
/// is `MainLoopExecutor` (the main loop, `RunLoopThread.main`, on the process's main thread) and
/// its default executor stays the platform's global pool.
///
/// Opt in with one declaration in the executable (top level of `main.swift`, or inside the `@main`
/// type), and build the executable with `-Xfrontend -disable-availability-checking` — on Linux
/// with Swift 6.3.1 the compiler ignores the declaration without that flag (see the AsyncMain
/// article):
///
/// ```swift
/// @_spi(ExperimentalCustomExecutors) import _Concurrency
/// import AsyncRunLoop
///
/// @main struct App {
///   typealias DefaultExecutorFactory = AsyncRunLoopExecutorFactory
///   static func main() async {
///     // @MainActor code, DispatchQueue.main blocks, runOnMain bodies and RunLoopThread.main's
///     // sources and timers all run on the main thread, served by the main loop.
///     await runMainLoop()  // until stopMainLoop()
///   }
/// }
/// ```
///
/// Without it, an `async` main gives the main thread away at its first suspension (the runtime
/// calls `dispatchMain()`), and main-actor work runs on pool threads; `runOnMain` then prints a
/// one-time diagnostic naming this type.
@_spi(ExperimentalCustomExecutors)
public struct AsyncRunLoopExecutorFactory: ExecutorFactory {
  /// The main loop as the main actor's executor (the same instance every time). Any thread.
  public static var mainExecutor: any MainExecutor {
    MainLoopExecutor.markInstalled()  // the runtime asks once, as the program starts
    return MainLoopExecutor.shared
  }

  /// The platform's global executor, unchanged: tasks that are not isolated to the main actor (or
  /// to an actor on a loop) run on the global pool as in any program. Any thread.
  public static var defaultExecutor: any TaskExecutor { PlatformExecutorFactory.defaultExecutor }
}
