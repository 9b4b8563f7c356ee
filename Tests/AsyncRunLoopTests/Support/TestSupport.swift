import CTestChildProcess
import CTestHarness  // its constructor widens the global executor for the test process
import Glibc
import Testing

@testable import AsyncRunLoop

/// Blocks until `condition` is true, polling every millisecond; records a test failure (instead
/// of hanging) after `timeout`. Use for real-thread tests; never to assert on timing.
@discardableResult
func waitUntil(
  timeout: Duration = .seconds(20), _ what: String = "condition",
  sourceLocation: SourceLocation = #_sourceLocation, _ condition: () -> Bool
) -> Bool {
  let timeout = timeout * watchdogScale
  let deadline = ContinuousClock.now.advanced(by: timeout)
  while !condition() {
    if ContinuousClock.now >= deadline {
      Issue.record("timed out after \(timeout) waiting for \(what)", sourceLocation: sourceLocation)
      return false
    }
    usleep(1000)
  }
  return true
}

/// How much longer every watchdog and wait of the tests allows: `ASYNC_RUN_LOOP_WATCHDOG_SCALE`
/// (CI raises it for the sanitizer runs, where everything is many times slower), 1 by default
/// (`carl_test_watchdog_scale`, which the children's alarms read too).
var watchdogScale: Int { Int(carl_test_watchdog_scale()) }

/// Suspends (without holding a thread of the cooperative pool) until `finished` opens: the body of
/// a watchdog that fired. It ends, or `HangReaper` ends the process.
private func awaitBody(_ finished: TestGate) async {
  await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
    startThread(detached: true) {
      while !finished.wait(timeout: .seconds(3600)) {}
      continuation.resume()
    }
  }
}

/// Runs `body` and fails the test (rather than hanging it) if it does not finish within `timeout`
/// (times `watchdogScale`).
///
/// The body runs in an unstructured task of its own (it inherits the test's task-local context,
/// so its `#expect`s count for the test), timed by a raw thread (hung work may block every pool
/// thread). On a hang the watchdog records the failure and cancels the body; it returns nil once
/// the body has ended, so the test's clean-up (closing descriptors, say) never runs under a
/// body that is merely slow. A body that still has not ended `hangGrace` later never will: the
/// last resort (`HangReaper`) prints which test hung and exits the process with status 1, so CI
/// fails instead of stalling.
func withWatchdog<T: Sendable>(
  timeout: Duration = .seconds(30), _ what: String = "operation",
  sourceLocation: SourceLocation = #_sourceLocation,
  _ body: @escaping @Sendable () async throws -> T
) async throws -> T? {
  try await watch(timeout: timeout, what, sourceLocation: sourceLocation) { done in
    let task = Task {
      let result: Result<T, any Error>
      do { result = .success(try await body()) } catch { result = .failure(error) }
      done(result)
    }
    return { task.cancel() }
  }
}

/// `withWatchdog` for blocking work in an async test: runs `body` on a thread of its own (so a
/// long blocking body does not hold one of the few cooperative-pool threads that every other
/// test's tasks need). As with `withWatchdogSync`, check results after it returns.
func withWatchdogOnThread<T: Sendable>(
  timeout: Duration = .seconds(30), _ what: String = "operation",
  sourceLocation: SourceLocation = #_sourceLocation,
  _ body: @escaping @Sendable () throws -> T
) async throws -> T? {
  try await watch(timeout: timeout, what, sourceLocation: sourceLocation) { done in
    startThread(detached: true) { done(Result { try body() }) }
    return {}
  }
}

/// `repeatRounds` on a thread of its own under a watchdog (`withWatchdogOnThread`), for an async
/// test whose rounds race threads and block: each round appends what went wrong in it to
/// `failures`. Returns every failure, or nil when the watchdog fired.
func failuresOverRounds(
  _ rounds: Int, budget: Duration = .milliseconds(1500), timeout: Duration = .seconds(30), _ what: String,
  sourceLocation: SourceLocation = #_sourceLocation,
  _ round: @escaping @Sendable (_ round: Int, _ failures: inout [String]) -> Void
) async throws -> [String]? {
  try await withWatchdogOnThread(timeout: timeout, what, sourceLocation: sourceLocation) { () -> [String] in
    var failures: [String] = []
    repeatRounds(rounds, budget: budget) { index in round(index, &failures) }
    return failures
  }
}

/// The two async watchdogs: `start` begins the work, which calls `done` once with its result,
/// and returns how to cancel it. The timer is a raw thread, not a task: hung work may be blocking
/// every pool thread.
private func watch<T: Sendable>(
  timeout: Duration, _ what: String, sourceLocation: SourceLocation,
  start: (_ done: @escaping @Sendable (Result<T, any Error>) -> Void) -> () -> Void
) async throws -> T? {
  let timeout = timeout * watchdogScale
  let outcome = WatchdogOutcome<T>()
  let finished = TestGate()
  let cancel = start { result in
    finished.open()
    outcome.finish(.completed(result))
  }
  startThread(detached: true) {
    if !finished.wait(timeout: timeout) { outcome.finish(.timedOut) }
  }
  switch await outcome.wait() {
  case .completed(let result):
    return try result.get()
  case .timedOut:
    Issue.record("watchdog: \(what) hung for \(timeout)", sourceLocation: sourceLocation)
    cancel()
    HangReaper.arm(what: what, sourceLocation: sourceLocation, finished: finished)
    await awaitBody(finished)
    return nil
  }
}

