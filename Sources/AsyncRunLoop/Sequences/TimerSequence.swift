/// A loop timer consumed with `for await`: each element is a `LoopTick` carrying the instant it
/// was due, so `LoopClock.Instant.now - tick.scheduled` is its lateness.
///
/// Make one with `loop.timer(every:tolerance:missedTicks:modes:)` (repeating; the first tick is
/// due one interval from the call), `loop.timer(after:)` or `loop.timer(at:)` (one tick, then the
/// sequence ends). The timer is scheduled at once; it fires on the loop thread only while the loop
/// runs in one of its modes, never early, and up to `tolerance` late so that nearby timers share a
/// wake-up. Ticks that come due while the consumer is busy wait for it (folded or run back to back
/// according to the `MissedTickPolicy`).
///
/// One consumer (a second `makeAsyncIterator()` traps). It ends when the consuming task is
/// cancelled or drops its iterator (the timer is invalidated and released), on `invalidate()` or
/// the loop's shutdown (ticks the loop has fired and the consumer has not taken yet are
/// delivered first; a tick whose instant passed while the loop was busy, but that the loop has not
/// fired, is not: as with a `LoopTimer`, no fire happens after the invalidation), and after the
/// one tick of a one-shot timer.
public final class TimerSequence: AsyncSequence, SingleConsumerStorage, @unchecked Sendable {  // Safety: proof below
  public typealias Element = LoopTick
  public typealias Failure = Never
  /// The single consumer's iterator. Not `Sendable`: iterate from one task.
  public typealias Iterator = SingleConsumerIterator<TimerSequence>
  // Safety: `loop`, `timer` and `lock` are immutable after init. `machine` is only touched with
  // `lock` held, here and in `SingleConsumerStorage`'s shared consumer code; continuations are resumed and the timer rescheduled after the lock is released.
  // No dynamic exclusivity checks on `machine`: see `SingleConsumerStorage.machine`.

  /// The loop whose timer this is.
  public let loop: RunLoopThread
  /// The underlying timer (its handler turns fires into ticks).
  let timer: LoopTimer
  @usableFromInline let lock = PthreadLock.make()
  @exclusivity(unchecked) @usableFromInline var machine: TimerSequenceStateMachine<UnsafeContinuation<Void, Never>>

  init(
    loop: RunLoopThread, firstDue: LoopClock.Instant, interval: Duration?, tolerance: Duration,
    missedTicks: MissedTickPolicy
  ) {
    let owner = WeakOwner<TimerSequence>()
    self.loop = loop
    self.machine = TimerSequenceStateMachine(
      schedule: TickSchedule(
        firstDue: firstDue.nanoseconds, interval: interval?.saturatedNanoseconds, policy: missedTicks))
    self.timer = LoopTimer(
      fireAt: firstDue, repeatingEvery: interval, tolerance: tolerance,
      handler: { timer in owner.value?.timerFired(timer) },
      onInvalidate: { owner.value?.memberEnded() })
    owner.value = self
  }

  /// Dropping the sequence (and its iterator) invalidates the timer.
  deinit {
    timer.invalidate()
  }

  /// Ends the sequence after the ticks the loop has already fired are delivered (a tick due but not
  /// fired yet, because the loop is busy, is not); the timer is invalidated and released. Any
  /// thread; idempotent.
  public func invalidate() {
    timer.invalidate()  // its onInvalidate ends the machine
  }

  /// The timer's handler (loop thread): due instants become ticks; the timer moves to the next
  /// due instant the policy gives.
  private func timerFired(_ timer: LoopTimer) {
    let now = loop.shared.nowNanoseconds
    lock.lock()
    let action = machine.fire(now: now)
    lock.unlock()
    switch action {
    case .ignore:
      break
    case .fired(let nextFireDate, let consumer):
      consumer?.resume()
      // A one-shot timer (nil) is invalidated by the loop after this handler, which ends the
      // sequence once its tick is taken.
      if let nextFireDate { timer.setFireDate(LoopClock.Instant(nanoseconds: nextFireDate)) }
    }
  }

  @usableFromInline
  func detachMember() { timer.invalidate() }

  /// Makes the iterator of the sequence's single consumer. Traps when called a second time.
  public func makeAsyncIterator() -> Iterator { makeSingleConsumerIterator() }
}

