#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// The `CFRunLoopExecutor`s made on one thread (with `init()`, and `startThread`'s on its own),
/// told when that thread exits: jobs queued on a thread that is gone would otherwise wait for ever
/// (its run loop never runs their drain block again).
///
/// Held in a pthread key whose destructor runs as the thread exits (the main thread's only if it
/// exits through `pthread_exit` and no other destructor parks it first, as `dispatchMain()`'s
/// does). An executor made on a thread after this destructor ran, from another destructor, is
/// not told. The list holds the executors weakly, so a thread does not keep an executor alive
/// that everyone else dropped.
final class ExecutorThreadExit: @unchecked Sendable {  // Safety: proof below
  // Safety: `executors` is only touched on the thread the list belongs to: `register` runs there
  // (in the executor's init), and so does the key's destructor, as that thread exits.
  private var executors: [WeakExecutor] = []

  private struct WeakExecutor {
    weak var executor: CFRunLoopExecutor?
  }

  private static let key: pthread_key_t = {
    var key = pthread_key_t()
    let rc = pthread_key_create(&key) { value in
      guard let value else { return }
      let list = Unmanaged<ExecutorThreadExit>.fromOpaque(value).takeRetainedValue()
      for entry in list.executors { entry.executor?.threadExited() }
    }
    precondition(rc == 0, "AsyncRunLoopFoundation: pthread_key_create failed: \(rc)")
    return key
  }()

  /// Tells `executor` when the calling thread exits. The calling thread only.
  static func register(_ executor: CFRunLoopExecutor) {
    let list: ExecutorThreadExit
    if let value = pthread_getspecific(key) {
      list = Unmanaged<ExecutorThreadExit>.fromOpaque(value).takeUnretainedValue()
    } else {
      list = ExecutorThreadExit()
      let rc = pthread_setspecific(key, Unmanaged.passRetained(list).toOpaque())
      precondition(rc == 0, "AsyncRunLoopFoundation: pthread_setspecific failed: \(rc)")
    }
    list.executors.removeAll { $0.executor == nil }
    list.executors.append(WeakExecutor(executor: executor))
  }
}
