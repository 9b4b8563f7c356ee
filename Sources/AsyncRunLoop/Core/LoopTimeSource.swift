/// Where a loop reads the time: the system's monotonic clock, or a virtual clock that moves only
/// when a test says (`AsyncRunLoopTesting.VirtualTimeLoop`). Fixed for the loop's life.
///
/// The `.system` case is one branch and the vDSO read (`LoopClock.monotonicNanoseconds()`): no
/// existential, no closure, no lock on the hot path.
package enum LoopTimeSource: Sendable {
  case system
  case manual(VirtualClock)
}

extension LoopShared {
  /// The loop's time in nanoseconds: CLOCK_MONOTONIC, or the virtual clock's. Any thread.
  @inline(__always)
  var nowNanoseconds: Int64 {
    switch timeSource {
    case .system: return LoopClock.monotonicNanoseconds()
    case .manual(let clock): return clock.nowNanoseconds
    }
  }
}

/// The virtual clock of a manual-time loop, and the meeting point of the test that moves it and
/// the loop thread that follows it: a pure state machine (`VirtualClockState`) under a lock;
/// continuations are resumed after the lock is released.
///
/// Time moves in the loop's sleep step (step 7 of a pass), never in the middle of a pass: when the
/// loop would sleep, it asks `loopWouldSleep(nextWake:)`, which either jumps the time to the
/// loop's next wake-up (a timer or the run's time limit) — when the test granted time up to there
/// (`advance(to:)`) or asked for auto-advance — and the loop polls instead of sleeping, as if it
/// had slept until then; or, when nothing is due within the granted time, moves the time to the
/// granted point, reports the loop idle (resuming the tests waiting for that) and lets it sleep,
/// until another thread sends it work or the test grants more time.
package final class VirtualClock: @unchecked Sendable {  // Safety: proof below
  // Safety: `state` is only touched with `lock` held; continuations are resumed outside it.
  private let lock = PthreadLock.make()
  private var state: VirtualClockState<CheckedContinuation<Void, Never>>

  /// A clock that starts at `origin` nanoseconds (greater than 1: the loop uses 1 for "already
  /// passed").
  package init(origin: Int64, autoAdvances: Bool) {
    precondition(origin > 1, "AsyncRunLoop: a virtual clock starts after 1 ns")
    state = VirtualClockState(now: origin, autoAdvances: autoAdvances)
  }

  /// The virtual time. Any thread.
  package var nowNanoseconds: Int64 { lock.withLock { state.now } }

  /// Whether the loop jumps to its next deadline when it has nothing else to do. Any thread.
  package var autoAdvances: Bool {
    get { lock.withLock { state.autoAdvances } }
    set { lock.withLock { state.autoAdvances = newValue } }
  }

  /// Grants the loop time up to `deadline` and suspends the caller until the loop has done
  /// everything due by then and is idle (at once if the loop has ended). The caller then wakes the
  /// loop (see `VirtualTimeLoop`): this only records the request, to be woken after it.
  package func waitForIdle(grantingUpTo deadline: Int64, wake: @Sendable () -> Void) async {
    await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
      let accepted = lock.withLock { state.requestIdle(grantingUpTo: deadline, continuation) }
      if accepted { wake() } else { continuation.resume() }
    }
  }

  /// Loop thread, where a real loop arms its timerfd: the loop's next wake-up, the earliest of its
  /// timers (delayed by at most their tolerance) and its run's time limit (nil: none).
  func loopWillWake(at deadline: Int64?) {
    lock.withLock { state.nextWake = deadline }
  }

  /// Loop thread, step 7, when the loop has decided to sleep; called with the inbox lock held, so
  /// that nothing another thread sends can slip in between the inbox's "nothing waits" and a jump
  /// of the time (see `LoopCore.waitAndHandleReadiness`). Returns whether the loop may really
  /// sleep — false when the time jumped (the pass polls, then fires what came due) or a waiter
  /// was resumed (its continuation may send work here) — and the waiters to resume, which the
  /// caller resumes once it released the inbox lock (a resumed task may enqueue on the loop).
  func loopWouldSleep() -> (sleeps: Bool, idle: [CheckedContinuation<Void, Never>]) {
    lock.withLock { state.loopWouldSleep() }
  }

  /// `delay` rounded up to whole milliseconds (never shorter; saturates). Pure.
  static func roundedUpToMilliseconds(_ delay: Duration) -> Duration {
    let nanoseconds = delay.saturatedNanoseconds
    let remainder = nanoseconds % 1_000_000
    guard remainder > 0 else { return delay }
    return .nanoseconds(nanoseconds.addingSaturating(1_000_000 - remainder))
  }

  /// Loop thread: the loop is shutting down; nobody waits for it to be idle from now on.
  func loopEnded() {
    let idle = lock.withLock { state.loopEnded() }
    for continuation in idle { continuation.resume() }
  }
}

