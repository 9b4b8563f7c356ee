import CAsyncRunLoop
import Dispatch
import Glibc
import Synchronization

// Small system helpers shared by every scenario: a monotonic clock, eventfd/epoll/timerfd
// wrappers, threads, pinning, CPU-time and /proc counters.

/// CLOCK_MONOTONIC in nanoseconds (the clock the loops' timers use).
@inline(__always)
func monotonicNanoseconds() -> Int64 {
  var spec = timespec()
  clock_gettime(CLOCK_MONOTONIC, &spec)
  return Int64(spec.tv_sec) &* 1_000_000_000 &+ Int64(spec.tv_nsec)
}

/// Nanoseconds between two `monotonicNanoseconds()` readings, in microseconds.
@inline(__always)
func microseconds(from start: Int64, to end: Int64) -> Double {
  Double(end - start) / 1000
}

/// A blocking (or non-blocking) eventfd used as a doorbell between two threads.
struct EventDoorbell: Sendable {
  let descriptor: Int32

  /// - Parameter nonBlocking: true for descriptors that are waited on with epoll.
  init(nonBlocking: Bool = false) {
    let flags = Int32(EFD_CLOEXEC) | (nonBlocking ? Int32(EFD_NONBLOCK) : 0)
    descriptor = eventfd(0, flags)
    precondition(descriptor >= 0, "eventfd failed: \(carl_errno())")
  }

  /// Adds one to the counter (wakes a reader). Any thread.
  @inline(__always)
  func ring() {
    var one: UInt64 = 1
    while write(descriptor, &one, 8) != 8 {
      precondition(carl_errno() == EINTR, "eventfd write failed: \(carl_errno())")
    }
  }

  /// Blocks until the counter is non-zero and resets it (blocking descriptors only).
  @inline(__always)
  @discardableResult
  func wait() -> UInt64 {
    var value: UInt64 = 0
    while read(descriptor, &value, 8) != 8 {
      precondition(carl_errno() == EINTR, "eventfd read failed: \(carl_errno())")
    }
    return value
  }

  /// Resets the counter without blocking (non-blocking descriptors).
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
    precondition(descriptor >= 0, "epoll_create1 failed: \(carl_errno())")
    var event = carl_epoll_event_make(UInt32(EPOLLIN.rawValue), 7)
    precondition(epoll_ctl(descriptor, EPOLL_CTL_ADD, watched, &event) == 0, "epoll_ctl failed")
  }

  /// Sleeps in epoll_wait until the watched descriptor is readable.
  @inline(__always)
  func wait() {
    var event = epoll_event()
    while epoll_wait(descriptor, &event, 1, -1) != 1 {}
  }

  func close() { _ = Glibc.close(descriptor) }
}

/// Where the benchmark's two sides run (`--pin`).
struct PinPlan: Sendable {
  /// The side that starts a round trip (the measuring thread, loop A, the producer).
  let clientCPU: Int?
  /// The side that answers (the loop being woken, loop B, the consumer, timer threads).
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

/// Pins the calling thread to `cpu` (nil: leaves it unpinned).
func pinCurrentThread(_ cpu: Int?) {
  if let cpu { _ = carl_pin_current_thread(Int32(cpu)) }
}

/// Online CPUs.
let onlineCPUs = max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))))

/// A plain pthread running `body`; `join()` waits for it.
final class PlainThread: @unchecked Sendable {
  // Safety: `thread` is written once in init, before any other thread can see this object, and
  // only read by `join()`.
  private var thread = pthread_t()

