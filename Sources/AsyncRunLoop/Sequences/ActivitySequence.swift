/// One observed loop activity, with the time the loop reached it.
public struct LoopActivityEvent: Sendable, Hashable, CustomStringConvertible {
  /// The activity (exactly one of `LoopActivity`'s members).
  public var activity: LoopActivity
  /// When the loop's thread reached it.
  public var instant: LoopClock.Instant

  public init(activity: LoopActivity, instant: LoopClock.Instant) {
    self.activity = activity
    self.instant = instant
  }

  public var description: String { "\(activity)@\(instant.nanoseconds)" }
}

/// A loop's observer activities (SPEC §5), consumed with `for await`, for instrumentation.
///
/// Built on a repeating `LoopObserver` in the given modes: the loop records each activity it
/// reaches (on its thread, with a timestamp) into a bounded buffer, and the consumer takes the
/// buffer in batches. When the consumer falls behind by more than `bufferLimit` events, the oldest
/// are dropped and counted in `droppedCount`: instrumentation never slows the loop down or grows
/// without bound.
///
/// Mind the feedback: a consumer that runs on the observed loop itself makes the loop do work for
/// each batch it handles, and that work produces activities (for instance `beforeWaiting` and
/// `afterWaiting` every time it wakes to resume the consumer). Consume from another executor, or
/// observe activities that such a wake-up does not produce (`entry`, `exit`).
///
/// One consumer (a second `makeAsyncIterator()` traps). It ends when the consuming task is
/// cancelled or drops its iterator (the observer is invalidated), on `invalidate()`, or on the
/// loop's shutdown (events already recorded are delivered first).
public final class ActivitySequence: AsyncSequence, StoppableConsumption, @unchecked Sendable {  // Safety: proof below
  public typealias Element = LoopActivityEvent
  public typealias Failure = Never
  // Safety: `loop`, `observer` and `lock` are immutable after init. `machine` is only touched with
  // `lock` held; continuations are resumed after the lock is released.

  /// The observed loop.
  public let loop: RunLoopThread
  /// The underlying observer.
  let observer: LoopObserver
  private let lock = PthreadLock.make()
  private var machine: ActivitySequenceStateMachine<UnsafeContinuation<Void, Never>>

  init(loop: RunLoopThread, activities: LoopActivity, order: Int, bufferLimit: Int) {
    let owner = WeakOwner<ActivitySequence>()
    self.loop = loop
    self.machine = ActivitySequenceStateMachine(bufferLimit: bufferLimit)
    self.observer = LoopObserver(
      activities: activities, repeats: true, order: order,
      callout: { _, activity in owner.value?.observed(activity) },
      onInvalidate: { owner.value?.observerInvalidated() })
    owner.value = self
  }

  /// Dropping the sequence (and its iterator) invalidates the observer.
  deinit {
    observer.invalidate()
  }

  /// Events dropped so far because the consumer fell behind. Any thread.
  public var droppedCount: Int { lock.withLock { machine.droppedCount } }

  /// Ends the sequence after the events already recorded are delivered; the observer is
  /// invalidated. Any thread; idempotent.
  public func invalidate() {
    observer.invalidate()  // its onInvalidate ends the machine
  }

  /// The observer's callout (loop thread).
  private func observed(_ activity: LoopActivity) {
    let event = LoopActivityEvent(activity: activity, instant: .now)
    lock.lock()
    let action = machine.observed(event)
    lock.unlock()
    switch action {
    case .recorded: break
    case .resumeConsumer(let consumer): consumer.resume()
    }
  }

