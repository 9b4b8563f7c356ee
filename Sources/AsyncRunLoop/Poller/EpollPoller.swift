import CAsyncRunLoop
import Glibc

/// The loop's kernel interface: one epoll instance watching a wake-up eventfd, one timerfd and the
/// registered readiness descriptors; and a futex word, which the loop sleeps on instead when it
/// watches no descriptor and no timer (only another thread can wake it then, and a futex wake-up
/// costs less than an eventfd write read back through `epoll_wait`).
///
/// Thread rules: `wake(_:)` may be called from any thread; everything else is called only on the
/// loop's thread (or during init/deinit, when no other thread can see the poller).
final class EpollPoller: @unchecked Sendable {  // Safety: proof below
  // Safety: the descriptors and `futexWord` (the pointer) are immutable after init, except
  // `epollDescriptor`, which only `rebuild` replaces, on the loop thread (no other thread reads it:
  // `wake(_:)` uses the eventfd or the futex word); `wake(_:)`
  // only writes to `wakeDescriptor` (a thread-safe syscall) or changes `futexWord`'s pointee with
  // an atomic add and wakes it (a thread-safe syscall). `armedTimerDeadline`, `eventBuffer`, `readyCount` and `waitCount` are
  // touched only by the loop thread, which every caller of the other methods is (see the loop's
  // assertions).

  /// The token epoll reports for the wake-up eventfd.
  static let wakeToken: UInt64 = 0
  /// The token epoll reports for the timerfd. Readiness registrations' tokens are larger (see
  /// `DescriptorRegistry`).
  static let timerToken: UInt64 = 1

  private var epollDescriptor: Int32
  private let wakeDescriptor: Int32
  private let timerDescriptor: Int32
  private static let eventCapacity: Int32 = 64
  private let eventBuffer: UnsafeMutablePointer<epoll_event>
  /// Counts `wait` calls, so that delivering a wait's events can tell that the loop waited again
  /// meanwhile (it ran nested).
  private var waitCount: UInt64 = 0
  /// The events the last wait left in `eventBuffer`.
  private var readyCount = 0
  /// The absolute CLOCK_MONOTONIC time the timerfd is armed for; `nil` when disarmed.
  private var armedTimerDeadline: Int64?
  /// The timerfd expired and was not read: it stays readable until the next `timerfd_settime`
  /// (which resets its expiration count), so `setTimer` must make that call even to disarm.
  private var timerExpiredUnread = false
  /// The word the loop sleeps on in futex mode; producers change it before waking it.
  private let futexWord: UnsafeMutablePointer<UInt32>

  init() throws(SystemCallError) {
    let epoll = try SystemCall.epollCreate()
    var opened = [epoll]
    do {
      let wake = try SystemCall.eventDescriptor()
      opened.append(wake)
      let timer = try SystemCall.timerDescriptor()
      opened.append(timer)
      // Edge-triggered, and never read: every write is a new edge, so a wake-up needs no read
      // back (one system call less per wake-up). The counter only grows by one per coalesced
      // wake-up; saturating it would take 2^64 - 2 of them.
      try SystemCall.epollControl(
        epoll, EPOLL_CTL_ADD, wake, events: UInt32(EPOLLIN.rawValue) | UInt32(EPOLLET.rawValue), token: Self.wakeToken)
      try SystemCall.epollControl(epoll, EPOLL_CTL_ADD, timer, events: UInt32(EPOLLIN.rawValue), token: Self.timerToken)
      epollDescriptor = epoll
      wakeDescriptor = wake
      timerDescriptor = timer
    } catch {
      opened.forEach(SystemCall.close)
      throw error
    }
    eventBuffer = .allocate(capacity: Int(Self.eventCapacity))
    futexWord = .allocate(capacity: 1)
    futexWord.initialize(to: 0)
  }

  deinit {
    SystemCall.close(timerDescriptor)
    SystemCall.close(wakeDescriptor)
    SystemCall.close(epollDescriptor)
    eventBuffer.deallocate()
    futexWord.deallocate()
  }