  init(name: String, cpu: Int?, _ body: @escaping @Sendable () -> Void) {
    let start = Unmanaged.passRetained(ThreadBody(name: name, cpu: cpu, body: body)).toOpaque()
    let rc = pthread_create(
      &thread, nil,
      { raw in
        let start = Unmanaged<ThreadBody>.fromOpaque(raw!).takeRetainedValue()
        _ = carl_set_thread_name(String(start.name.utf8.prefix(15))!)
        if let cpu = start.cpu { _ = carl_pin_current_thread(Int32(cpu)) }
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
func blockingAwait<Value: Sendable>(
  executor: (any TaskExecutor)? = nil, _ body: @escaping @Sendable () async -> Value
) -> Value {
  let handoff = Handoff<Value>()
  Task.detached(executorPreference: executor) { handoff.put(await body()) }
  return handoff.take()
}

/// The CPU time a thread has used so far, in nanoseconds (its POSIX CPU-time clock); nil if the
/// clock cannot be read.
func threadCPUNanoseconds(_ clock: clockid_t) -> Int64? {
  var spec = timespec()
  guard clock_gettime(clock, &spec) == 0 else { return nil }
  return Int64(spec.tv_sec) &* 1_000_000_000 &+ Int64(spec.tv_nsec)
}

/// The calling thread's minor page faults so far (first touches of fresh memory, among others).
/// The process's minor page faults so far (every thread's).
func processMinorFaults() -> Int {
  var usage = rusage()
  guard getrusage(__rusage_who_t(0), &usage) == 0 else { return 0 }  // RUSAGE_SELF
  return Int(usage.ru_minflt)
}

/// Nanoseconds per first touch of a fresh anonymous page, on the calling thread, over `pages`
/// pages: what the kernel charges for each minor fault of memory never touched before (a fresh
/// mapping, written once per page, unmapped after). 0 for no pages.
func firstTouchNanosecondsPerPage(pages: Int) -> Double {
  guard pages > 0 else { return 0 }
  let pageSize = Int(sysconf(Int32(_SC_PAGESIZE)))
  let size = pages * pageSize
  guard let mapping = mmap(nil, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0),
    mapping != MAP_FAILED
  else { return .nan }
  defer { munmap(mapping, size) }
  let start = monotonicNanoseconds()
  for offset in stride(from: 0, to: size, by: pageSize) {
    mapping.storeBytes(of: 1, toByteOffset: offset, as: UInt8.self)
  }
  return Double(monotonicNanoseconds() - start) / Double(pages)
}

func threadMinorFaults() -> Int {
  var usage = rusage()
  let rusageThread = __rusage_who_t(1)  // RUSAGE_THREAD (Glibc's module does not export it)
  guard getrusage(rusageThread, &usage) == 0 else { return 0 }
  return Int(usage.ru_minflt)
}

/// The calling thread's CPU-time clock id (readable from any thread of the process).
func currentThreadCPUClock() -> clockid_t {
  var clock = clockid_t()
  pthread_getcpuclockid(pthread_self(), &clock)
  return clock
}

/// The number of entries in a /proc directory (open descriptors, threads).
func countEntries(_ path: String) -> Int {
  guard let directory = opendir(path) else { return -1 }
  defer { closedir(directory) }
  var count = 0
  while let entry = readdir(directory) {
    let isDot = withUnsafeBytes(of: entry.pointee.d_name) { bytes in
      bytes[0] == UInt8(ascii: ".") && (bytes[1] == 0 || (bytes[1] == UInt8(ascii: ".") && bytes[2] == 0))
    }
    if !isDot { count += 1 }
  }
  return count
}

/// The 1-minute load average (/proc/loadavg), or nil.
func loadAverage() -> Double? {
  guard let file = fopen("/proc/loadavg", "r") else { return nil }
  defer { fclose(file) }
  var value = 0.0
  return fscanf_double(file, &value) ? value : nil
}

/// Reads one floating-point number from `file` (fscanf is variadic, so not callable from Swift).
private func fscanf_double(_ file: UnsafeMutablePointer<FILE>, _ value: inout Double) -> Bool {
  var buffer = [CChar](repeating: 0, count: 64)
  guard fgets(&buffer, Int32(buffer.count), file) != nil else { return false }
  let text = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
  guard let first = text.split(separator: " ").first, let parsed = Double(first) else { return false }
  value = parsed
  return true
}

/// Open descriptors of this process (the directory handle itself is not counted).
func openDescriptorCount() -> Int { countEntries("/proc/self/fd") - 1 }

/// Sleeps the calling thread.
func sleepNanoseconds(_ nanoseconds: Int64) {
  var spec = timespec(tv_sec: Int(nanoseconds / 1_000_000_000), tv_nsec: Int(nanoseconds % 1_000_000_000))
  var remaining = timespec()
  while nanosleep(&spec, &remaining) != 0 && carl_errno() == EINTR { spec = remaining }
}

/// Writes `text` to standard error (unbuffered).
func writeStandardError(_ text: String) {
  var text = text
  text.withUTF8 { bytes in _ = write(2, bytes.baseAddress, bytes.count) }
}

/// The reply doorbell of the round-trip scenarios: an eventfd the measuring thread blocks on,
/// which also remembers the kernel id of the thread that last rang it (the server), so that the
/// client can wait until that thread is asleep again before the next round trip.
final class ReplyDoorbell: Sendable {
  let doorbell = EventDoorbell()
  /// The pthread and kernel thread id of the last ringer. Relaxed: the client reads them after
  /// the eventfd read that the ring caused, which orders them.
  private let ringer = Atomic<UInt>(0)
  private let ringerID = Atomic<Int32>(0)

  /// Rings; costs a syscall (gettid) only the first time a new thread rings.
  @inline(__always)
  func ring() {
    let me = pthread_self()  // an integer on Linux; cheap (a thread-pointer read)
    if ringer.load(ordering: .relaxed) != me {
      ringer.store(me, ordering: .relaxed)
      ringerID.store(carl_gettid(), ordering: .relaxed)
    }
    doorbell.ring()
  }

  @inline(__always)
  func wait() { doorbell.wait() }

  /// Blocks until the thread that last rang is asleep (not running or runnable, per
  /// /proc/self/task/<tid>/stat), yielding meanwhile; returns at once before the first ring.
  func waitUntilRingerSleeps() {
    let id = ringerID.load(ordering: .relaxed)
    guard id != 0 else { return }
    while threadIsRunnable(id) { sched_yield() }
  }

  func close() { doorbell.close() }
}

/// Whether a thread of this process is running or runnable ('R' in /proc/self/task/<tid>/stat);
/// false when it sleeps, or no longer exists.
func threadIsRunnable(_ id: Int32) -> Bool {
  let descriptor = open("/proc/self/task/\(id)/stat", O_RDONLY)
  guard descriptor >= 0 else { return false }
  defer { close(descriptor) }
  var buffer = (0..<256).map { _ in UInt8(0) }
  let count = read(descriptor, &buffer, buffer.count)
  guard count > 0 else { return false }
  // "tid (name) S ...": the state follows the last ')'.
  guard let close = buffer[0..<count].lastIndex(of: UInt8(ascii: ")")), close + 2 < count else { return false }
  return buffer[close + 2] == UInt8(ascii: "R")
}