/// `withWatchdog` for synchronous tests and blocking work: runs `body` on a thread of its own and
/// returns nil (having recorded the failure) if it does not finish within `timeout` (times
/// `watchdogScale`), once it has ended; the same last resort ends the process if it never does.
///
/// The body runs outside the test's task, so an `#expect` inside it may not be attributed to the
/// test: return what you want to check and check it after this returns.
func withWatchdogSync<T: Sendable>(
  timeout: Duration = .seconds(30), _ what: String = "operation",
  sourceLocation: SourceLocation = #_sourceLocation,
  _ body: @escaping @Sendable () throws -> T
) throws -> T? {
  let timeout = timeout * watchdogScale
  let result = Guarded<Result<T, any Error>?>(nil)
  let finished = TestGate()
  startThread(detached: true) {
    let value = Result { try body() }
    result.withLock { $0 = value }
    finished.open()
  }
  guard finished.wait(timeout: timeout), let value = result.snapshot else {
    Issue.record("watchdog: \(what) hung for \(timeout)", sourceLocation: sourceLocation)
    HangReaper.arm(what: what, sourceLocation: sourceLocation, finished: finished)
    while !finished.wait(timeout: .seconds(3600)) {}
    return nil
  }
  return try value.get()
}

/// The watchdog's meeting point: the first of "the body finished" and "the timeout passed" wins.
private final class WatchdogOutcome<T: Sendable>: Sendable {
  enum Ending: Sendable {
    case completed(Result<T, any Error>)
    case timedOut
  }

  private enum State {
    case idle
    case waiting(CheckedContinuation<Ending, Never>)
    case ended(Ending)
    case delivered
  }

  private let state = Guarded(State.idle)

  /// Records the ending, once; resumes the waiter if it waits already.
  func finish(_ ending: Ending) {
    let resume: CheckedContinuation<Ending, Never>? = state.withLock { state in
      switch state {
      case .idle:
        state = .ended(ending)
        return nil
      case .waiting(let continuation):
        state = .delivered
        return continuation
      case .ended, .delivered:
        return nil  // the other side won
      }
    }
    resume?.resume(returning: ending)
  }

  func wait() async -> Ending {
    await withCheckedContinuation { continuation in
      let ready: Ending? = state.withLock { state in
        switch state {
        case .idle:
          state = .waiting(continuation)
          return nil
        case .ended(let ending):
          state = .delivered
          return ending
        case .waiting, .delivered:
          preconditionFailure("watchdog waited twice")
        }
      }
      if let ready { continuation.resume(returning: ready) }
    }
  }
}

/// The process-wide last resort for hung tests: once a watchdog gave up on a body, a thread waits
/// `hangGrace` more for it; if it still has not ended, it prints which test hung and exits the
/// process with status 1 (`_exit`: the hung work may hold locks that exit handlers need).
enum HangReaper {
  /// How long a hung body may linger after its watchdog fired: `ASYNC_RUN_LOOP_HANG_GRACE`
  /// seconds, 60 by default.
  static var hangGrace: Duration {
    guard let raw = getenv("ASYNC_RUN_LOOP_HANG_GRACE"), let value = Int(String(cString: raw)), value > 0 else {
      return .seconds(60)
    }
    return .seconds(value)
  }

  static func arm(what: String, sourceLocation: SourceLocation, finished: TestGate) {
    let test = Test.current?.name ?? "(unknown test)"
    let grace = hangGrace
    startThread(detached: true) {
      if finished.wait(timeout: grace) { return }
      let message =
        "watchdog: \(what) in test \(test) (\(sourceLocation)) is still hung \(grace) after its"
        + " timeout; exiting the process so that CI fails instead of stalling\n"
      fflush(nil)  // what the test run printed so far
      _ = message.utf8CString.withUnsafeBufferPointer { write(2, $0.baseAddress, $0.count - 1) }
      _exit(1)
    }
  }
}

/// Expects the standard error of an exit test's child process to contain `message`. A nil
/// `result` means the exit test itself already recorded the failure.
func expectStandardError(
  of result: ExitTest.Result?, mentions message: String, sourceLocation: SourceLocation = #_sourceLocation
) {
  guard let result else { return }
  let stderr = String(decoding: result.standardErrorContent, as: UTF8.self)
  #expect(stderr.contains(message), "stderr was: \(stderr)", sourceLocation: sourceLocation)
}

// MARK: - Pipes