/// The virtual clock's state: a pure value, generic over the waiting test's handle, so it is
/// unit-tested without threads.
struct VirtualClockState<Waiter> {
  /// The virtual time, in nanoseconds. Never goes back.
  private(set) var now: Int64
  /// The test granted time up to here; the loop moves `now` toward it as it runs.
  private(set) var granted: Int64
  /// Tokio's rule: jump to the next deadline whenever the loop has nothing else to do.
  var autoAdvances: Bool
  /// The loop's next wake-up, as it would arm its timerfd (nil: none).
  var nextWake: Int64?
  /// Tests waiting for the loop to be idle at `granted`.
  private var idleWaiters: [Waiter] = []
  /// The loop ended: requests are answered at once.
  private var ended = false

  init(now: Int64, autoAdvances: Bool) {
    self.now = now
    self.granted = now
    self.autoAdvances = autoAdvances
  }

  /// A test grants time up to `deadline` (an earlier one grants nothing: time never goes back) and
  /// waits for idle. False when the loop ended (resume the caller at once).
  mutating func requestIdle(grantingUpTo deadline: Int64, _ waiter: Waiter) -> Bool {
    guard !ended else { return false }  // ended: nothing will run; the caller resumes at once
    granted = max(granted, deadline)  // time only moves forward
    idleWaiters.append(waiter)
    return true
  }

  /// The loop would sleep (see `VirtualClock.loopWouldSleep`). Returns whether it sleeps, and the
  /// waiters to resume.
  mutating func loopWouldSleep() -> (sleeps: Bool, idle: [Waiter]) {
    if let nextWake, nextWake <= now { return (false, []) }  // due already: poll, fire it
    if let nextWake, nextWake <= granted || autoAdvances {
      now = nextWake  // the "sleep" until the next wake-up; the pass fires what it woke for
      granted = max(granted, now)
      return (false, [])
    }
    now = max(now, granted)  // nothing due within the granted time: all of it passes
    guard !idleWaiters.isEmpty else { return (true, []) }  // idle, nobody asked: sleep
    defer { idleWaiters.removeAll() }
    return (false, idleWaiters)  // idle: release them; look again before sleeping
  }

  /// The loop is shutting down: releases every waiter, and later requests resume at once.
  mutating func loopEnded() -> [Waiter] {
    ended = true
    defer { idleWaiters.removeAll() }
    return idleWaiters
  }
}

extension RunLoopThread {
  /// A loop on a thread of its own whose time is `clock`'s (see `AsyncRunLoopTesting`'s
  /// `VirtualTimeLoop`). Any thread.
  package convenience init(name: String, virtualClock: VirtualClock) throws(SystemCallError) {
    try self.init(name: name, ownsThread: true, isMainLoop: false, timeSource: .manual(virtualClock))
    try startThread(pinnedTo: nil)
  }

  /// The loop's current time: the system's monotonic clock, or a virtual loop's clock. Any thread.
  var clockNow: LoopClock.Instant { LoopClock.Instant(nanoseconds: shared.nowNanoseconds) }
}
