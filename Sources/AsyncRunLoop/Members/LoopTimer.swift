/// Why a timer could not be created.
public enum LoopTimerError: Error, Equatable, CustomStringConvertible {
  /// An interval or delay that is NaN or infinite.
  case invalidInterval(Double)
  /// A tolerance that is NaN, infinite or negative.
  case invalidTolerance(Double)

  public var description: String {
    switch self {
    case .invalidInterval(let value):
      return "AsyncRunLoop: a timer interval must be a finite number of seconds, not \(value)"
    case .invalidTolerance(let value):
      return "AsyncRunLoop: a timer tolerance must be finite and not negative, not \(value)"
    }
  }
}

/// A timer that fires on its loop's thread (SPEC §4).
///
/// - One-shot or repeating. A repeating timer that missed fire times (the loop was busy, or ran
///   in another mode) fires once and moves to the next future multiple of its interval: it
///   stays on its original grid and never bursts to catch up.
/// - It never fires early. With a tolerance the loop may fire it up to that much late, so that
///   nearby timers share one wake-up. As in CFRunLoop, a repeating timer's tolerance is capped at
///   half its interval (a 10 ms timer asked for 1 s of tolerance gets 5 ms): a larger one would let
///   the loop skip whole periods. `tolerance` reports the capped value.
/// - It fires only while its loop runs in one of the timer's modes.
/// - Bad input has defined answers: a delay in the past (or negative) fires once as soon as
///   possible; a huge delay saturates (no overflow, no spin); a negative repeat interval makes a
///   one-shot timer; a zero repeat interval fires once per loop pass (the loop still sleeps for
///   nothing else and `stop()` from the handler works); the `seconds:` initializer rejects NaN and
///   infinities with `LoopTimerError`.
/// - `invalidate()` may be called from any thread: no callout starts after it returns.
public final class LoopTimer: ModeMember, @unchecked Sendable {  // Safety: proof below
  // Safety: `intervalNanoseconds`, `toleranceNanoseconds` are immutable. `handler`, `fireDateNs`,
  // `scheduledLoop`, `onInvalidate`, `isFiring` and `firingWaiters` are only touched with `lock`
  // held. `memberships` and `generation` are only
  // touched on the thread of the loop the timer is scheduled on (asserted by `RunLoopThread`).

  /// Nanoseconds between fires; nil for a one-shot timer. Never negative.
  let intervalNanoseconds: Int64?
  /// How late the loop may fire the timer to coalesce wake-ups. Never negative.
  let toleranceNanoseconds: Int64

  private let lock = PthreadLock.make()
  private var handler: (@Sendable (LoopTimer) -> Void)?
  private var fireDateNs: Int64
  private var scheduledLoop: RunLoopThread?
  /// A callout is running (set and cleared by the loop thread in `fire`).
  private var isFiring = false
  /// Threads in `invalidate` waiting for the running callout to end.
  private var firingWaiters: [BlockingGate] = []
  /// Internal: called once when the timer is invalidated before a one-shot fire completed it
  /// (used by sleeps and async sequences to end their consumer).
  private var onInvalidate: (@Sendable () -> Void)?

  /// Loop thread: the modes holding the timer.
  var memberships: [ModeContents] = []
  /// Loop thread: bumped whenever the fire date or the modes change; heap entries from older
  /// generations are stale.
  var generation: UInt64 = 0

  /// Creates a timer that first fires at `fireDate`. Add it to a loop to start it.
  /// - Parameters:
  ///   - fireDate: When to fire first. A date in the past fires as soon as possible.
  ///   - interval: The repeat interval; nil (or negative) for a one-shot timer.
  ///   - tolerance: How late the loop may fire it (negative counts as zero; for a repeating
  ///     timer, at most half the interval).
  ///   - handler: Runs on the loop thread at each fire.
  public convenience init(
    fireAt fireDate: LoopClock.Instant, repeatingEvery interval: Duration? = nil,
    tolerance: Duration = .zero, handler: @escaping @Sendable (LoopTimer) -> Void
  ) {
    self.init(fireAt: fireDate, repeatingEvery: interval, tolerance: tolerance, handler: handler, onInvalidate: nil)
  }