  /// The observer was invalidated (any thread).
  private func observerInvalidated() {
    lock.lock()
    let action = machine.observerInvalidated()
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
    case .stop(let consumer, let invalidateObserver):
      consumer?.resume()
      if invalidateObserver { observer.invalidate() }
    }
  }

  /// The consumer's batch ran out: takes the next batch, suspending until the loop records one.
  fileprivate func nextBatch(
    _ batch: inout ElementBatch<LoopActivityEvent>, isolation actor: isolated (any Actor)?
  ) async -> LoopActivityEvent? {
    batch.removeAll()
    while true {
      if Task.isCancelled {
        stopConsuming()
        return nil
      }
      lock.lock()
      let action = machine.take(into: &batch)
      lock.unlock()
      switch action {
      case .took:
        return batch.popFirst()
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
    private let lifetime: ConsumerLifetime<ActivitySequence>
    private var batch = ElementBatch<LoopActivityEvent>()

    fileprivate init(_ sequence: ActivitySequence) { lifetime = ConsumerLifetime(sequence) }

    /// The next recorded activity, or nil once the sequence has ended or the task was cancelled.
    public mutating func next(isolation actor: isolated (any Actor)? = #isolation) async -> LoopActivityEvent? {
      if let event = batch.popFirst(), !Task.isCancelled { return event }
      return await lifetime.storage.nextBatch(&batch, isolation: actor)
    }

    public mutating func next() async -> LoopActivityEvent? {
      await next(isolation: nil)
    }
  }

  /// Makes the iterator of the sequence's single consumer. Traps when called a second time.
  public func makeAsyncIterator() -> Iterator {
    let first = lock.withLock { machine.makeIterator() }
    precondition(first, singleConsumerViolation("ActivitySequence"))
    return Iterator(self)
  }
}

/// The cross-thread state of an `ActivitySequence`: a pure state machine held under its lock,
/// generic over the consumer's waiter handle. A bounded buffer that drops its oldest events.
struct ActivitySequenceStateMachine<Consumer> {
  private enum State {
    /// Recording; the consumer is not suspended.
    case open
    /// Recording; the consumer waits for events.
    case consumerWaiting(Consumer)
    /// The observer was invalidated: recorded events are delivered, then the sequence ends.
    case ended
    /// The consumer stopped.
    case cancelled
  }

  private var state = State.open
  private var buffer = ElementBatch<LoopActivityEvent>()
  private let bufferLimit: Int
  /// Events dropped because the buffer was full.
  private(set) var droppedCount = 0
  private var iteratorMade = false

  init(bufferLimit: Int) {
    precondition(bufferLimit >= 1, "AsyncRunLoop: an ActivitySequence needs a buffer limit of at least 1")
    self.bufferLimit = bufferLimit
  }

  /// Events recorded and not yet taken.
  var bufferedCount: Int { buffer.count }

  /// `makeAsyncIterator()`: false when an iterator was made before.
  mutating func makeIterator() -> Bool {
    if iteratorMade { return false }  // second consumer: the caller traps
    iteratorMade = true
    return true
  }

  enum ObservedAction {
    case recorded
    /// Resume the waiting consumer.
    case resumeConsumer(Consumer)
  }

  /// The loop reached an activity (loop thread).
  mutating func observed(_ event: LoopActivityEvent) -> ObservedAction {
    switch state {
    case .open:
      record(event)  // the consumer takes it when it asks
      return .recorded
    case .consumerWaiting(let consumer):
      record(event)
      state = .open  // hand over
      return .resumeConsumer(consumer)
    case .ended, .cancelled:
      return .recorded  // a callout that raced the end: ignored
    }
  }

  enum TakeAction {
    /// `batch` now holds events.
    case took
    /// Nothing recorded: suspend.
    case suspend
    /// The sequence has ended.
    case end
  }

  /// The consumer's batch ran out (it must have no slots) and it asks for more.
  mutating func take(into batch: inout ElementBatch<LoopActivityEvent>) -> TakeAction {
    switch state {
    case .open:
      guard !buffer.isEmpty else { return .suspend }  // wait for the loop
      _ = batch.moveAll(from: &buffer)  // O(1) swap
      return .took
    case .ended:
      guard !buffer.isEmpty else { return .end }  // drained: end
      _ = batch.moveAll(from: &buffer)
      return .took
    case .cancelled:
      return .end  // stopped
    case .consumerWaiting:
      preconditionFailure(concurrentNextViolation("ActivitySequence"))
    }
  }

  enum SuspendAction {
    case suspended
    /// Something changed since `take`: resume at once.
    case resume
  }

  /// The consumer found nothing and is about to wait.
  mutating func suspendConsumer(_ consumer: Consumer) -> SuspendAction {
    switch state {
    case .open:
      guard buffer.isEmpty else { return .resume }  // recorded meanwhile
      state = .consumerWaiting(consumer)  // wait for the loop
      return .suspended
    case .ended, .cancelled:
      return .resume  // ended meanwhile
    case .consumerWaiting:
      preconditionFailure(concurrentNextViolation("ActivitySequence"))
    }
  }

  enum StopAction {
    case none
    /// Resume the consumer if it waits; invalidate the observer when asked.
    case stop(consumer: Consumer?, invalidateObserver: Bool)
  }

  /// The consumer stopped (cancelled, or dropped its iterator).
  mutating func stopConsuming() -> StopAction {
    defer { buffer = ElementBatch() }
    switch state {
    case .open:
      state = .cancelled  // invalidate the observer
      return .stop(consumer: nil, invalidateObserver: true)
    case .consumerWaiting(let consumer):
      state = .cancelled  // end the wait and invalidate the observer
      return .stop(consumer: consumer, invalidateObserver: true)
    case .ended:
      state = .cancelled  // the observer is gone already
      return .stop(consumer: nil, invalidateObserver: false)
    case .cancelled:
      return .none  // twice: no-op
    }
  }

  enum InvalidatedAction {
    case none
    /// Resume the consumer if it waits: it drains and ends.
    case end(consumer: Consumer?)
  }

  /// The observer was invalidated (`invalidate()`, the loop's shutdown).
  mutating func observerInvalidated() -> InvalidatedAction {
    switch state {
    case .open:
      state = .ended  // deliver what was recorded, then end
      return .end(consumer: nil)
    case .consumerWaiting(let consumer):
      state = .ended  // nothing recorded (it waited): wake it to end
      return .end(consumer: consumer)
    case .ended, .cancelled:
      return .none  // ending already
    }
  }

  /// Appends `event`, dropping the oldest one when the buffer is full.
  private mutating func record(_ event: LoopActivityEvent) {
    if buffer.count >= bufferLimit {
      _ = buffer.popFirst()
      droppedCount += 1
      _ = buffer.compactIfWasteful()  // plain values: nothing to release outside the lock
    }
    buffer.append(event)
  }
}

extension RunLoopThread {
  /// This loop's observer activities, consumed with `for await`. Any thread. See
  /// `ActivitySequence`.
  /// - Parameters:
  ///   - activities: The activities to record (`.all` by default).
  ///   - modes: The modes observed (`.common` by default).
  ///   - order: Among observers of the same activity, lower orders are told first.
  ///   - bufferLimit: The most events kept for a consumer that falls behind (the oldest are
  ///     dropped and counted); at least 1.
  public func activities(
    _ activities: LoopActivity = .all, modes: [RunLoopMode] = [.common], order: Int = 0, bufferLimit: Int = 4096
  ) -> ActivitySequence {
    precondition(!modes.isEmpty, "AsyncRunLoop: an ActivitySequence needs at least one mode")
    let sequence = ActivitySequence(loop: self, activities: activities, order: order, bufferLimit: bufferLimit)
    for mode in modes { add(sequence.observer, to: mode) }
    if isShutDown { sequence.invalidate() }  // it may never reach the loop: end it now
    return sequence
  }
}
