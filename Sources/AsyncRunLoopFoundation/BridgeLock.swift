#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// A value guarded by a pthread mutex (the bridge's counterpart of the core's `LockedValue`,
/// which is internal to AsyncRunLoop). Hold it only for small pure state changes; do the side
/// effects after `withLock` returns. Any thread.
final class BridgeLock<Value>: @unchecked Sendable {  // Safety: proof below
  // Safety: `value` is only read or written with `mutex` held (inside `withLock`); the mutex is
  // allocated in init and destroyed in deinit, when no other thread can hold a reference.
  private let mutex: UnsafeMutablePointer<pthread_mutex_t>
  private var value: Value

  init(_ value: Value) {
    self.value = value
    mutex = .allocate(capacity: 1)
    pthread_mutex_init(mutex, nil)
  }

  deinit {
    pthread_mutex_destroy(mutex)
    mutex.deallocate()
  }

  /// Runs `body` with exclusive access to the value.
  func withLock<T>(_ body: (inout Value) throws -> T) rethrows -> T {
    pthread_mutex_lock(mutex)
    defer { pthread_mutex_unlock(mutex) }
    return try body(&value)
  }
}