  init(
    fireAt fireDate: LoopClock.Instant, repeatingEvery interval: Duration? = nil,
    tolerance: Duration = .zero, handler: @escaping @Sendable (LoopTimer) -> Void,
    onInvalidate: (@Sendable () -> Void)?
  ) {
    self.onInvalidate = onInvalidate
    let intervalNs = interval?.saturatedNanoseconds
    self.intervalNanoseconds = intervalNs.flatMap { $0 < 0 ? nil : $0 }
    self.toleranceNanoseconds = Self.effectiveTolerance(
      tolerance.saturatedNanoseconds, interval: intervalNanoseconds)
    self.fireDateNs = fireDate.nanoseconds
    self.handler = handler
  }

  /// Creates a timer that first fires `delay` from now.
  public convenience init(
    after delay: Duration, repeatingEvery interval: Duration? = nil, tolerance: Duration = .zero,
    handler: @escaping @Sendable (LoopTimer) -> Void
  ) {
    self.init(fireAt: .now.advanced(by: delay), repeatingEvery: interval, tolerance: tolerance, handler: handler)
  }

  /// Creates a timer from seconds given as floating-point numbers (the CFRunLoop/NSTimer style).
  ///
  /// Finite values of any size are accepted and saturate like huge `Duration`s do: a delay or
  /// tolerance beyond about 292 years means "never" (or "as soon as possible" for a hugely
  /// negative delay), and a hugely negative interval makes a one-shot timer.
  /// - Throws: `LoopTimerError` for a NaN or infinite delay or interval, or a bad tolerance.
  public convenience init(
    seconds delay: Double, repeatingEverySeconds interval: Double? = nil, toleranceSeconds tolerance: Double = 0,
    handler: @escaping @Sendable (LoopTimer) -> Void
  ) throws(LoopTimerError) {
    guard delay.isFinite else { throw .invalidInterval(delay) }
    if let interval, !interval.isFinite { throw .invalidInterval(interval) }
    guard tolerance.isFinite, tolerance >= 0 else { throw .invalidTolerance(tolerance) }
    self.init(
      after: Self.saturatingDuration(seconds: delay), repeatingEvery: interval.map(Self.saturatingDuration(seconds:)),
      tolerance: Self.saturatingDuration(seconds: tolerance), handler: handler)
  }

  /// `seconds` as a `Duration`, clamped first: `Duration.seconds(_:)` traps beyond about ±1.7e20 s,
  /// while a timer saturates far sooner (its times are `Int64` nanoseconds, about ±9.2e9 s), so
  /// ±1e12 s keeps every answer the same and never traps. `seconds` must be finite. Pure.
  static func saturatingDuration(seconds: Double) -> Duration {
    let limit = 1e12
    return .seconds(min(max(seconds, -limit), limit))
  }

  /// The repeat interval, or nil for a one-shot timer.
  public var interval: Duration? { intervalNanoseconds.map { .nanoseconds($0) } }
  /// How late the loop may fire the timer: the tolerance it was created with, never negative,
  /// and for a repeating timer at most half its interval (CFRunLoop's rule).
  public var tolerance: Duration { .nanoseconds(toleranceNanoseconds) }

  /// The tolerance a timer uses: `requested` clamped to zero or more, and for a repeating timer
  /// (`interval` non-nil) to at most half the interval, so that a 10 ms timer with 1 s of
  /// tolerance still fires about every 10 ms instead of once a second. Pure.
  static func effectiveTolerance(_ requested: Int64, interval: Int64?) -> Int64 {
    let tolerance = max(0, requested)
    guard let interval else { return tolerance }
    return min(tolerance, interval / 2)
  }

  /// The next time the timer fires. Any thread.
  public var fireDate: LoopClock.Instant {
    LoopClock.Instant(nanoseconds: lock.withLock { fireDateNs })
  }

  /// Moves the next fire date (a repeating timer keeps its interval from there). Any thread: on
  /// the loop thread it takes effect at once, elsewhere on the loop's next pass.
  public func setFireDate(_ date: LoopClock.Instant) {
    let loop = lock.withLock {
      fireDateNs = date.nanoseconds
      return scheduledLoop
    }
    loop?.rescheduleTimer(self)
  }

