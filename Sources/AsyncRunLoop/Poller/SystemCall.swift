import CAsyncRunLoop
import Glibc

/// An operating-system call that failed, with its name and `errno`.
///
/// A request the loop refuses before making the call, because the kernel would refuse it, is
/// reported the same way, with the `errno` the kernel would give and a `reason` stating the rule:
/// e.g. `RunLoopThread(name:cpu:)` with a CPU it cannot pin to throws `EINVAL`.
public struct SystemCallError: Error, CustomStringConvertible, Sendable, Equatable {
  /// The call that failed, e.g. `"epoll_ctl(ADD)"`.
  public var call: String
  /// The `errno` value it returned.
  public var errno: Int32
  /// The rule the request broke, when the loop knows it (nil for a plain failed call).
  public var reason: String? = nil

  public var description: String {
    let failure = "\(call) failed: \(String(cString: strerror(errno))) (errno \(errno))"
    return reason.map { "\(failure): \($0)" } ?? failure
  }
}

/// The file an open descriptor refers to (see `SystemCall.fileIdentity(of:)`).
struct FileIdentity: Equatable {
  let device: UInt64
  let inode: UInt64
}

/// Thin wrappers over the syscalls the loop uses: each retries `EINTR` and turns `-1` + `errno`
/// into a thrown `SystemCallError`. Callable from any thread.
enum SystemCall {
  /// Runs `body` until it does not fail with `EINTR`.
  @inline(__always)
  static func retryingInterrupts<T: BinaryInteger>(
    _ name: @autoclosure () -> String, _ body: () -> T
  ) throws(SystemCallError) -> T {
    while true {
      let result = body()
      if result >= 0 { return result }
      let code = carl_errno()
      if code == EINTR { continue }
      throw SystemCallError(call: name(), errno: code)
    }
  }

  /// The open file a descriptor refers to now (device and inode, from `fstat`), or nil when the
  /// descriptor is not open: tells a descriptor number that still names the same file from one
  /// that was closed and reused.
  static func fileIdentity(of descriptor: Int32) -> FileIdentity? {
    var status = stat()
    guard fstat(descriptor, &status) == 0 else { return nil }
    return FileIdentity(device: UInt64(status.st_dev), inode: UInt64(status.st_ino))
  }

  static func epollCreate() throws(SystemCallError) -> Int32 {
    try retryingInterrupts("epoll_create1") { epoll_create1(Int32(EPOLL_CLOEXEC)) }
  }

  static func eventDescriptor() throws(SystemCallError) -> Int32 {
    try retryingInterrupts("eventfd") { eventfd(0, Int32(EFD_CLOEXEC | EFD_NONBLOCK)) }
  }

  static func timerDescriptor() throws(SystemCallError) -> Int32 {
    try retryingInterrupts("timerfd_create") {
      timerfd_create(CLOCK_MONOTONIC, Int32(TFD_CLOEXEC | TFD_NONBLOCK))
    }
  }

  static func epollControl(
    _ epoll: Int32, _ operation: Int32, _ descriptor: Int32, events: UInt32, token: UInt64
  ) throws(SystemCallError) {
    var event = carl_epoll_event_make(events, token)
    _ = try retryingInterrupts(
      "epoll_ctl(\(operation == EPOLL_CTL_ADD ? "ADD" : operation == EPOLL_CTL_MOD ? "MOD" : "DEL"), fd \(descriptor))"
    ) { epoll_ctl(epoll, operation, descriptor, &event) }
  }

  /// Waits for events; `timeout` is in milliseconds (-1 blocks, 0 polls).
  static func epollWait(
    _ epoll: Int32, _ events: UnsafeMutablePointer<epoll_event>, capacity: Int32, timeout: Int32
  ) throws(SystemCallError) -> Int {
    Int(try retryingInterrupts("epoll_wait") { epoll_wait(epoll, events, capacity, timeout) })
  }

  /// Arms `timer` to expire at the absolute CLOCK_MONOTONIC time `nanoseconds` (0 disarms).
  static func armTimer(_ timer: Int32, atMonotonicNanoseconds nanoseconds: Int64) throws(SystemCallError) {
    var spec = itimerspec()
    spec.it_value.tv_sec = Int(nanoseconds / 1_000_000_000)
    spec.it_value.tv_nsec = Int(nanoseconds % 1_000_000_000)
    _ = try retryingInterrupts("timerfd_settime") {
      timerfd_settime(timer, Int32(TFD_TIMER_ABSTIME), &spec, nil)
    }
  }

  /// Writes one increment to an eventfd. `EAGAIN` (counter saturated) still means "readable".
  static func signalEventDescriptor(_ descriptor: Int32) {
    var one: UInt64 = 1
    while true {
      let written = write(descriptor, &one, 8)
      if written == 8 { return }
      let code = carl_errno()
      if code == EINTR { continue }
      if code == EAGAIN { return }
      preconditionFailure("eventfd write failed: \(String(cString: strerror(code)))")
    }
  }

  /// Reads and discards an eventfd's or timerfd's counter. Returns false when nothing was pending.
  @discardableResult
  static func drainCounter(_ descriptor: Int32) -> Bool {
    var value: UInt64 = 0
    while true {
      let count = read(descriptor, &value, 8)
      if count == 8 { return true }
      let code = carl_errno()
      if code == EINTR { continue }
      return false
    }
  }

  static func close(_ descriptor: Int32) {
    // close() must not be retried on EINTR on Linux: the descriptor is released either way.
    _ = Glibc.close(descriptor)
  }
}
