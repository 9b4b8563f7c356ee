import Glibc
import Synchronization

// Test-side threading primitives that do not lean on the package's internals (the loop core is
// being rewritten): a pthread-mutex box, a gate with a timed wait, raw threads, and a start
// barrier that releases racing threads together.

/// A value guarded by a pthread mutex (ThreadSanitizer understands it, unlike `Mutex`).
final class Guarded<Value>: @unchecked Sendable {  // Safety: proof below
  // Safety: `value` is only read or written with `mutex` held (in `withLock`).
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

  /// A copy of the value.
  var snapshot: Value { withLock { $0 } }
}

/// A one-way gate: `open()` releases every waiter, now and later. Waits can time out.
final class TestGate: @unchecked Sendable {  // Safety: proof below
  // Safety: `isOpen` is only touched with `mutex` held; `condition` only through pthread_cond_*.
  private let mutex: UnsafeMutablePointer<pthread_mutex_t>
  private let condition: UnsafeMutablePointer<pthread_cond_t>
  private var isOpen = false

  init() {
    mutex = .allocate(capacity: 1)
    pthread_mutex_init(mutex, nil)
    condition = .allocate(capacity: 1)
    var attributes = pthread_condattr_t()
    pthread_condattr_init(&attributes)
    pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
    pthread_cond_init(condition, &attributes)
    pthread_condattr_destroy(&attributes)
  }

  deinit {
    pthread_cond_destroy(condition)
    condition.deallocate()
    pthread_mutex_destroy(mutex)
    mutex.deallocate()
  }

  /// Opens the gate. Any thread; idempotent.
  func open() {
    pthread_mutex_lock(mutex)
    isOpen = true
    pthread_mutex_unlock(mutex)
    pthread_cond_broadcast(condition)
  }

  /// Whether the gate is open.
  var opened: Bool {
    pthread_mutex_lock(mutex)
    defer { pthread_mutex_unlock(mutex) }
    return isOpen
  }

  /// Waits until the gate opens or `timeout` passes. Returns whether it opened.
  @discardableResult
  func wait(timeout: Duration) -> Bool {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    let total = Int64(now.tv_nsec) + timeout.components.attoseconds / 1_000_000_000
    var deadline = timespec()
    deadline.tv_sec = now.tv_sec + Int(timeout.components.seconds) + Int(total / 1_000_000_000)
    deadline.tv_nsec = Int(total % 1_000_000_000)
    pthread_mutex_lock(mutex)
    defer { pthread_mutex_unlock(mutex) }
    while !isOpen {
      if pthread_cond_timedwait(condition, mutex, &deadline) == ETIMEDOUT { return isOpen }
    }
    return true
  }
}

/// What a raw thread runs.
private final class ThreadBody {
  let body: @Sendable () -> Void
  init(_ body: @escaping @Sendable () -> Void) { self.body = body }
}

/// Starts a raw pthread running `body`. `detached` threads are never joined (a hung one costs
/// nothing but itself); otherwise join it with `joinThread`.
@discardableResult
func startThread(detached: Bool = false, _ body: @escaping @Sendable () -> Void) -> pthread_t {
  let context = Unmanaged.passRetained(ThreadBody(body)).toOpaque()
  var thread = pthread_t()
  let rc = pthread_create(
    &thread, nil,
    { raw in
      let start = Unmanaged<ThreadBody>.fromOpaque(raw!).takeRetainedValue()
      start.body()
      return nil
    }, context)
  precondition(rc == 0, "pthread_create failed: \(rc)")
  if detached { pthread_detach(thread) }
  return thread
}

/// Waits for a thread started with `startThread(detached: false)`.
func joinThread(_ thread: pthread_t) {
  pthread_join(thread, nil)
}

/// `race` from async code: waits for the threads off the cooperative pool. (Swift picks this
/// overload in async code. Joined on a pool thread, a 2-core machine's two pool threads were
/// both held by joins and other blocking tests at once, and every async test stalled past its
/// watchdog.)
func race(_ bodies: [@Sendable () -> Void]) async {
  await execOnNewThread { race(bodies) }
}

/// Runs every body on its own new thread, released together by a spin barrier (so that they
/// really race), and waits for all of them.
func race(_ bodies: [@Sendable () -> Void]) {
  let barrier = AtomicCounter()
  let count = bodies.count
  let threads = bodies.map { body in
    startThread {
      // Relaxed is enough: the barrier only lines the threads up in time; the bodies
      // synchronize through the code under test.
      barrier.value.add(1, ordering: .relaxed)
      while barrier.value.load(ordering: .relaxed) < count { sched_yield() }
      body()
    }
  }
  for thread in threads { joinThread(thread) }
}

/// A shared atomic counter.
final class AtomicCounter: Sendable {
  let value = Atomic<Int>(0)
  init() {}
  /// Adds one; returns the new value.
  @discardableResult
  func increment() -> Int { value.add(1, ordering: .sequentiallyConsistent).newValue }
  var current: Int { value.load(ordering: .sequentiallyConsistent) }
}

/// Runs stress rounds: `rounds` of them, but stops early after `budget` (times `stressFactor`: a
/// bound on the test's length on a loaded machine, never asserted on). Returns how many ran.
///
/// Keep budgets short: these rounds keep both cores of the test machine busy, and every other
/// test's watchdog runs on the same two cores (a raw-thread watchdog is not delayed by a busy pool).
@discardableResult
func repeatRounds(_ rounds: Int, budget: Duration = .milliseconds(1500), _ round: (Int) throws -> Void) rethrows
  -> Int
{
  let deadline = ContinuousClock.now.advanced(by: budget * stressFactor)
  var done = 0
  while done < rounds {
    try round(done)
    done += 1
    if ContinuousClock.now >= deadline { break }
  }
  return done
}
