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

/// A timer that fires on its loop's thread.
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
/// - `invalidate()` may be called from any thread and never blocks: no callout starts after it
///   returns. To also wait for a callout that is running at that moment, use
///   `invalidateAndWait()`, which refuses (throws) instead of deadlocking.
public final class LoopTimer: LoopMember, @unchecked Sendable {  // Safety: proof below
  // Safety: `intervalNanoseconds`, `toleranceNanoseconds` are immutable. `state` (binding,
  // handler), `fireDateNs`, `delayFromAdd`, the fire-date versions, `firingLoop`, `deferredLoops` and
  // `firingWaiters` are only touched with `lock` held. The loop-thread side (heap entries) lives in the loop's `MemberRecord`.

  static var kindName: String { "LoopTimer" }

  /// Nanoseconds between fires; nil for a one-shot timer. Never negative.
  let intervalNanoseconds: Int64?
  /// How late the loop may fire the timer to coalesce wake-ups. Never negative.
  let toleranceNanoseconds: Int64
  /// A name for diagnostics: stall reports name the member by it (see `StallReport.label`).
  public let label: String?

  private let lock = PthreadLock.make()
  // No dynamic exclusivity checks (a thread-local lookup each, on every fire): these are only
  // touched under `lock`, and no access spans a callout.
  @exclusivity(unchecked) private var state: CalloutMemberState<Handler>
  /// The handler, in a concrete struct (see `CalloutMemberState`).
  private struct Handler { let run: @Sendable (LoopTimer) -> Void }
  @exclusivity(unchecked) private var fireDateNs: Int64
  /// The loop whose thread runs a callout of this timer now (set and cleared by that thread).
  /// Callouts never overlap, so one is enough (see `fire`).
  @exclusivity(unchecked) private var firingLoop: LoopShared?
  /// Loops that found the timer due while its callout ran elsewhere (another loop it was moved
  /// to from the callout): told to re-time it when the callout returns.
  @exclusivity(unchecked) private var deferredLoops: [LoopShared] = []
  /// Bumped by every `setFireDate`; `versionAtFire` is its value when the running callout began.
  @exclusivity(unchecked) private var fireDateVersion: UInt64 = 0
  @exclusivity(unchecked) private var versionAtFire: UInt64 = 0
  /// `init(after:)`'s delay, until a virtual-time loop resolves it against its own clock when the
  /// timer first joins it (`resolveDelay(now:)`); a system loop's time is the creator's.
  @exclusivity(unchecked) private var delayFromAdd: Int64?
  /// Threads in `invalidateAndWait` waiting for the running callout to end.
  @exclusivity(unchecked) private var firingWaiters: [BlockingGate] = []
  /// The record a reschedule was sent for and not applied yet: the loop reads the date when it
  /// applies it, so another `setFireDate` meanwhile sends nothing (a timer reset on every packet,
  /// or a flood of them, keeps one change in the inbox, not one per call).
  @exclusivity(unchecked) private var pendingReschedule: MemberRecord?

  /// Creates a timer that first fires at `fireDate`. Add it to a loop to start it.
  /// - Parameters:
  ///   - fireDate: When to fire first. A date in the past fires as soon as possible.
  ///   - interval: The repeat interval; nil (or negative) for a one-shot timer.
  ///   - tolerance: How late the loop may fire it (negative counts as zero; for a repeating
  ///     timer, at most half the interval).
  ///   - label: A name for diagnostics (stall reports).
  ///   - handler: Runs on the loop thread at each fire.
  public convenience init(
    fireAt fireDate: LoopClock.Instant, repeatingEvery interval: Duration? = nil,
    tolerance: Duration = .zero, label: String? = nil, handler: @escaping @Sendable (LoopTimer) -> Void
  ) {
    self.init(
      fireAt: fireDate, repeatingEvery: interval, tolerance: tolerance, label: label, handler: handler,
      onInvalidate: nil)
  }

  init(
    fireAt fireDate: LoopClock.Instant, repeatingEvery interval: Duration? = nil,
    tolerance: Duration = .zero, label: String? = nil, handler: @escaping @Sendable (LoopTimer) -> Void,
    onInvalidate: (@Sendable () -> Void)?
  ) {
    let intervalNs = interval?.saturatedNanoseconds
    self.intervalNanoseconds = intervalNs.flatMap { $0 < 0 ? nil : $0 }
    self.toleranceNanoseconds = Self.effectiveTolerance(
      tolerance.saturatedNanoseconds, interval: intervalNanoseconds)
    self.fireDateNs = fireDate.nanoseconds
    self.label = label
    self.state = CalloutMemberState(callout: Handler(run: handler), onInvalidate: onInvalidate)
  }