/// A pipe whose ends do not block and close on exec: (read end, write end). Traps if the pipe
/// cannot be made (callable from the plain, non-throwing closures that engine-thread tests run).
func makePipe() -> (read: Int32, write: Int32) {
  var descriptors: [Int32] = [-1, -1]
  let rc = pipe(&descriptors)
  precondition(rc == 0, "pipe failed: \(errno)")
  for descriptor in descriptors {
    _ = fcntl(descriptor, F_SETFL, fcntl(descriptor, F_GETFL) | O_NONBLOCK)
    _ = fcntl(descriptor, F_SETFD, FD_CLOEXEC)
  }
  return (descriptors[0], descriptors[1])
}

/// Writes one byte; traps if it was not written.
func writeByte(_ descriptor: Int32) {
  var byte: UInt8 = 1
  let written = write(descriptor, &byte, 1)
  precondition(written == 1, "write failed: \(errno)")
}

/// Reads until the descriptor would block (or is at end of file); returns how many bytes were read.
@discardableResult
func drainDescriptor(_ descriptor: Int32) -> Int {
  var buffer = [UInt8](repeating: 0, count: 256)
  var total = 0
  while true {
    let count = read(descriptor, &buffer, buffer.count)
    if count <= 0 { return total }
    total += count
  }
}

/// A thread-safe box for test bookkeeping.
typealias Locked<Value> = LockedValue<Value>

/// The number of open file descriptors of this process.
func openDescriptorCount() -> Int {
  guard let directory = opendir("/proc/self/fd") else { return -1 }
  defer { closedir(directory) }
  var count = 0
  while readdir(directory) != nil { count += 1 }
  return count - 3  // ".", "..", and the directory's own descriptor
}

/// The number of threads in this process.
func threadCount() -> Int {
  guard let directory = opendir("/proc/self/task") else { return -1 }
  defer { closedir(directory) }
  var count = 0
  while readdir(directory) != nil { count += 1 }
  return count - 2
}

/// How many times stress loops repeat: 1 by default; `ASYNC_RUN_LOOP_STRESS=N` multiplies.
var stressFactor: Int {
  guard let raw = getenv("ASYNC_RUN_LOOP_STRESS"), let value = Int(String(cString: raw)), value > 0 else {
    return 1
  }
  return value
}

/// The number of this process's threads whose name (as the kernel keeps it: 15 bytes) is `name`,
/// or -1 when it cannot tell: a thread's name that cannot be read for any reason other than the
/// thread having ended (out of descriptors while other tests hold many, say) is never taken for
/// "not that thread", so `threadCount(named:) == 0` never reports a live thread gone.
func threadCount(named name: String) -> Int {
  guard let directory = opendir("/proc/self/task") else { return -1 }
  defer { closedir(directory) }
  var count = 0
  while let entry = readdir(directory) {
    let tid = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
    guard tid.first?.isNumber == true else { continue }
    guard let file = fopen("/proc/self/task/\(tid)/comm", "r") else {
      if errno == ENOENT || errno == ESRCH { continue }  // the thread ended since readdir listed it
      return -1
    }
    var buffer = [CChar](repeating: 0, count: 32)
    if fgets(&buffer, 32, file) != nil {
      var comm = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
      if comm.hasSuffix("\n") { comm.removeLast() }
      if comm == name { count += 1 }
    }
    fclose(file)
  }
  return count
}

/// Blocks `loop` in a performed block until the returned gate opens, so that what the test sends
/// meanwhile waits in the loop's inbox and reaches the loop as one batch. Returns once the block
/// runs.
func blockLoop(_ loop: RunLoopThread) -> TestGate {
  let started = TestGate()
  let release = TestGate()
  loop.perform {
    started.open()
    _ = release.wait(timeout: .seconds(20))
  }
  _ = started.wait(timeout: .seconds(20))
  return release
}

/// An event log shared with loop-thread callouts. Any thread.
final class EventLog: Sendable {
  let entries = Guarded<[String]>([])
  func add(_ entry: String) { entries.withLock { $0.append(entry) } }
  var snapshot: [String] { entries.snapshot }
  func count(_ entry: String) -> Int { snapshot.filter { $0 == entry }.count }
}

/// Counts per loop (by name) of a custom source's schedule and cancel calls. Any thread.
final class PairLog: Sendable {
  let counts = Guarded<[String: (schedule: Int, cancel: Int)]>([:])
  func schedule(_ loop: RunLoopThread) { counts.withLock { $0[loop.name, default: (0, 0)].schedule += 1 } }
  func cancel(_ loop: RunLoopThread) { counts.withLock { $0[loop.name, default: (0, 0)].cancel += 1 } }
  /// The loops whose schedules and cancels do not pair up.
  var unpaired: [String] {
    counts.snapshot.filter { $0.value.schedule != $0.value.cancel }.map {
      "\($0.key): schedule \($0.value.schedule), cancel \($0.value.cancel)"
    }
  }
}
