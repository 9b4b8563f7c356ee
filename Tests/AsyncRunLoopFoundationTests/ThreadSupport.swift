import Dispatch
import Foundation

#if canImport(Glibc)
  import Glibc
#endif

/// The calling thread's kernel id, read from `/proc/thread-self` (`<pid>/task/<tid>`).
func currentKernelThreadID() -> String? {
  var buffer = [UInt8](repeating: 0, count: 64)
  let length = readlink("/proc/thread-self", &buffer, buffer.count)
  guard length > 0 else { return nil }
  return String(decoding: buffer.prefix(length), as: UTF8.self).split(separator: "/").last.map(String.init)
}

/// Whether the thread `id` (a kernel id) of this process is alive; nil when that cannot be told.
func threadExists(_ id: String) -> Bool? {
  if access("/proc/self/task/\(id)", F_OK) == 0 { return true }
  return errno == ENOENT ? false : nil
}

/// Polls `condition` every 5 ms until it holds (true) or a generous deadline passes (false).
func eventually(_ condition: () -> Bool) async -> Bool {
  let deadline = ContinuousClock.now.advanced(by: .seconds(20 * watchdogScale))
  while !condition() {
    guard ContinuousClock.now < deadline else { return false }
    try? await Task.sleep(for: .milliseconds(5))
  }
  return true
}

/// The value of `task` once it has returned, or nil (having cancelled it) when it did not within
/// a generous deadline.
func finishedValue<T: Sendable>(of task: Task<T, Never>) async -> T? {
  let ended = BridgeTestLog()
  let result = Task { () -> T in
    let value = await task.value
    ended.append("ended")
    return value
  }
  guard await eventually({ !ended.snapshot.isEmpty }) else {
    task.cancel()
    return nil
  }
  return await result.value
}

/// Waits, off the cooperative pool, until `semaphore` is signalled (true) or a generous deadline
/// passes (false).
func waitOffThePool(_ semaphore: DispatchSemaphore) async -> Bool {
  await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
    DispatchQueue.global().async {
      continuation.resume(returning: semaphore.wait(timeout: .now() + .seconds(20 * watchdogScale)) == .success)
    }
  }
}

/// Runs `body` on a new Foundation thread with a stack of `stackSize` bytes (0: the default) and
/// returns its result once that thread is done with it.
func onNewThread<T: Sendable>(stackSize: Int = 0, _ body: @escaping @Sendable () -> T) async -> T {
  await withCheckedContinuation { (continuation: CheckedContinuation<T, Never>) in
    let thread = Thread { continuation.resume(returning: body()) }
    if stackSize > 0 { thread.stackSize = stackSize }
    thread.start()
  }
}

/// Integers any thread may append to.
final class CountingLog: @unchecked Sendable {  // Safety: proof below
  // Safety: `entries` is only touched with `lock` held.
  private let lock = NSLock()
  private var entries: [Int] = []

  func append(_ entry: Int) { lock.withLock { entries.append(entry) } }
  var snapshot: [Int] { lock.withLock { entries } }
}