  /// Stops the timer and releases its handler, and the loop drops it from its modes. Any
  /// thread; idempotent.
  ///
  /// - Parameter waitForRunningCallout: When true (the default) and a callout of this timer is
  ///   running on the loop thread while another thread invalidates it, the call waits for that
  ///   callout to end, so no callout can begin after it returns. Pass false where waiting could
  ///   deadlock: inside a task cancellation handler when the callout resumes that same task (the
  ///   runtime holds the task's lock while the handler runs), or on a thread the callout waits
  ///   for. Then only callouts the loop had not begun to dispatch are prevented. On the loop's
  ///   own thread (a callout invalidating its timer) it never waits.
  public func invalidate(waitForRunningCallout: Bool = true) {
    let (loop, released, invalidated, waitFor): (RunLoopThread?, Any?, (@Sendable () -> Void)?, BlockingGate?) =
      lock.withLock {
        defer {
          handler = nil
          scheduledLoop = nil
          onInvalidate = nil
        }
        var gate: BlockingGate?
        if waitForRunningCallout, isFiring, let loop = scheduledLoop, !loop.isOnLoopThread {
          gate = BlockingGate()
          firingWaiters.append(gate!)
        }
        return (scheduledLoop, handler, onInvalidate, gate)
      }
    withExtendedLifetime(released) {}
    waitFor?.wait()
    invalidated?()
    loop?.detachEverywhere(self)
  }

  /// False once invalidated (a one-shot timer invalidates itself after firing). Any thread.
  public var isValid: Bool { lock.withLock { handler != nil } }

  // MARK: Loop-facing (loop thread)

  /// Records the loop; false when the timer was invalidated. Loop thread.
  func attach(to loop: RunLoopThread) -> Bool {
    lock.withLock {
      guard handler != nil else { return false }
      precondition(
        scheduledLoop == nil || scheduledLoop === loop, "AsyncRunLoop: a LoopTimer is scheduled on one loop at a time")
      scheduledLoop = loop
      return true
    }
  }

  /// The current fire date in nanoseconds. Loop thread (any thread is safe).
  var fireDateNanoseconds: Int64 { lock.withLock { fireDateNs } }

  /// Runs the handler if the timer is still valid. Loop thread. While it runs, an `invalidate()`
  /// from another thread waits for it to end (see `invalidate`).
  func fire() {
    lock.lock()
    guard let current = handler else {
      lock.unlock()
      return
    }
    isFiring = true
    lock.unlock()
    current(self)
    lock.lock()
    isFiring = false
    let waiters = firingWaiters
    firingWaiters.removeAll()
    lock.unlock()
    for gate in waiters { gate.open() }
  }

  /// After a fire: moves a repeating timer to its next date on its grid. Loop thread.
  /// - Returns: false for a one-shot timer (the loop invalidates it).
  func advanceAfterFire(firedAt fireDate: Int64, now: Int64) -> Bool {
    guard let interval = intervalNanoseconds else { return false }
    let next = Self.nextFireDate(after: fireDate, interval: interval, now: now)
    lock.withLock { fireDateNs = next }
    return true
  }

  /// The first point of the grid `fireDate + k·interval` (k ≥ 1) that lies after `now`: missed
  /// fires collapse into the one just made. A zero interval gives `now` (once per loop pass).
  /// Saturates instead of overflowing. Pure.
  static func nextFireDate(after fireDate: Int64, interval: Int64, now: Int64) -> Int64 {
    guard interval > 0 else { return max(fireDate, now) }
    let next = fireDate.addingSaturating(interval)
    guard next <= now else { return next }
    // now > fireDate here, so their distance fits in UInt64 even when it overflows Int64 (a fire
    // date saturated to Int64.min by a huge negative delay): the next grid point is `interval`
    // after the last one at or before `now`.
    let sinceGridPoint = Int64(UInt64(bitPattern: now &- fireDate) % UInt64(interval))
    return now.addingSaturating(interval - sinceGridPoint)
  }

  func insert(into contents: ModeContents) {
    contents.timerCount += 1  // ModeTable never inserts a member twice into one mode
  }

  func remove(from contents: ModeContents) {
    contents.timerCount -= 1
  }
}
