import CAsyncRunLoop
import Glibc
import Synchronization

/// How the main loop serves libdispatch's main queue (where `DispatchQueue.main` blocks,
/// `runOnMain` bodies and main-actor jobs wait), and how a program that lost the main queue is
/// told so.
enum MainQueueService {
  /// Main thread only: the depth of main-queue drains on the main thread's stack.
  /// Relaxed: read and written by the main thread only; atomic just to be `Sendable`.
  private static let drainDepth = Atomic<Int>(0)

  /// Set once the "main queue is not served on the main thread" diagnostic was printed.
  /// Relaxed: a once-only flag; a second racing printer would print a duplicate line, no more.
  private static let warnedLostMainQueue = Atomic<Bool>(false)

  /// Main thread, from the main-queue source: drains the main queue once — every block queued
  /// before this call, in queue order. Inside a block of an outer drain (a nested run started by
  /// a main-queue block or main-actor job) libdispatch runs nothing, so no main-actor job starts
  /// inside another; the wake-up is still consumed, so the nested run does not spin, and
  /// libdispatch signals again when the outer drain ends with work left.
  static func drain(_ descriptor: Int32) {
    // libdispatch writes the eventfd when the queue goes from empty to non-empty and after a
    // drain that left work behind, but never reads it: we reset it *before* draining, so a
    // block queued during the drain makes it readable again (checked on Linux, Swift 6.3.1).
    _ = SystemCall.drainCounter(descriptor)
    drainDepth.add(1, ordering: .relaxed)
    _dispatch_main_queue_callback_4CF(nil)
    drainDepth.subtract(1, ordering: .relaxed)
  }

  /// Main thread, as `runMainLoop()` returns: runs every block queued on the main queue before
  /// this call (so that nothing accepted before `stopMainLoop()` is left behind), unless the
  /// main queue is not the main thread's (after `dispatchMain()`) or a drain is on the stack.
  static func drainAcceptedBlocks() {
    let descriptor = _dispatch_get_main_queue_handle_4CF()
    guard descriptor >= 0, drainDepth.load(ordering: .relaxed) == 0 else { return }
    drain(descriptor)
  }

  /// True when the main queue is no longer served on the main thread: `dispatchMain()` was
  /// called — by the runtime, for an `async` main without `AsyncRunLoopExecutorFactory`, or by the
  /// program. Any thread.
  static var isMainQueueLost: Bool { _dispatch_get_main_queue_handle_4CF() < 0 }

  /// Any thread, off the main thread, before handing work to the main thread: prints a one-time
  /// diagnostic to stderr when that work would run on a pool thread instead (the main queue is
  /// lost), naming the fix. The work still runs (on a pool thread, as libdispatch serves it).
  static func diagnoseLostMainQueue(_ what: StaticString) {
    guard !warnedLostMainQueue.load(ordering: .relaxed), isMainQueueLost else { return }
    guard !warnedLostMainQueue.exchange(true, ordering: .relaxed) else { return }
    let message = """
      AsyncRunLoop: \(what) cannot reach the main thread: the main dispatch queue is served by pool \
      threads, because dispatchMain() was called — an `async` main does that unless the program \
      declares `typealias DefaultExecutorFactory = AsyncRunLoopExecutorFactory` (with \
      `@_spi(ExperimentalCustomExecutors) import AsyncRunLoop`) and is built with \
      `-Xfrontend -disable-availability-checking` (see the AsyncMain article). Bodies run off the \
      main thread until then. (Printed once.)

      """
    message.withCString { _ = write(2, $0, strlen($0)) }
  }
}
