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

/// Runs `body` and fails the test (rather than hanging it) if it does not finish within `timeout`.
/// The body keeps running in the background on a hang; the test records the failure.
func withWatchdog<T: Sendable>(
  timeout: Duration = .seconds(30), _ what: String = "operation",
  sourceLocation: SourceLocation = #_sourceLocation,
  _ body: @escaping @Sendable () async throws -> T
) async throws -> T? {
  try await withThrowingTaskGroup(of: T?.self) { group in
    group.addTask { try await body() }
    group.addTask {
      try? await Task.sleep(for: timeout)
      return nil
    }
    defer { group.cancelAll() }
    let first = try await group.next()!
    if first == nil { Issue.record("watchdog: \(what) hung for \(timeout)", sourceLocation: sourceLocation) }
    return first
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

/// The number of this process's threads whose name (as the kernel keeps it: 15 bytes) is `name`.
func threadCount(named name: String) -> Int {
  guard let directory = opendir("/proc/self/task") else { return -1 }
  defer { closedir(directory) }
  var count = 0
  while let entry = readdir(directory) {
    let tid = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
    guard tid.first?.isNumber == true, let file = fopen("/proc/self/task/\(tid)/comm", "r") else { continue }
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
