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
/// the loop's shutdown (ticks already due are delivered first), and after the one tick of a
/// one-shot timer.
public final class TimerSequence: AsyncSequence, StoppableConsumption, @unchecked Sendable {  // Safety: proof below
  public typealias Element = LoopTick
  public typealias Failure = Never
  // Safety: `loop`, `timer` and `lock` are immutable after init. `machine` is only touched with
  // `lock` held; continuations are resumed and the timer rescheduled after the lock is released.

  /// The loop whose timer this is.
  public let loop: RunLoopThread
  /// The underlying timer (its handler turns fires into ticks).
  let timer: LoopTimer
  private let lock = PthreadLock.make()
  private var machine: TimerSequenceStateMachine<UnsafeContinuation<Void, Never>>

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
      onInvalidate: { owner.value?.timerInvalidated() })
    owner.value = self
  }

  /// Dropping the sequence (and its iterator) invalidates the timer.
  deinit {
    timer.invalidate(waitForRunningCallout: false)
  }

  /// Ends the sequence after the ticks already due are delivered; the timer is invalidated and
  /// released. Any thread; idempotent.
  public func invalidate() {
    timer.invalidate(waitForRunningCallout: false)  // its onInvalidate ends the machine
  }

  /// The timer's handler (loop thread): due instants become ticks; the timer moves to the next
  /// due instant the policy gives.
  private func timerFired(_ timer: LoopTimer) {
    let now = LoopClock.monotonicNanoseconds()
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

  /// The timer was invalidated (any thread).
  private func timerInvalidated() {
    lock.lock()
    let action = machine.timerInvalidated()
    lock.unlock()
    switch action {
    case .none: break
    case .end(let consumer): consumer?.resume()
    }
  }

  /// The consumer stopped (cancelled, or dropped its iterator). Any thread; idempotent.
  @usableFromInline
  func stopConsuming() {
    lock.lock()
    let action = machine.stopConsuming()
    lock.unlock()
    switch action {
    case .none:
      break
    case .stop(let consumer, let invalidateTimer):
      consumer?.resume()
      if invalidateTimer { timer.invalidate(waitForRunningCallout: false) }
    }
  }

  /// The consumer's task: the next tick, suspending until the timer fires.
  fileprivate func next(isolation actor: isolated (any Actor)?) async -> LoopTick? {
    while true {
      if Task.isCancelled {
        stopConsuming()
        return nil
      }
      lock.lock()
      let action = machine.take()
      lock.unlock()
      switch action {
      case .tick(let tick):
        return tick
      case .end:
        return nil
      case .suspend:
        await waitForConsumerWake(
          isolation: actor,
          register: { continuation in
            lock.lock()
            defer { lock.unlock() }
            switch machine.suspendConsumer(continuation) {
            case .suspended: return true
            case .resume: return false
            }
          },
          onCancel: { self.stopConsuming() })
      }
    }
  }

  /// The single consumer's iterator. Not `Sendable`: iterate from one task.
  public struct Iterator: AsyncIteratorProtocol {
    private let lifetime: ConsumerLifetime<TimerSequence>

    fileprivate init(_ sequence: TimerSequence) { lifetime = ConsumerLifetime(sequence) }

    /// The next tick, or nil once the sequence has ended or the task was cancelled.
    public mutating func next(isolation actor: isolated (any Actor)? = #isolation) async -> LoopTick? {
      await lifetime.storage.next(isolation: actor)
    }

    public mutating func next() async -> LoopTick? {
      await next(isolation: nil)
    }
  }

  /// Makes the iterator of the sequence's single consumer. Traps when called a second time.
  public func makeAsyncIterator() -> Iterator {
    let first = lock.withLock { machine.makeIterator() }
    precondition(first, singleConsumerViolation("TimerSequence"))
    return Iterator(self)
  }
}

/// The cross-thread state of a `TimerSequence`: a pure state machine held under its lock, generic
/// over the consumer's waiter handle. The tick arithmetic lives in `TickSchedule`; this adds who
/// waits and how the sequence ends.
struct TimerSequenceStateMachine<Consumer> {
  private enum State {
    /// The timer runs; the consumer is not suspended.
    case running
    /// The timer runs; the consumer waits for a tick.
    case consumerWaiting(Consumer)
    /// The timer was invalidated: ticks already due are delivered, then the sequence ends.
    case ended
    /// The consumer stopped.
    case cancelled
  }

  private var state = State.running
  private(set) var schedule: TickSchedule
  private var iteratorMade = false

  init(schedule: TickSchedule) { self.schedule = schedule }

  /// `makeAsyncIterator()`: false when an iterator was made before.
  mutating func makeIterator() -> Bool {
    if iteratorMade { return false }  // second consumer: the caller traps
    iteratorMade = true
    return true
  }

