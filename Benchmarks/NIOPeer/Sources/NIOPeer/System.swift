import CNIOPeer
import Dispatch
import Glibc
import Synchronization

// The system helpers of AsyncRunLoopBenchmarks (System.swift, FutexFloor.swift, WakeRTT.swift),
// repeated here: that target is an executable of the root package and cannot be imported. The
// client side of every round trip is the same as there: it signals the server its own way, then
// blocks in read() on a reply eventfd that every server rings.

/// CLOCK_MONOTONIC in nanoseconds.
@inline(__always)
func monotonicNanoseconds() -> Int64 {
  var spec = timespec()
  clock_gettime(CLOCK_MONOTONIC, &spec)
  return Int64(spec.tv_sec) &* 1_000_000_000 &+ Int64(spec.tv_nsec)
}

@inline(__always)
func microseconds(from start: Int64, to end: Int64) -> Double {
  Double(end - start) / 1000
}

/// A blocking (or non-blocking) eventfd used as a doorbell between two threads.
struct EventDoorbell: Sendable {
  let descriptor: Int32

  init(nonBlocking: Bool = false) {
    let flags = Int32(EFD_CLOEXEC) | (nonBlocking ? Int32(EFD_NONBLOCK) : 0)
    descriptor = eventfd(0, flags)
    precondition(descriptor >= 0, "eventfd failed: \(cnp_errno())")
  }

  @inline(__always)
  func ring() {
    var one: UInt64 = 1
    while write(descriptor, &one, 8) != 8 {
      precondition(cnp_errno() == EINTR, "eventfd write failed: \(cnp_errno())")
    }
  }

  @inline(__always)
  @discardableResult
  func wait() -> UInt64 {
    var value: UInt64 = 0
    while read(descriptor, &value, 8) != 8 {
      precondition(cnp_errno() == EINTR, "eventfd read failed: \(cnp_errno())")
    }
    return value
  }

  @inline(__always)
  func drain() {
    var value: UInt64 = 0
    _ = read(descriptor, &value, 8)
  }

  func close() { _ = Glibc.close(descriptor) }
}

/// One epoll instance watching one descriptor for input.
struct EpollWaiter: Sendable {
  let descriptor: Int32

  init(watching watched: Int32) {
    descriptor = epoll_create1(Int32(EPOLL_CLOEXEC))
    precondition(descriptor >= 0, "epoll_create1 failed: \(cnp_errno())")
    var event = cnp_epoll_event_make(UInt32(EPOLLIN.rawValue), 7)
    precondition(epoll_ctl(descriptor, EPOLL_CTL_ADD, watched, &event) == 0, "epoll_ctl failed")
  }

  @inline(__always)
  func wait() {
    var event = epoll_event()
    while epoll_wait(descriptor, &event, 1, -1) != 1 {}
  }

  func close() { _ = Glibc.close(descriptor) }
}

/// A futex word used as a doorbell: `ring()` from any thread, `wait(seen:)` on the one sleeper.
final class FutexDoorbell: @unchecked Sendable {
  // Safety: the pointer is immutable; its pointee is only touched through the C atomics and the
  // futex system call; deallocated when no thread holds the doorbell any more.
  private let word: UnsafeMutablePointer<UInt32>

  init() {
    word = .allocate(capacity: 1)
    word.initialize(to: 0)
  }

  deinit { word.deallocate() }

  @inline(__always)
  func ring() { cnp_futex_bump_and_wake(word) }

  @inline(__always)
  func wait(seen: inout UInt32) {
    while true {
      let now = cnp_futex_word_load(word)
      if now != seen {
        seen = now
        return
      }
      cnp_futex_wait(word, seen)
    }
  }
}

/// A stop flag shared with a server thread.
final class StopFlag: Sendable {
  private let flag = Atomic<Bool>(false)
  func set() { flag.store(true, ordering: .releasing) }
  var isSet: Bool { flag.load(ordering: .acquiring) }
}

/// Where the two sides run (`--pin`), as AsyncRunLoopBenchmarks' `PinPlan`.
struct PinPlan: Sendable {
  let clientCPU: Int?
  let serverCPU: Int?
  let name: String

  init(_ name: String, cpus: Int) {
    self.name = name
    switch name {
    case "same":
      clientCPU = 0
      serverCPU = 0
    case "split":
      clientCPU = 0
      serverCPU = cpus > 1 ? 1 : 0
    default:
      clientCPU = nil
      serverCPU = nil
    }
  }
}