  /// Creates a timer that first fires `delay` from now. (On a virtual-time loop, from that loop's
  /// time when the timer is first added to it: see `AsyncRunLoopTesting`.)
  public convenience init(
    after delay: Duration, repeatingEvery interval: Duration? = nil, tolerance: Duration = .zero,
    label: String? = nil, handler: @escaping @Sendable (LoopTimer) -> Void
  ) {
    self.init(
      fireAt: .now.advanced(by: delay), repeatingEvery: interval, tolerance: tolerance, label: label,
      handler: handler)
    lock.withLock { delayFromAdd = delay.saturatedNanoseconds }
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

  func withBinding<Result>(_ body: (inout MemberBinding) -> Result) -> Result {
    lock.lock()
    defer { lock.unlock() }
    return body(&state.binding)
  }

  /// Moves the next fire date (a repeating timer keeps its interval from there). Any thread: on
  /// the loop thread it takes effect at once, elsewhere on the loop's next pass.
  public func setFireDate(_ date: LoopClock.Instant) {
    let target: (loop: LoopShared, record: MemberRecord)? = lock.withLock {
      fireDateNs = date.nanoseconds
      fireDateVersion &+= 1
      guard let target = state.binding.loopAndRecord else { return nil }
      // On the loop thread the call applies at once (after the pending one): it always goes, and
      // leaves nothing pending. (Marking it pending there left the mark behind when the timer's
      // add was still waiting behind a burst: the loop had nothing to re-time yet, so nothing
      // cleared it, and every later call from another thread sent nothing.)
      if target.loop.isOnLoopThread { return target }
      guard pendingReschedule !== target.record else { return nil }
      pendingReschedule = target.record
      return target
    }
    guard let target, !target.loop.rescheduleTimer(target.record) else { return }
    rescheduleApplied(for: target.record)  // refused (the loop has terminated)
  }

  /// Loop thread (or a refused send): the reschedule sent for `record` is applied; the next
  /// `setFireDate` sends another. Called before the loop reads the date, so a date set after
  /// this is either read now or sent again.
  func rescheduleApplied(for record: MemberRecord) {
    lock.withLock { if pendingReschedule === record { pendingReschedule = nil } }
  }

  /// Stops the timer and releases its handler, and the loop drops it from its modes. Any
  /// thread; idempotent; never blocks. No callout starts after it returns; a callout that had
  /// already started on the loop thread may still be running (see `invalidateAndWait()`).
  public func invalidate() {
    lock.withLock { state.invalidate() }.finish(self)
  }

  /// Invalidates the timer and, when one of its callouts is running on its loop's thread, waits
  /// until that callout has returned: after this returns, no callout of the timer runs anywhere.
  /// Any thread.
  ///
  /// - Throws: `RunLoopError.wouldDeadlock` (the timer is invalidated all the same) when waiting
  ///   could never end: called from the timer's own callout (or from a run nested in it), or from
  ///   a loop thread that the timer's callout is itself waiting for, directly or through other
  ///   loops: with this call (two loops' timers invalidating each other) or with
  ///   `RunLoopThread.performAndWait` (the callout waits for a block of the calling loop).
  public func invalidateAndWait() throws(RunLoopError) {
    // One critical section: a callout either started before it (and is waited for) or never does.
    let (invalidation, target, gate): (MemberInvalidation<Handler>, LoopShared?, BlockingGate?) =
      lock.withLock {
        let invalidation = state.invalidate()
        guard let loop = firingLoop else { return (invalidation, nil, nil) }
        if loop.isOnLoopThread { return (invalidation, loop, nil) }  // its callout is on this very stack
        let gate = BlockingGate()
        firingWaiters.append(gate)
        return (invalidation, loop, gate)
      }
    invalidation.finish(self)
    guard let target else { return }  // no callout running: nothing to wait for
    guard let gate else {
      throw RunLoopError.wouldDeadlock(
        "invalidateAndWait() from inside a callout of the same timer on loop '\(target.name)' would wait for itself")
    }
    let waiter = RunLoopThread.currentIfExists?.shared
    if let waiter, !CalloutWaits.begin(waiter: waiter, target: target, until: gate) {
      lock.withLock { firingWaiters.removeAll { $0 === gate } }
      throw RunLoopError.wouldDeadlock(
        """
        invalidateAndWait() on loop '\(waiter.name)' would wait for a callout on loop \
        '\(target.name)' that is itself waiting for loop '\(waiter.name)'
        """)
    }
    gate.wait()
    if let waiter { CalloutWaits.end(waiter: waiter) }
  }

  /// False once invalidated (a one-shot timer invalidates itself after firing). Any thread.
  public var isValid: Bool { lock.withLock { state.binding.isValid } }

  // MARK: Loop-facing (loop thread)

  /// A virtual-time loop, as the timer joins it: a timer made with `init(after:)` whose date was
  /// never set counts its delay from the loop's time `now`. Once only. Any thread.
  func resolveDelay(now: Int64) {
    lock.withLock {
      if let delay = delayFromAdd, fireDateVersion == 0 { fireDateNs = now.addingSaturating(delay) }
      delayFromAdd = nil
    }
  }

  /// The current fire date in nanoseconds. Loop thread (any thread is safe).
  var fireDateNanoseconds: Int64 { lock.withLock { fireDateNs } }

  /// What `fire` did.
  enum FireOutcome {
    /// The handler ran, and left the timer so; with its record on the loop as the callout left it
    /// (taken before a one-shot timer's invalidation: the loop detaches it, also a new record
    /// made by a callout that removed the timer and added it here again).
    case ran(AfterFire, recordHere: MemberRecord?)
    /// Not run: invalidated, no longer on the loop, or moved later (by a `setFireDate` the loop
    /// has not applied yet: it fires at the new date, never early).
    case skipped
    /// Not run: removed from the mode the loop fired it in (or from the loop, or moved to a new
    /// record there), by a call whose removal the loop has not applied yet. The entry goes back
    /// into that mode's heap as it was: the removal on its way takes it out.
    case leftMode
    /// Not run: a callout of the timer is running now, further out on this thread (the callout
    /// removed the timer and added it again, so a nested run found a new record due) or on
    /// another loop (the callout moved it there). Callouts never overlap: the loop keeps the
    /// timer's entries out of its heaps, and the running callout re-times it there when it
    /// returns (this loop's own `fire` does, or a reschedule sent to the other loop).
    case busy
  }

  /// Runs the handler if the timer is still valid and on `loop`, still in the mode the loop holds
  /// `record` in as `claim` says, its fire date is not later than `dueAt` (the date of the heap
  /// entry the loop popped), and no callout of it is running. Loop
  /// thread of `loop`. While it runs, `invalidateAndWait()` from another thread waits for it to
  /// end.
  ///
  /// The callout's end and what it leaves the timer with (`afterFire`: the next date, or a
  /// one-shot timer invalidated) are one critical section: a loop that deferred the timer
  /// meanwhile, and is told only after it, never sees the date that just fired.
  func fire(on loop: LoopShared, dueAt deadline: Int64, record: MemberRecord, in claim: ModeClaim) -> FireOutcome {
    lock.lock()
    guard let current = state.callout(on: loop), fireDateNs <= deadline else {
      lock.unlock()
      return .skipped
    }
    guard state.binding.keeps(record, claim, on: loop) else {
      lock.unlock()
      return .leftMode
    }
    if let running = firingLoop {
      if running !== loop && !deferredLoops.contains(where: { $0 === loop }) { deferredLoops.append(loop) }
      lock.unlock()
      return .busy
    }
    firingLoop = loop
    versionAtFire = fireDateVersion
    let firesFor = fireDateNs
    lock.unlock()
    loop.observed(.timer, label: label, since: firesFor) { current.run(self) }
    // Only a repeating timer needs the time (for its next grid point): a one-shot timer's fire
    // reads no clock here.
    let now = intervalNanoseconds == nil ? 0 : loop.nowNanoseconds
    lock.lock()
    firingLoop = nil
    let recordHere = state.binding.record(on: loop)
    let (after, invalidation) = afterFireLocked(now: now)
    // A one-shot timer is done: this loop detaches its records (`LoopCore.fire`); one the callout
    // moved it to must be told (the invalidation names it).
    let othersDetach = invalidation.map { $0.loop != nil && $0.loop !== loop } ?? false
    guard !firingWaiters.isEmpty || !deferredLoops.isEmpty else {
      lock.unlock()
      invalidation?.finish(self, detaching: othersDetach)
      return .ran(after, recordHere: recordHere)
    }
    let waiters = firingWaiters
    firingWaiters.removeAll()
    // The loops that deferred it and still hold it (a one-shot timer is invalid by now), with its
    // record there.
    let deferred = deferredLoops.compactMap { other in state.binding.record(on: other).map { (other, $0) } }
    deferredLoops.removeAll()
    lock.unlock()
    invalidation?.finish(self, detaching: othersDetach)
    for gate in waiters { gate.open() }
    for (other, record) in deferred { other.rescheduleTimer(record) }
    return .ran(after, recordHere: recordHere)
  }

  /// What a fire left the timer with.
  enum AfterFire {
    /// `setFireDate` was called during the callout (from any thread): the timer keeps that date
    /// (it wins over the grid, and a one-shot timer fires again then), as in CF.
    case rescheduled
    /// A repeating timer moved to the next point of its grid.
    case advanced
    /// A one-shot timer is done: invalidated (the loop detaches the record it holds).
    case finished
  }

  /// After a fire whose handler ran, with `lock` held: moves a repeating timer to its next date
  /// on its grid (from the date it fired for), unless the callout set a fire date; invalidates a
  /// one-shot timer (without a round trip through the inbox: the loop detaches its records). The
  /// caller finishes the returned invalidation after releasing the lock.
  /// (`now` is the loop's time after the callout; 0 for a one-shot timer, which does not read it.)
  private func afterFireLocked(now: Int64) -> (AfterFire, MemberInvalidation<Handler>?) {
    if fireDateVersion != versionAtFire { return (.rescheduled, nil) }
    guard let interval = intervalNanoseconds else { return (.finished, state.invalidate()) }
    fireDateNs = Self.nextFireDate(after: fireDateNs, interval: interval, now: now)
    return (.advanced, nil)
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
}
