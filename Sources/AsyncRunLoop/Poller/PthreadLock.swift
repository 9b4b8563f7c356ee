import Glibc

/// A mutual-exclusion lock built on `pthread_mutex_t`.
///
/// We use pthreads rather than `Synchronization.Mutex` because ThreadSanitizer on Linux does not
/// understand the futex-based `Mutex` and reports false races; with a pthread mutex TSan stays
/// meaningful. Callable from any thread. Never call user code or resume a continuation while
/// holding it.
///
/// `@usableFromInline` (with `lock()`/`unlock()`) so that the async sequences' per-element paths
/// can be `@inlinable` and specialized for the client's element type.
///
/// The mutex lives in the object's own allocation (a `ManagedBuffer` element), so a lock costs one
/// heap allocation, not two: every timer and source has one.
@usableFromInline
final class PthreadLock: ManagedBuffer<Void, pthread_mutex_t> {
  // Not Sendable itself (ManagedBuffer never is); the unchecked-Sendable types that hold one
  // share it across threads safely: the mutex is only touched through pthread_mutex_* calls,
  // which are thread-safe, and its address (the element storage) is stable for the object's life.

  /// Creates an unlocked lock. (`ManagedBuffer` subclasses are created through a factory.)
  static func make() -> PthreadLock {
    let lock = unsafeDowncast(PthreadLock.create(minimumCapacity: 1) { _ in () }, to: PthreadLock.self)
    lock.withUnsafeMutablePointerToElements { mutex in
      var attributes = pthread_mutexattr_t()
      pthread_mutexattr_init(&attributes)
      #if DEBUG
        // Debug builds turn a re-entrant lock (a deadlock) into an assertion failure.
        pthread_mutexattr_settype(&attributes, Int32(PTHREAD_MUTEX_ERRORCHECK))
      #endif
      let rc = pthread_mutex_init(mutex, &attributes)
      precondition(rc == 0, "pthread_mutex_init failed: \(rc)")
      pthread_mutexattr_destroy(&attributes)
    }
    return lock
  }

  deinit {
    _ = withUnsafeMutablePointerToElements { pthread_mutex_destroy($0) }
  }

  @inline(__always) @usableFromInline
  func lock() {
    let rc = withUnsafeMutablePointerToElements { pthread_mutex_lock($0) }
    assert(rc == 0, "pthread_mutex_lock failed: \(rc)")
  }

  @inline(__always) @usableFromInline
  func unlock() {
    let rc = withUnsafeMutablePointerToElements { pthread_mutex_unlock($0) }
    assert(rc == 0, "pthread_mutex_unlock failed: \(rc)")
  }

  /// Runs `body` with the lock held.
  @inline(__always)
  func withLock<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
    lock()
    defer { unlock() }
    return try body()
  }

  /// Blocks on `condition` until signalled; the lock must be held by the caller.
  func wait(on condition: UnsafeMutablePointer<pthread_cond_t>) {
    let rc = withUnsafeMutablePointerToElements { pthread_cond_wait(condition, $0) }
    precondition(rc == 0, "pthread_cond_wait failed: \(rc)")
  }

  /// Blocks on `condition` until signalled or `deadline` (CLOCK_REALTIME) passes; the lock must
  /// be held by the caller. Returns false once the deadline passed.
  func wait(on condition: UnsafeMutablePointer<pthread_cond_t>, until deadline: timespec) -> Bool {
    var deadline = deadline
    let rc = withUnsafeMutablePointerToElements { pthread_cond_timedwait(condition, $0, &deadline) }
    precondition(rc == 0 || rc == ETIMEDOUT, "pthread_cond_timedwait failed: \(rc)")
    return rc == 0
  }
}

/// A value protected by a `PthreadLock`. Callable from any thread.
final class LockedValue<Value>: @unchecked Sendable {  // Safety: proof below
  // Safety: `value` is only read or written inside `lock.withLock`.
  private let lock = PthreadLock.make()
  private var value: Value

  init(_ value: Value) { self.value = value }

  /// Runs `body` with exclusive access to the value.
  @inline(__always)
  func withLock<T, E: Error>(_ body: (inout Value) throws(E) -> T) throws(E) -> T {
    lock.lock()
    defer { lock.unlock() }
    return try body(&value)
  }
}

/// A one-shot gate that threads can block on until it is opened. Callable from any thread.
///
/// Used by the blocking "wait until done" calls. Opening it twice is harmless.
@usableFromInline
final class BlockingGate: @unchecked Sendable {  // Safety: proof below
  // Safety: `isOpen` is only touched with `lock` held; `condition` only through pthread_cond_*.
  private let lock = PthreadLock.make()
  private let condition: UnsafeMutablePointer<pthread_cond_t>
  private var isOpen = false

  init() {
    condition = .allocate(capacity: 1)
    pthread_cond_init(condition, nil)
  }

  deinit {
    pthread_cond_destroy(condition)
    condition.deallocate()
  }

  /// Opens the gate and releases every waiter.
  func open() {
    lock.withLock { isOpen = true }
    pthread_cond_broadcast(condition)
  }

  /// Whether the gate has been opened. Any thread.
  var isOpened: Bool { lock.withLock { isOpen } }

  /// Blocks the calling thread until the gate is open.
  func wait() {
    lock.lock()
    while !isOpen { lock.wait(on: condition) }
    lock.unlock()
  }

  /// Blocks the calling thread until the gate is open or `nanoseconds` passed; true when open.
  func wait(nanoseconds: Int64) -> Bool {
    var deadline = timespec()
    clock_gettime(CLOCK_REALTIME, &deadline)
    let total = Int64(deadline.tv_nsec) + nanoseconds
    deadline.tv_sec += Int(total / 1_000_000_000)
    deadline.tv_nsec = Int(total % 1_000_000_000)
    lock.lock()
    while !isOpen && lock.wait(on: condition, until: deadline) {}
    let open = isOpen
    lock.unlock()
    return open
  }
}