  enum FireAction {
    /// Ended or stopped: nothing to do.
    case ignore
    /// Reschedule the timer at `nextFireDate` (nil: no more ticks) and resume the consumer if
    /// it waited.
    case fired(nextFireDate: Int64?, resume: Consumer?)
  }

  /// The timer fired at `now` (loop thread).
  mutating func fire(now: Int64) -> FireAction {
    switch state {
    case .running:
      return .fired(nextFireDate: schedule.fire(now: now), resume: nil)  // the tick waits for the consumer
    case .consumerWaiting(let consumer):
      let next = schedule.fire(now: now)
      state = .running  // hand the tick over
      return .fired(nextFireDate: next, resume: consumer)
    case .ended, .cancelled:
      return .ignore  // a callout that raced the end
    }
  }

  enum TakeAction {
    case tick(LoopTick)
    /// No tick is due yet: suspend.
    case suspend
    /// The sequence has ended.
    case end
  }

  /// The consumer asks for the next tick.
  mutating func take() -> TakeAction {
    switch state {
    case .running:
      guard let tick = schedule.take() else { return .suspend }  // wait for the timer
      return .tick(tick)
    case .ended:
      guard let tick = schedule.take() else { return .end }  // drained: end
      return .tick(tick)
    case .cancelled:
      return .end  // stopped
    case .consumerWaiting:
      preconditionFailure(concurrentNextViolation("TimerSequence"))
    }
  }

  enum SuspendAction {
    case suspended
    /// Something changed since `take`: resume at once.
    case resume
  }

  /// The consumer found no tick and is about to wait.
  mutating func suspendConsumer(_ consumer: Consumer) -> SuspendAction {
    switch state {
    case .running:
      guard !schedule.hasReadyTick else { return .resume }  // fired meanwhile
      state = .consumerWaiting(consumer)  // wait for the timer
      return .suspended
    case .ended, .cancelled:
      return .resume  // ended meanwhile
    case .consumerWaiting:
      preconditionFailure(concurrentNextViolation("TimerSequence"))
    }
  }

  enum StopAction {
    case none
    /// Resume the consumer if it waits; invalidate the timer when asked.
    case stop(consumer: Consumer?, invalidateTimer: Bool)
  }

  /// The consumer stopped (cancelled, or dropped its iterator).
  mutating func stopConsuming() -> StopAction {
    switch state {
    case .running:
      state = .cancelled  // release the timer
      return .stop(consumer: nil, invalidateTimer: true)
    case .consumerWaiting(let consumer):
      state = .cancelled  // end the wait and release the timer
      return .stop(consumer: consumer, invalidateTimer: true)
    case .ended:
      state = .cancelled  // the timer is gone already
      return .stop(consumer: nil, invalidateTimer: false)
    case .cancelled:
      return .none  // twice: no-op
    }
  }

  enum InvalidatedAction {
    case none
    /// Resume the consumer if it waits: it drains and ends.
    case end(consumer: Consumer?)
  }

  /// The timer was invalidated (one-shot done, `invalidate()`, the loop's shutdown).
  mutating func timerInvalidated() -> InvalidatedAction {
    switch state {
    case .running:
      state = .ended  // deliver what is due, then end
      return .end(consumer: nil)
    case .consumerWaiting(let consumer):
      state = .ended  // nothing is due (it waited): wake it to end
      return .end(consumer: consumer)
    case .ended, .cancelled:
      return .none  // ending already
    }
  }
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
  ///   - tolerance: How late the loop may fire a tick so that timers share wake-ups.
  ///   - missedTicks: What to do about ticks missed because the loop or the consumer was late.
  ///   - modes: The modes the timer fires in (`.common` by default).
  public func timer(
    every interval: Duration, tolerance: Duration = .zero, missedTicks: MissedTickPolicy = .skip,
    modes: [RunLoopMode] = [.common]
  ) -> TimerSequence {
    precondition(interval > .zero, "AsyncRunLoop: timer(every:) needs a positive interval, not \(interval)")
    return makeTimerSequence(
      firstDue: .now.advanced(by: interval), interval: interval, tolerance: tolerance, missedTicks: missedTicks,
      modes: modes)
  }

  /// A one-shot timer: one tick `delay` from now (as soon as possible for a delay already over),
  /// then the sequence ends. Any thread.
  public func timer(after delay: Duration, tolerance: Duration = .zero, modes: [RunLoopMode] = [.common])
    -> TimerSequence
  {
    makeTimerSequence(
      firstDue: .now.advanced(by: delay), interval: nil, tolerance: tolerance, missedTicks: .skip, modes: modes)
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
    precondition(!modes.isEmpty, "AsyncRunLoop: a timer sequence needs at least one mode")
    let sequence = TimerSequence(
      loop: self, firstDue: firstDue, interval: interval, tolerance: tolerance, missedTicks: missedTicks)
    for mode in modes { add(sequence.timer, to: mode) }
    if isShutDown { sequence.invalidate() }  // it may never reach the loop: end it now
    return sequence
  }
}
