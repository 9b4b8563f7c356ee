import AsyncRunLoop
import CTestChildProcess
import Foundation

#if canImport(Glibc)
  import Glibc
#endif

// Support for the Foundation bridge fixture: a process whose main thread runs Foundation's and
// AsyncRunLoop's main loops, bridged. AsyncRunLoopFoundationTests launch it once per scenario; a
// scenario prints what it checked and exits 0, or prints "FAIL: …" to stderr and exits 1. A
// watchdog alarm kills a hung scenario.

/// Writes a line to stdout, unbuffered.
func say(_ line: String) {
  FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

/// Fails the scenario: prints the reason to stderr and exits 1.
func fail(_ message: String, file: StaticString = #fileID, line: UInt = #line) -> Never {
  FileHandle.standardError.write(Data("FAIL: \(message) (\(file):\(line))\n".utf8))
  exit(1)
}

/// Fails the scenario unless `condition` holds.
func check(_ condition: Bool, _ message: @autoclosure () -> String, file: StaticString = #fileID, line: UInt = #line) {
  if !condition { fail(message(), file: file, line: line) }
}

/// True on the process's main thread (thread id == process id, asked of the kernel).
var isOnMainThread: Bool { RunLoopThread.isMainThread }

/// Kills the process with SIGALRM after `seconds` times `ASYNC_RUN_LOOP_WATCHDOG_SCALE`, even when
/// the test that launched the fixture blocked SIGALRM in the thread that started it.
func startWatchdog(seconds: UInt32 = 60) {
  carl_test_arm_alarm(seconds)
}

/// A value shared between threads, under a pthread mutex.
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

  var snapshot: Value { withLock { $0 } }
}

/// The process's CPU time (user + system), in nanoseconds.
func processCPUNanoseconds() -> Int64 {
  var usage = rusage()
  getrusage(Int32(RUSAGE_SELF.rawValue), &usage)
  let user = Int64(usage.ru_utime.tv_sec) * 1_000_000_000 + Int64(usage.ru_utime.tv_usec) * 1000
  let system = Int64(usage.ru_stime.tv_sec) * 1_000_000_000 + Int64(usage.ru_stime.tv_usec) * 1000
  return user + system
}

/// Starts a raw thread running `body`.
func startThread(_ body: @escaping @Sendable () -> Void) {
  Thread { body() }.start()
}

/// A thread started now that blocks in `runOnMainAndWait { 7 }`. `outcome`: nil while it is
/// blocked, then "returned 7", "refused" (`wouldDeadlock`) or "threw …".
final class BlockedMainCall: Sendable {
  let outcome = Locked<String?>(nil)
  private let ended = DispatchSemaphore(value: 0)

  init() {
    startThread { [outcome, ended] in
      do {
        let value = try runOnMainAndWait { () -> Int in 7 }
        outcome.withLock { $0 = "returned \(value)" }
      } catch RunLoopError.wouldDeadlock {
        outcome.withLock { $0 = "refused" }
      } catch {
        outcome.withLock { $0 = "threw \(error)" }
      }
      ended.signal()
    }
  }

  /// Whether the call ended within `seconds`.
  func waitForEnd(seconds: Int) -> Bool {
    ended.wait(timeout: .now() + .seconds(seconds)) == .success
  }
}
