import CAsyncRunLoop
import Dispatch

// The FORCE_MAIN_THREAD / performSelectorOnMainThread idiom, cooperating with @MainActor.
//
// Every form runs its body inline when the caller is already on the main thread (no hop, so no
// reordering against the caller's own code), and otherwise hands it to the main dispatch queue.
//
// Why the main dispatch queue and not `RunLoopThread.main.perform`: on Linux, Swift's main
// executor *is* the main dispatch queue (the platform's, and `MainLoopExecutor` queues there too), so `@MainActor` jobs (`Task { @MainActor in … }`,
// `await MainActor.run`, calls into main-actor-isolated code) are queued there too. Going through
// the same FIFO queue keeps one thread's `runOnMain` calls, `DispatchQueue.main.async` blocks and
// MainActor jobs in the order that thread made them. The main loop drains that queue in its common
// modes (see `runMainLoop()`); blocks handed to `RunLoopThread.main.perform` are a separate queue
// and are not ordered against these.

/// Runs `body` on the main thread, the FORCE_MAIN_THREAD way: inline, before this returns, when
/// called on the main thread; otherwise queued for the main thread and this returns at once.
/// Any thread; synchronous code only.
///
/// The same as `runOnMainWithoutWaiting(_:)`. It is unavailable in async functions, where
/// `runOnMain` is the awaiting form that returns the body's value: so
/// `let size = await runOnMain { window.size }` always gets the size there — to fire and forget
/// from async code, say so with `runOnMainWithoutWaiting { … }`. Top-level code of `main.swift` is
/// the exception: Swift 6.3 resolves `await runOnMain { … }` there to this form (`noasync` does
/// not apply to it) and only warns; the body runs and its value is dropped. Await it from an
/// `async` function there.
/// - Parameter body: Main-actor isolated; runs on the main thread, where
///   `MainActor.assumeIsolated` holds.
@available(
  *, noasync,
  message:
    "in async code `await runOnMain { … }` returns the body's value; to fire and forget, use runOnMainWithoutWaiting"
)
public func runOnMain(_ body: @escaping @MainActor () -> Void) {
  runOnMainWithoutWaiting(body)
}

/// Runs `body` on the main thread without waiting for it, the FORCE_MAIN_THREAD way: inline,
/// before this returns, when called on the main thread; otherwise queued for the main thread and
/// this returns at once. Any thread, sync or async code.
///
/// Calls made from one thread run in the order they were made, also relative to that thread's
/// `DispatchQueue.main.async` blocks and `@MainActor` jobs. A queued body runs when the main
/// thread runs the main loop in a common mode (`runMainLoop()`, or an `async` main on
/// `AsyncRunLoopExecutorFactory`); if it never does, it never runs. On the main thread the body
/// runs now, ahead of blocks the main thread queued earlier — the macro's semantics.
/// - Parameter body: Main-actor isolated; runs on the main thread, where
///   `MainActor.assumeIsolated` holds.
public func runOnMainWithoutWaiting(_ body: @escaping @MainActor () -> Void) {
  if RunLoopThread.isMainThread {
    MainActor.assumeIsolated(body)
    return
  }
  MainQueueService.diagnoseLostMainQueue("runOnMain")
  DispatchQueue.main.async { MainActor.assumeIsolated(body) }
}

/// Runs `body` on the main thread and returns its value, or rethrows its error. Inline (without
/// suspending) when the caller is already on the main thread; otherwise the task hops to the main
/// actor — ordered after the calling thread's earlier `runOnMain` calls and main-queue work — and
/// comes back to the caller's executor. Any task.
///
/// Like `await MainActor.run`, it waits for the main thread to drain the main queue; it does not
/// check whether the main loop is running.
/// - Parameter body: Main-actor isolated; runs on the main thread.
/// - Returns: What `body` returns.
/// - Throws: What `body` throws.
public nonisolated(nonsending) func runOnMain<T: Sendable, E: Error>(
  _ body: @MainActor () throws(E) -> T
) async throws(E) -> T {
  if RunLoopThread.isMainThread { return try runInlineOnMain(body) }
  MainQueueService.diagnoseLostMainQueue("await runOnMain")
  return try await runOnMainActor(body)
}

