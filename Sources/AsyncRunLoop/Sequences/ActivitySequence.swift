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

/// A loop's observer activities, consumed with `for await`, for instrumentation.
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
public final class ActivitySequence: AsyncSequence, SingleConsumerStorage, @unchecked Sendable {  // Safety: proof below
  public typealias Element = LoopActivityEvent
  public typealias Failure = Never
  /// The single consumer's iterator. Not `Sendable`: iterate from one task.
  public typealias Iterator = SingleConsumerIterator<ActivitySequence>
  // Safety: `loop`, `observer` and `lock` are immutable after init. `machine` is only touched with
  // `lock` held, here and in `SingleConsumerStorage`'s shared consumer code; continuations are resumed after the lock is released.
  // No dynamic exclusivity checks on `machine`: see `SingleConsumerStorage.machine`.

  /// The observed loop.
  public let loop: RunLoopThread
  /// The underlying observer.
  let observer: LoopObserver
  @usableFromInline let lock = PthreadLock.make()
  @exclusivity(unchecked) @usableFromInline var machine: ActivitySequenceStateMachine<UnsafeContinuation<Void, Never>>

  init(loop: RunLoopThread, activities: LoopActivity, order: Int, bufferLimit: Int) {
    let owner = WeakOwner<ActivitySequence>()
    self.loop = loop
    self.machine = ActivitySequenceStateMachine(bufferLimit: bufferLimit)
    self.observer = LoopObserver(
      activities: activities, repeats: true, order: order,
      callout: { _, activity in owner.value?.observed(activity) },
      onInvalidate: { owner.value?.memberEnded() })
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
    let consumer = machine.observed(event)
    lock.unlock()
    consumer?.resume()
  }

  @usableFromInline
  func detachMember() { observer.invalidate() }

  /// Makes the iterator of the sequence's single consumer. Traps when called a second time.
  public func makeAsyncIterator() -> Iterator { makeSingleConsumerIterator() }
}

/// The cross-thread state of an `ActivitySequence`: a pure state machine held under its lock,
/// generic over the consumer's waiter handle. A bounded buffer that drops its oldest events; who
/// waits and how it ends is the shared `ConsumerLifecycle` (the observer's invalidation ends it
/// after the events already recorded).
@usableFromInline
struct ActivitySequenceStateMachine<Consumer>: SingleConsumerStateMachine {
  @usableFromInline var lifecycle = ConsumerLifecycle<Consumer>(sequenceName: "ActivitySequence")
  private var buffer = ElementBatch<LoopActivityEvent>()
  private let bufferLimit: Int
  /// Events dropped because the buffer was full.
  private(set) var droppedCount = 0

  init(bufferLimit: Int) {
    precondition(bufferLimit >= 1, "AsyncRunLoop: an ActivitySequence needs a buffer limit of at least 1")
    self.bufferLimit = bufferLimit
  }

  /// Events recorded and not yet taken.
  var bufferedCount: Int { buffer.count }

  /// The loop reached an activity (loop thread).
  /// - Returns: the consumer to resume, if it waited.
  mutating func observed(_ event: LoopActivityEvent) -> Consumer? {
    guard lifecycle.isAccepting else { return nil }  // a callout that raced the end: ignored
    record(event)  // the consumer takes it when it asks
    return lifecycle.delivered(hasElements: hasElements)
  }

  // MARK: SingleConsumerStateMachine

  @usableFromInline
  var hasElements: Bool { !buffer.isEmpty }

  /// Everything recorded, in one batch (an O(1) swap: `batch` has no slots).
  @usableFromInline
  mutating func moveElements(into batch: inout ElementBatch<LoopActivityEvent>) {
    _ = batch.moveAll(from: &buffer)
  }

  /// Plain values: released under the lock, nothing runs.
  @usableFromInline
  mutating func discardAll() { buffer = ElementBatch() }

  @usableFromInline
  mutating func finishBuffering() {}

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
    precondition(
      !modes.isEmpty, "AsyncRunLoop: an ActivitySequence on loop '\(name)' needs at least one mode in 'modes'")
    let sequence = ActivitySequence(loop: self, activities: activities, order: order, bufferLimit: bufferLimit)
    for mode in modes { add(sequence.observer, to: mode) }
    adoptSequence(sequence) { sequence.invalidate() }
    return sequence
  }
}