  /// Makes a loop that sleeps on `mechanism` return from its sleep. Any thread. Callers
  /// coalesce: see `LoopInbox.wakePending`.
  @inline(__always)
  func wake(_ mechanism: LoopInbox.SleepMechanism) {
    switch mechanism {
    case .epoll: SystemCall.signalEventDescriptor(wakeDescriptor)
    case .futex: carl_futex_bump_and_wake(futexWord)
    }
  }

  /// The epoll instance a host loop polls for readability when it embeds this loop (see
  /// `RunLoopThread+Embedding`). Changes only when `rebuild` replaces the set. Loop thread.
  var pollableDescriptor: Int32 { epollDescriptor }

  /// The absolute CLOCK_MONOTONIC time the timerfd is armed for, nil when disarmed. Loop thread.
  var timerDeadline: Int64? { armedTimerDeadline }

  /// Whether the timerfd is armed (a timer or a run's time limit will wake the loop). Loop thread.
  var isTimerArmed: Bool { armedTimerDeadline != nil }

  /// The futex word's value before the loop decides to sleep on it. Read it under the same lock
  /// as the decision (`LoopInbox.prepareToSleep(on:)`): a producer that wakes the loop changes
  /// the word after that, so `sleepOnFutex(ticket:)` then returns at once. Loop thread.
  func futexTicket() -> UInt32 { carl_futex_word_load(futexWord) }

  /// Sleeps until a producer wakes the futex (at once if one did since `ticket` was read). May
  /// return spuriously (a signal); the loop then makes an ordinary pass. Loop thread.
  func sleepOnFutex(ticket: UInt32) {
    carl_futex_wait(futexWord, ticket)
  }

  /// Arms the timerfd for an absolute monotonic deadline, or disarms it for `nil`.
  /// Skips the syscall when the timer is already armed for exactly that time. Loop thread.
  func setTimer(deadline: Int64?) {
    guard deadline != armedTimerDeadline || timerExpiredUnread else { return }
    armedTimerDeadline = deadline
    timerExpiredUnread = false
    // An absolute deadline in the past fires at once (no EINVAL, unlike a negative relative
    // time); 0 would mean "disarm", so the earliest real deadline is 1 ns.
    let value = deadline.map { max($0, 1) } ?? 0
    do {
      try SystemCall.armTimer(timerDescriptor, atMonotonicNanoseconds: value)
    } catch {
      preconditionFailure("AsyncRunLoop: \(error)")
    }
  }

  /// Registers a readiness descriptor under `token`. Loop thread.
  func register(descriptor: Int32, events: UInt32, token: UInt64) throws(SystemCallError) {
    try SystemCall.epollControl(epollDescriptor, EPOLL_CTL_ADD, descriptor, events: events, token: token)
  }

  /// Replaces the epoll instance by a new one that watches the wake-up eventfd, the timerfd and
  /// `registrations` only. This is the one way to drop a registration that epoll keeps for a file
  /// still open through another descriptor (a `dup`) after its number here was closed: epoll keys
  /// registrations by file and number, so `EPOLL_CTL_DEL` by number can no longer reach it, and a
  /// level-triggered one would end every wait at once. A pending wake-up is not lost: adding the
  /// readable eventfd reports it. Loop thread.
  /// - Returns: the tokens of `registrations` epoll refused (their descriptors were closed), or
  ///   nil when no new instance could be made (the old one stays).
  func rebuild(keeping registrations: [(descriptor: Int32, events: UInt32, token: UInt64)]) -> [UInt64]? {
    guard let epoll = try? SystemCall.epollCreate() else { return nil }
    do {
      try SystemCall.epollControl(
        epoll, EPOLL_CTL_ADD, wakeDescriptor, events: UInt32(EPOLLIN.rawValue) | UInt32(EPOLLET.rawValue),
        token: Self.wakeToken)
      try SystemCall.epollControl(
        epoll, EPOLL_CTL_ADD, timerDescriptor, events: UInt32(EPOLLIN.rawValue), token: Self.timerToken)
    } catch {
      SystemCall.close(epoll)
      return nil
    }
    var refused: [UInt64] = []
    for registration in registrations {
      do {
        try SystemCall.epollControl(
          epoll, EPOLL_CTL_ADD, registration.descriptor, events: registration.events, token: registration.token)
      } catch {
        refused.append(registration.token)
      }
    }
    SystemCall.close(epollDescriptor)
    epollDescriptor = epoll
    return refused
  }