/// Runs `body` on the main thread and blocks the calling thread until it has run, returning its
/// value or rethrowing its error (`performSelectorOnMainThread:…waitUntilDone:YES`). On the main
/// thread it runs inline, so it never deadlocks on itself. For plain threads (loop threads, your
/// own pthreads); from async code prefer `await runOnMain`, which does not block a thread.
///
/// Ordered like `runOnMain`. Before the main loop first runs (threads started during setup), it
/// waits for the main thread to start it (`runMainLoop()`, or an `async` main on
/// `AsyncRunLoopExecutorFactory`). It throws instead of hanging when the main loop can no longer
/// serve it: the main loop is shut down; the main queue was given away (`dispatchMain()` was
/// called, by an `async` main without the factory or by the program); or the main loop ran and
/// has stopped (after `runMainLoop()` returned, the main thread is doing something else). If the
/// main loop stops running before the block started, the block never runs and the caller gets
/// the error. (It cannot see other deadlocks, e.g. the main thread blocked waiting for this
/// thread.)
/// - Parameter body: Main-actor isolated; runs on the main thread.
/// - Returns: What `body` returns.
/// - Throws: `RunLoopError.wouldDeadlock` when the main loop can no longer run the block (see
///   above); otherwise what `body` throws.
public func runOnMainAndWait<T: Sendable, E: Error>(_ body: @escaping @MainActor () throws(E) -> T) throws -> T {
  if RunLoopThread.isMainThread { return try runInlineOnMain(body) }
  MainQueueService.diagnoseLostMainQueue("runOnMainAndWait")
  let waiter = MainCallWaiter<T>()
  guard let ticket = MainLoopControl.register(waiter) else {
    throw RunLoopError.wouldDeadlock(
      """
      runOnMainAndWait on thread \(carl_gettid()) would wait forever: the main loop is not running and \
      cannot start (it ran and stopped, it is shut down, or dispatchMain() gave the main queue away). \
      Use runOnMain (fire and forget) or await runOnMain, or keep the main loop running.
      """)
  }
  defer { MainLoopControl.unregister(ticket) }
  DispatchQueue.main.async {
    guard waiter.begin() else { return }  // abandoned: the caller was told it did not run
    waiter.finish(Result { () throws(E) -> T in try runInlineOnMain(body) }.mapError { $0 as any Error })
  }
  guard let result = waiter.wait() else {
    throw RunLoopError.wouldDeadlock(
      "runOnMainAndWait: the main loop stopped running before the block ran; it will not run")
  }
  return try result.get()
}

/// Main thread: runs a main-actor closure synchronously. `MainActor.assumeIsolated` checks the
/// main executor; on Linux that is "on the main dispatch queue", which holds on the main thread
/// for as long as the main queue is bound to it (that is, unless `dispatchMain()` was called).
func runInlineOnMain<T: Sendable, E: Error>(_ body: @MainActor () throws(E) -> T) throws(E) -> T {
  let result: Result<T, E> = MainActor.assumeIsolated { Result { () throws(E) -> T in try body() } }
  return try result.get()
}

/// Hops to the main actor (a job on the main dispatch queue) and runs `body` there.
@MainActor
private func runOnMainActor<T: Sendable, E: Error>(_ body: @MainActor () throws(E) -> T) async throws(E) -> T {
  try body()
}

/// One blocked `runOnMainAndWait` call (or `performAndWait` on the main loop or on a
/// `RunLoopThread.current` loop): a once-only meeting of the caller, its block on the loop, and
/// the loop stopping (the main loop) or shutting down with its thread out of a run (a current loop). A state machine under a lock; the gate opens after it.
final class MainCallWaiter<T: Sendable>: AbandonableWait, @unchecked Sendable {  // Safety: proof below
  // Safety: `state` is only touched with `lock` held; `gate` is thread-safe.
  private let lock = PthreadLock.make()
  private var state = State.pending
  /// Opens once the caller may go on (the block finished, or was abandoned).
  let gate = BlockingGate()

  private enum State {
    /// Queued; the main thread has not started it.
    case pending
    /// The main thread is running the block.
    case running
    /// The block ran; its result waits for the caller.
    case finished(Result<T, any Error>)
    /// The main loop stopped running first: the block will not run.
    case abandoned
  }

  /// Main thread, before running the block: false when it was abandoned (skip the block).
  func begin() -> Bool {
    lock.withLock {
      switch state {
      case .pending:
        state = .running  // from now on the block runs to the end, whatever the loop does
        return true
      case .abandoned:
        return false  // the caller already got an error
      case .running, .finished:
        preconditionFailure("AsyncRunLoop: a waited-for block started twice")
      }
    }
  }

  /// Main thread, after running the block.
  func finish(_ result: Result<T, any Error>) {
    lock.withLock {
      switch state {
      case .running:
        state = .finished(result)  // the caller takes it
      case .pending, .finished, .abandoned:
        preconditionFailure("AsyncRunLoop: a waited-for block finished without starting")
      }
    }
    gate.open()
  }

  /// Any thread: the main loop stopped running. Releases the caller unless the block has started.
  func abandon() {
    let released: Bool = lock.withLock {
      switch state {
      case .pending:
        state = .abandoned  // the block will be skipped when the queue reaches it
        return true
      case .running, .finished, .abandoned:
        return false  // it runs (or ran) to the end: the caller gets its result
      }
    }
    if released { gate.open() }
  }

  /// Caller: blocks until the block ran (its result) or was abandoned (nil).
  func wait() -> Result<T, any Error>? {
    gate.wait()
    return lock.withLock {
      switch state {
      case .finished(let result): return result
      case .abandoned: return nil
      case .pending, .running: preconditionFailure("AsyncRunLoop: a waited-for block's caller woke early")
      }
    }
  }
}