/// The cross-thread state of a `TimerSequence`: a pure state machine held under its lock, generic
/// over the consumer's waiter handle. The tick arithmetic lives in `TickSchedule`, who waits and
/// how the sequence ends in the shared `ConsumerLifecycle`: the timer's invalidation (one-shot
/// done, `invalidate()`, the loop's shutdown) ends it after the ticks already fired are taken.
@usableFromInline
struct TimerSequenceStateMachine<Consumer>: SingleConsumerStateMachine {
  @usableFromInline var lifecycle = ConsumerLifecycle<Consumer>(sequenceName: "TimerSequence")
  private(set) var schedule: TickSchedule

  init(schedule: TickSchedule) { self.schedule = schedule }

  enum FireAction {
    /// Ended or stopped: nothing to do.
    case ignore
    /// Reschedule the timer at `nextFireDate` (nil: no more ticks) and resume the consumer if
    /// it waited.
    case fired(nextFireDate: Int64?, resume: Consumer?)
  }

  /// The timer fired at `now` (loop thread).
  mutating func fire(now: Int64) -> FireAction {
    guard lifecycle.isAccepting else { return .ignore }  // a callout that raced the end
    let next = schedule.fire(now: now)
    return .fired(nextFireDate: next, resume: lifecycle.delivered(hasElements: hasElements))
  }

  // MARK: SingleConsumerStateMachine

  @usableFromInline
  var hasElements: Bool { schedule.hasReadyTick }

  /// One element: the next ready tick.
  @usableFromInline
  mutating func moveElements(into batch: inout ElementBatch<LoopTick>) {
    if let tick = schedule.take() { batch.append(tick) }
  }

  /// Ticks not taken stay in the schedule, which nobody reads any more.
  @usableFromInline
  mutating func discardAll() {}

  @usableFromInline
  mutating func finishBuffering() {}
}

extension RunLoopThread {
  /// A repeating timer on this loop, consumed with `for await`. Any thread. See `TimerSequence`.
  ///
  /// ```swift
  /// for await tick in loop.timer(every: .milliseconds(16), missedTicks: .skip) {
  ///   let lateness = tick.scheduled.duration(to: .now)
  /// }
  /// ```
  /// - Parameters:
  ///   - interval: The period (positive; traps otherwise). The first tick is due one interval
  ///     from now.
  ///   - tolerance: How late the loop may fire a tick so that timers share wake-ups; at most half
  ///     the interval (see `LoopTimer`).
  ///   - missedTicks: What to do about ticks missed because the loop or the consumer was late.
  ///   - modes: The modes the timer fires in (`.common` by default).
  public func timer(
    every interval: Duration, tolerance: Duration = .zero, missedTicks: MissedTickPolicy = .skip,
    modes: [RunLoopMode] = [.common]
  ) -> TimerSequence {
    precondition(
      interval > .zero, "AsyncRunLoop: timer(every:) on loop '\(name)' needs a positive interval, not \(interval)")
    return makeTimerSequence(
      firstDue: clockNow.advanced(by: interval), interval: interval, tolerance: tolerance, missedTicks: missedTicks,
      modes: modes)
  }

  /// A one-shot timer: one tick `delay` from now (as soon as possible for a delay already over),
  /// then the sequence ends. Any thread.
  public func timer(after delay: Duration, tolerance: Duration = .zero, modes: [RunLoopMode] = [.common])
    -> TimerSequence
  {
    makeTimerSequence(
      firstDue: clockNow.advanced(by: delay), interval: nil, tolerance: tolerance, missedTicks: .skip, modes: modes)
  }

  /// A one-shot timer: one tick at `deadline` (as soon as possible for a deadline already past),
  /// then the sequence ends. Any thread.
  public func timer(at deadline: LoopClock.Instant, tolerance: Duration = .zero, modes: [RunLoopMode] = [.common])
    -> TimerSequence
  {
    makeTimerSequence(firstDue: deadline, interval: nil, tolerance: tolerance, missedTicks: .skip, modes: modes)
  }

  private func makeTimerSequence(
    firstDue: LoopClock.Instant, interval: Duration?, tolerance: Duration, missedTicks: MissedTickPolicy,
    modes: [RunLoopMode]
  ) -> TimerSequence {
    precondition(!modes.isEmpty, "AsyncRunLoop: a timer sequence on loop '\(name)' needs at least one mode in 'modes'")
    let sequence = TimerSequence(
      loop: self, firstDue: firstDue, interval: interval, tolerance: tolerance, missedTicks: missedTicks)
    for mode in modes { add(sequence.timer, to: mode) }
    adoptSequence(sequence) { sequence.invalidate() }
    return sequence
  }
}