  /// Removes a registration. A descriptor that was already closed (and so already dropped by
  /// the kernel) is not an error, whatever its number names now. Loop thread.
  /// - Returns: false when the registration was gone already (its descriptor was closed).
  @discardableResult
  func deregister(descriptor: Int32) -> Bool {
    // The number was closed, and a rebuild of the set (`rebuild`) took it for its new epoll
    // descriptor: the registration went with the old set.
    guard descriptor != epollDescriptor else { return false }
    do {
      try SystemCall.epollControl(epollDescriptor, EPOLL_CTL_DEL, descriptor, events: 0, token: 0)
      return true
    } catch {
      // All mean gone: EBADF, closed already; ENOENT, the kernel dropped it when it was closed
      // (the number may name another file by now); EPERM, the number was reused meanwhile by a
      // file epoll cannot watch (a regular file: another thread opened one after the close).
      assert(error.errno == EBADF || error.errno == ENOENT || error.errno == EPERM, "AsyncRunLoop: \(error)")
      return false
    }
  }

  /// Waits for events (blocking when `block` is true, polling otherwise) and notes the timerfd's
  /// expiry; the readiness events stay in the buffer for `deliverReadiness`. Neither the wake-up
  /// eventfd nor the timerfd is read (a system call each, before the loop gets to the timer or the
  /// work): the eventfd is edge-triggered, and the expired timerfd is reset by the next
  /// `setTimer`, which the loop calls before every wait. Loop thread.
  /// `afterWait` runs right after the kernel returned.
  /// - Returns: The wait's number, for `deliverReadiness`.
  @discardableResult
  func wait(block: Bool, afterWait: () -> Void = {}) -> UInt64 {
    waitCount &+= 1
    let count: Int
    do {
      count = try SystemCall.epollWait(
        epollDescriptor, eventBuffer, capacity: Self.eventCapacity, timeout: block ? -1 : 0)
    } catch {
      preconditionFailure("AsyncRunLoop: \(error)")
    }
    afterWait()
    readyCount = count
    for index in 0..<count where token(at: index) == Self.timerToken {
      // The kernel disarms a one-shot timerfd once it expires.
      armedTimerDeadline = nil
      timerExpiredUnread = true
    }
    return waitCount
  }

  /// Reports each readiness event of wait number `wait` to `handleReadiness(token, events)`, in
  /// the kernel's order (the wake-up itself is no event: the inbox says what arrived). Loop
  /// thread.
  ///
  /// Stops when the loop waited again meanwhile — a handler, or a callout between the wait and
  /// this call, ran the loop nested: that wait reused the buffer, and what it reported makes the
  /// rest of ours stale (a descriptor it drained would be reported to its handler again).
  /// Registrations are level-triggered, so what is still ready is reported by the next wait; the
  /// wake-up eventfd's edge only ends a sleep, and an expired timerfd stays readable until
  /// `setTimer`.
  func deliverReadiness(ofWait wait: UInt64, _ handleReadiness: (UInt64, UInt32) -> Void) {
    for index in 0..<readyCount {
      guard waitCount == wait else { return }
      let token = token(at: index)
      guard token != Self.wakeToken, token != Self.timerToken else { continue }
      handleReadiness(token, eventBuffer[index].events)
    }
  }

  /// Whether wait number `wait` is the last one (no wait since: its events are in the buffer).
  /// Loop thread.
  func isLatest(wait: UInt64) -> Bool { waitCount == wait }

  @inline(__always)
  private func token(at index: Int) -> UInt64 {
    withUnsafePointer(to: eventBuffer[index]) { carl_epoll_event_token($0) }
  }
}
