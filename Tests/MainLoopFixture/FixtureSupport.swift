import AsyncRunLoop
import CAsyncRunLoop
import CTestChildProcess
import Glibc

// Support for the main-loop fixture: a process whose main thread runs the main loop. The tests in
// MainLoopProcessTests launch it once per scenario; a scenario prints what it checked and exits 0,
// or prints "FAIL: …" to stderr and exits 1. A watchdog alarm kills a hung scenario.

/// Writes a line to stdout, unbuffered (the test reads it even if the process dies afterwards).
func say(_ line: String) {
  write(descriptor: 1, line + "\n")
}

/// Fails the scenario: prints the reason to stderr and exits 1.
func fail(_ message: String, file: StaticString = #fileID, line: UInt = #line) -> Never {
  write(descriptor: 2, "FAIL: \(message) (\(file):\(line))\n")
  exit(1)
}

/// Fails the scenario unless `condition` holds.
func check(_ condition: Bool, _ message: @autoclosure () -> String, file: StaticString = #fileID, line: UInt = #line) {
  if !condition { fail(message(), file: file, line: line) }
}

private func write(descriptor: Int32, _ text: String) {
  var bytes = Array(text.utf8)
  var offset = 0
  while offset < bytes.count {
    let written = bytes.withUnsafeMutableBytes { Glibc.write(descriptor, $0.baseAddress! + offset, $0.count - offset) }
    if written <= 0 { return }
    offset += written
  }
}

/// True on the process's main thread, asked of the kernel directly (not through the library).
var isOnMainThread: Bool { carl_gettid() == getpid() }

/// Checks the three things a main-thread body must see: the kernel's main thread, the main
/// actor's isolation (`MainActor.assumeIsolated` traps otherwise) and the main loop's thread.
func expectMainThreadAndMainActor(_ what: String) {
  check(isOnMainThread, "\(what) ran on thread \(carl_gettid()), not the main thread \(getpid())")
  MainActor.assumeIsolated { MainActor.assertIsolated("\(what): not isolated to the main actor") }
  check(RunLoopThread.main.isOnLoopThread, "\(what): RunLoopThread.main.isOnLoopThread is false")
  check(RunLoopThread.isMainThread, "\(what): RunLoopThread.isMainThread is false")
}

/// Kills the process with SIGALRM after `seconds` times `ASYNC_RUN_LOOP_WATCHDOG_SCALE` (a hung
/// scenario fails instead of hanging), even when the test that launched the fixture blocked
/// SIGALRM in the thread that started it.
func startWatchdog(seconds: UInt32 = 30) {
  carl_test_arm_alarm(seconds)
}

/// A value shared between threads, under a pthread mutex (ThreadSanitizer understands it).
final class Locked<Value>: @unchecked Sendable {
  // Safety: `value` is only touched between pthread_mutex_lock and pthread_mutex_unlock of `mutex`.
  private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
  private var value: Value

  init(_ value: Value) {
    self.value = value
    pthread_mutex_init(mutex, nil)
  }

  deinit {
    pthread_mutex_destroy(mutex)
    mutex.deallocate()
  }

  func withLock<T>(_ body: (inout Value) throws -> T) rethrows -> T {
    pthread_mutex_lock(mutex)
    defer { pthread_mutex_unlock(mutex) }
    return try body(&value)
  }

  var current: Value { withLock { $0 } }
}

/// A plain POSIX thread (not a loop thread, not a pool thread).
final class PlainThread: @unchecked Sendable {
  // Safety: `thread` is written once by `init` before any other use and read by `join`, on the
  // thread that created this object.
  private var thread = pthread_t()

  init(_ body: @escaping @Sendable () -> Void) {
    let box = Unmanaged.passRetained(Body(body)).toOpaque()
    let rc = pthread_create(
      &thread, nil,
      { raw in
        Unmanaged<Body>.fromOpaque(raw!).takeRetainedValue().run()
        return nil
      }, box)
    check(rc == 0, "pthread_create failed: \(rc)")
  }

  func join() {
    pthread_join(thread, nil)
  }

  private final class Body: Sendable {
    let run: @Sendable () -> Void
    init(_ run: @escaping @Sendable () -> Void) { self.run = run }
  }
}

/// Blocks the calling thread until `condition` holds (polling every millisecond); fails the
/// scenario after `seconds`.
func waitUntil(_ what: String, seconds: Int = 20, _ condition: () -> Bool) {
  var remaining = seconds * 1000
  while !condition() {
    remaining -= 1
    if remaining <= 0 { fail("timed out waiting for \(what)") }
    usleep(1000)
  }
}

/// A test error with a payload, to check that errors come back unchanged.
struct FixtureError: Error, Equatable {
  let code: Int
}
