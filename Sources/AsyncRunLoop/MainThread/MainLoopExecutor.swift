import CAsyncRunLoop
import Glibc
import Synchronization
@_spi(ExperimentalCustomExecutors) import _Concurrency

/// The main actor's executor when a program installs `AsyncRunLoopExecutorFactory`: the main loop
/// (`RunLoopThread.main`) on the process's main thread.
///
/// Main-actor jobs are queued on libdispatch's main queue — the same FIFO as `DispatchQueue.main`
/// blocks and `runOnMain` bodies, so calls made from one thread across the three run in call
/// order — and the main loop drains that queue in its common modes, interleaved with its sources,
/// timers and performed blocks, on the main thread. Enqueuing a job allocates nothing of ours (the
/// job itself is handed to the main queue, as the platform's main executor does).
///
/// Isolation: code on the main thread is isolated to the main actor (everything that runs there is
/// serialized by the main loop), and no other thread is.
@_spi(ExperimentalCustomExecutors)
public final class MainLoopExecutor: MainExecutor, @unchecked Sendable {  // Safety: proof below
  // Safety: `platform` is immutable; the platform's main executor is thread-safe. The run state
  // lives in `runs`, a `LockedValue`.
  private let platform: any MainExecutor = PlatformExecutorFactory.mainExecutor
  private let runs = LockedValue(MainExecutorRuns())

  /// The one instance (the factory's main executor).
  public static let shared = MainLoopExecutor()

  private init() {}

  /// True while the runtime's `run()` serves the main loop: an `async` main with the factory.
  static var isServingAsyncMain: Bool { shared.runs.withLock { $0.isServingForever } }

  /// Set when the runtime took this executor from `AsyncRunLoopExecutorFactory` (the program
  /// declared the factory). Relaxed: a once-only flag set at startup, before any task runs.
  private static let installed = Atomic<Bool>(false)

  /// True when the program runs on `AsyncRunLoopExecutorFactory`. Any thread.
  static var isInstalled: Bool { installed.load(ordering: .relaxed) }

  static func markInstalled() { installed.store(true, ordering: .relaxed) }

  /// Queues a main-actor job on the main queue. Any thread; it runs on the main thread when the
  /// main loop next serves the main queue (it always does while an `async` main runs).
  public func enqueue(_ job: consuming ExecutorJob) {
    platform.enqueue(job)
  }

  public var isMainExecutor: Bool { true }

  /// Traps unless the caller runs on the process's main thread. Any thread.
  public func checkIsolated() {
    guard RunLoopThread.isMainThread else {
      preconditionFailure(
        "AsyncRunLoop: expected to be on the main actor (the main thread, \(getpid())), but running on thread "
          + "\(carl_gettid())")
    }
  }

  /// True on the process's main thread, false elsewhere. Any thread.
  public func isIsolatingCurrentContext() -> Bool? {
    RunLoopThread.isMainThread
  }

  /// Serves the main loop on the main thread. Main thread only.
  ///
  /// The first call is the runtime's, for an `async` main: it runs the main loop in the default
  /// mode for the life of the process and does not return (when it returned the runtime would end
  /// the process with `_exit(0)`): the process ends when `main` returns, as any Swift program's
  /// does. Should the main loop be shut down (`RunLoopThread.main.shutdown()`), it is drained as
  /// `shutdown()` promises and the process exits with status 0, after a line on stderr.
  ///
  /// A later call (from main-thread code: a nested run) runs the main loop in the default mode
  /// until `stop()`. Like every nested run started from a main-actor job, it does not start other
  /// main-actor jobs while the caller's is on the stack; to let them run, `await runMainLoop()` or
  /// `runModal` instead.
  public func run() throws {
    try runUntil { false }
  }

  /// Like `run()`, for a nested call: returns once `condition` holds (checked after each pass that
  /// handled something, and at least every 10 ms) or `stop()` was called. Main thread only.
  public func runUntil(_ condition: () -> Bool) throws {
    precondition(
      RunLoopThread.isMainThread,
      "AsyncRunLoop: MainLoopExecutor.run() must be called on the main thread, not thread \(carl_gettid())")
    let loop = RunLoopThread.main
    switch runs.withLock({ $0.begin() }) {
    case .serveForever:
      serveForever(loop)
    case .nested(let ticket):
      defer { runs.withLock { $0.end(ticket) } }
      while !condition() && !runs.withLock({ $0.isStopped(ticket) }) {
        if loop.isShutDown { return }
        _ = loop.run(mode: .default, for: .milliseconds(10), returnAfterSourceHandled: true)
      }
    }
  }

  /// Ends the innermost nested `run()` / `runUntil` of this executor; with none active, it is
  /// `stopMainLoop()` (an `await runMainLoop()` in the `async` main returns). Never ends the
  /// runtime's own `run()` and never traps. Any thread.
  public func stop() {
    switch runs.withLock({ $0.stop() }) {
    case .stoppedNestedRun: RunLoopThread.main.stop()
    case .noNestedRun: stopMainLoop()
    }
  }

  private func serveForever(_ loop: RunLoopThread) -> Never {
    while true {
      _ = loop.run(mode: .default)
      if loop.isShutDown { break }
    }
    MainQueueService.drainAcceptedBlocks()  // as `runMainLoop()` does after a shutdown
    loop.core.drainForShutdown()
    let note = "AsyncRunLoop: RunLoopThread.main was shut down in an async main; the process exits (status 0)\n"
    _ = note.withCString { write(2, $0, strlen($0)) }
    exit(0)
  }
}

/// The runs of `MainLoopExecutor`: the runtime's endless one, then nested ones, each stopped by
/// `stop()`. A pure state machine held under the executor's lock.
struct MainExecutorRuns {
  /// The runtime's `run()` is active (it never ends).
  private(set) var isServingForever = false
  /// Nested runs in progress, innermost last, by ticket; and the ones `stop()` ended.
  private var nested: [UInt64] = []
  private var stopped: Set<UInt64> = []
  private var nextTicket: UInt64 = 0

  enum BeginAction: Equatable {
    /// The first run: serve the main loop for the life of the process.
    case serveForever
    /// A nested run, ended by `stop()` with this ticket.
    case nested(UInt64)
  }

  mutating func begin() -> BeginAction {
    guard isServingForever else {
      isServingForever = true  // the runtime's call for an async main (or the first call at all)
      return .serveForever
    }
    nextTicket += 1
    nested.append(nextTicket)  // innermost from now on
    return .nested(nextTicket)
  }

  mutating func end(_ ticket: UInt64) {
    nested.removeAll { $0 == ticket }
    stopped.remove(ticket)
  }

  func isStopped(_ ticket: UInt64) -> Bool { stopped.contains(ticket) }

  enum StopAction: Equatable {
    /// The innermost nested run is marked stopped: end its current pass.
    case stoppedNestedRun
    /// No nested run is active: stop the main loop the `stopMainLoop()` way.
    case noNestedRun
  }

  mutating func stop() -> StopAction {
    guard let innermost = nested.last(where: { !stopped.contains($0) }) else { return .noNestedRun }
    stopped.insert(innermost)  // ends at its next check
    return .stoppedNestedRun
  }
}