func pinCurrentThread(_ cpu: Int?) {
  if let cpu { _ = cnp_pin_current_thread(Int32(cpu)) }
}

let onlineCPUs = max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))))

/// A plain pthread running `body`; `join()` waits for it.
final class PlainThread: @unchecked Sendable {
  // Safety: `thread` is written once in init, before any other thread sees this object.
  private var thread = pthread_t()

  init(name: String, cpu: Int?, _ body: @escaping @Sendable () -> Void) {
    let start = Unmanaged.passRetained(ThreadBody(name: name, cpu: cpu, body: body)).toOpaque()
    let rc = pthread_create(
      &thread, nil,
      { raw in
        let start = Unmanaged<ThreadBody>.fromOpaque(raw!).takeRetainedValue()
        _ = cnp_set_thread_name(String(start.name.utf8.prefix(15))!)
        if let cpu = start.cpu { _ = cnp_pin_current_thread(Int32(cpu)) }
        start.body()
        return nil
      }, start)
    precondition(rc == 0, "pthread_create failed: \(rc)")
  }

  func join() { pthread_join(thread, nil) }
}

private final class ThreadBody: Sendable {
  let name: String
  let cpu: Int?
  let body: @Sendable () -> Void
  init(name: String, cpu: Int?, body: @escaping @Sendable () -> Void) {
    self.name = name
    self.cpu = cpu
    self.body = body
  }
}

/// A value handed from one thread to another exactly once, with a blocking wait.
final class Handoff<Value: Sendable>: Sendable {
  private let value = Mutex<Value?>(nil)
  private let ready = DispatchSemaphore(value: 0)

  func put(_ newValue: Value) {
    value.withLock { $0 = newValue }
    ready.signal()
  }

  func take() -> Value {
    ready.wait()
    return value.withLock { $0! }
  }
}

/// Runs an async body to completion from a plain (blocking) thread.
func blockingAwait<Value: Sendable>(_ body: @escaping @Sendable () async -> Value) -> Value {
  let handoff = Handoff<Value>()
  Task.detached { handoff.put(await body()) }
  return handoff.take()
}

/// The 1-minute load average, or nil.
func loadAverage() -> Double? {
  guard let file = fopen("/proc/loadavg", "r") else { return nil }
  defer { fclose(file) }
  var buffer = [CChar](repeating: 0, count: 64)
  guard fgets(&buffer, Int32(buffer.count), file) != nil else { return nil }
  let text = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
  return text.split(separator: " ").first.flatMap { Double($0) }
}

func writeStandardError(_ text: String) {
  var text = text
  text.withUTF8 { bytes in _ = write(2, bytes.baseAddress, bytes.count) }
}

/// The reply doorbell of the round trips: an eventfd the measuring thread blocks on, which also
/// remembers the kernel id of the thread that last rang it, so that the client can wait until
/// that thread sleeps again before the next (settled) round trip.
final class ReplyDoorbell: Sendable {
  let doorbell = EventDoorbell()
  private let ringer = Atomic<UInt>(0)
  private let ringerID = Atomic<Int32>(0)

  @inline(__always)
  func ring() {
    let me = pthread_self()
    if ringer.load(ordering: .relaxed) != me {
      ringer.store(me, ordering: .relaxed)
      ringerID.store(cnp_gettid(), ordering: .relaxed)
    }
    doorbell.ring()
  }

  @inline(__always)
  func wait() { doorbell.wait() }

  /// Blocks until the thread that last rang is asleep (not 'R' in /proc/self/task/<tid>/stat).
  func waitUntilRingerSleeps() {
    let id = ringerID.load(ordering: .relaxed)
    guard id != 0 else { return }
    while threadIsRunnable(id) { sched_yield() }
  }

  func close() { doorbell.close() }
}

func threadIsRunnable(_ id: Int32) -> Bool {
  let descriptor = open("/proc/self/task/\(id)/stat", O_RDONLY)
  guard descriptor >= 0 else { return false }
  defer { close(descriptor) }
  var buffer = (0..<256).map { _ in UInt8(0) }
  let count = read(descriptor, &buffer, buffer.count)
  guard count > 0 else { return false }
  guard let close = buffer[0..<count].lastIndex(of: UInt8(ascii: ")")), close + 2 < count else { return false }
  return buffer[close + 2] == UInt8(ascii: "R")
}
