/// The lifecycle every async sequence of this module shares: who waits, whether the loop member
/// (source, timer, descriptor source, observer) still feeds the sequence, and how it ends. A pure
/// state machine (no locks, no threads), held under the sequence's lock inside the sequence's own
/// state machine, which adds what the sequence buffers. Generic over the consumer's waiter handle:
/// a continuation in the sequence, a plain token in tests.
///
/// The lifecycle does not see the buffer: each event that depends on it is told whether the
/// consumer has something to take (`hasElements`).
///
/// `open` ⇄ `consumerWaiting` → (`close()`, for sequences whose end passes through the loop)
/// `closing` → (`end()`, the member is gone) `ended` → the consumer drains the buffer and the
/// sequence ends. `end()` also goes from `open`/`consumerWaiting` to `ended` directly (the member
/// was invalidated, the loop shut down). The consumer stopping (task cancelled, iterator dropped)
/// goes to `cancelled` from anywhere, which discards everything.
///
/// `@usableFromInline` with `@inlinable` per-element events: the source sequence's hot paths are
/// inlined into (and specialized in) the client.
@usableFromInline
struct ConsumerLifecycle<Consumer> {
  @usableFromInline
  enum State {
    /// The member feeds the sequence; the consumer is not suspended (it runs, or has not asked).
    case open
    /// The member feeds the sequence; the consumer is suspended until something arrives.
    case consumerWaiting(Consumer)
    /// `close()` was called: nothing new is accepted; the loop has yet to detach the member and
    /// hand over what was accepted. The consumer may be suspended meanwhile.
    case closing(consumer: Consumer?)
    /// The member is gone: the consumer takes what is buffered, then the sequence ends.
    case ended
    /// The consumer stopped (task cancelled, iterator dropped): everything is discarded.
    case cancelled
  }

  @usableFromInline var state = State.open
  /// The sequence's type name, for the message of a concurrent `next()`.
  @usableFromInline let sequenceName: StaticString
  private var iteratorMade = false

  @usableFromInline
  init(sequenceName: StaticString) { self.sequenceName = sequenceName }

  /// True while the member feeds the sequence (`open`, `consumerWaiting`): producers are accepted.
  @inlinable
  var isAccepting: Bool {
    switch state {
    case .open, .consumerWaiting: return true
    case .closing, .ended, .cancelled: return false
    }
  }

  // MARK: Events

  /// `makeAsyncIterator()`: returns false when an iterator was made before (one consumer only).
  mutating func makeIterator() -> Bool {
    if iteratorMade { return false }  // second consumer: the caller traps
    iteratorMade = true
    return true
  }

  /// Something arrived for the consumer (loop thread; `hasElements`: it has something to take now).
  /// - Returns: the consumer to resume after unlocking, if it waited.
  @inlinable
  mutating func delivered(hasElements: Bool) -> Consumer? {
    switch state {
    case .open:
      return nil  // the consumer takes it when it asks
    case .consumerWaiting(let consumer):
      guard hasElements else { return nil }  // a stale notice: nothing new
      state = .open  // hand over: the consumer runs again
      return consumer
    case .closing(let consumer):
      guard let consumer, hasElements else { return nil }  // nobody waits, or nothing new
      state = .closing(consumer: nil)  // the consumer runs again; the detach is still to come
      return consumer
    case .ended, .cancelled:
      return nil  // a notice that raced the end: nothing to wake
    }
  }

  @usableFromInline
  enum TakeAction {
    /// Take what is buffered.
    case take
    /// Nothing to take yet: the consumer suspends (`suspend`).
    case suspend
    /// The sequence has ended: the consumer returns nil.
    case end
  }

  /// The consumer asks for more (the consumer's task).
  @inlinable
  func take(hasElements: Bool) -> TakeAction {
    switch state {
    case .open, .closing(consumer: .none):
      return hasElements ? .take : .suspend  // nothing yet: wait for the loop
    case .ended:
      return hasElements ? .take : .end  // drained: the sequence ends
    case .cancelled:
      return .end  // stopped: nothing more
    case .consumerWaiting, .closing(consumer: .some):
      preconditionFailure(concurrentNextViolation("\(sequenceName)"))
    }
  }

  @usableFromInline
  enum SuspendAction {
    /// The consumer waits; a later event resumes it.
    case suspended
    /// Something changed since `take`: resume the consumer at once (it takes again).
    case resume
  }

  /// The consumer found nothing and is about to wait.
  @inlinable
  mutating func suspend(_ consumer: Consumer, hasElements: Bool) -> SuspendAction {
    switch state {
    case .open:
      guard !hasElements else { return .resume }  // arrived meanwhile: take it
      state = .consumerWaiting(consumer)  // wait for the loop
      return .suspended
    case .closing(consumer: .none):
      guard !hasElements else { return .resume }
      state = .closing(consumer: consumer)  // wait for the loop's detach
      return .suspended
    case .ended, .cancelled:
      return .resume  // ended meanwhile: take sees the end
    case .consumerWaiting, .closing(consumer: .some):
      preconditionFailure(concurrentNextViolation("\(sequenceName)"))
    }
  }

  enum StopAction {
    /// Already stopped.
    case none
    /// Resume the consumer if it waits; detach the member from its loop when `detachMember`.
    case stop(consumer: Consumer?, detachMember: Bool)
  }

  /// The consumer stopped: its task was cancelled, or it dropped its iterator.
  mutating func stop() -> StopAction {
    switch state {
    case .open:
      state = .cancelled  // the member must leave its loop
      return .stop(consumer: nil, detachMember: true)
    case .consumerWaiting(let consumer):
      state = .cancelled  // the cancellation handler ends the wait; the member leaves its loop
      return .stop(consumer: consumer, detachMember: true)
    case .closing(let consumer):
      state = .cancelled  // detached already by `close()`'s caller
      return .stop(consumer: consumer, detachMember: false)
    case .ended:
      state = .cancelled  // the member is gone already
      return .stop(consumer: nil, detachMember: false)
    case .cancelled:
      return .none  // stopping twice is a no-op
    }
  }

  /// Stop accepting and wait for the loop to detach the member (`invalidate()` of a sequence whose
  /// end passes through the loop). Returns true when the caller must detach it now.
  mutating func close() -> Bool {
    switch state {
    case .open:
      state = .closing(consumer: nil)  // the loop's detach hands over the rest
      return true
    case .consumerWaiting(let consumer):
      state = .closing(consumer: consumer)  // the consumer keeps waiting for the detach
      return true
    case .closing, .ended, .cancelled:
      return false  // ending already
    }
  }

  enum EndAction {
    /// Ended already: nothing to do.
    case none
    /// Resume the consumer if it waits: it drains the buffer and ends.
    case end(consumer: Consumer?)
  }

  /// The member is gone (invalidated, its loop shut down, a one-shot timer fired, or the detach
  /// that `close()` asked for): what is buffered is still delivered, then the sequence ends.
  mutating func end() -> EndAction {
    switch state {
    case .open:
      state = .ended  // deliver what is buffered, then end
      return .end(consumer: nil)
    case .consumerWaiting(let consumer):
      state = .ended  // wake the consumer to drain and end
      return .end(consumer: consumer)
    case .closing(let consumer):
      state = .ended  // the detach that `close()` asked for
      return .end(consumer: consumer)
    case .ended, .cancelled:
      return .none  // a second notice: no-op
    }
  }
}

/// A sequence's pure state machine: the shared `ConsumerLifecycle` plus what the sequence buffers.
/// The events of the consumer side (take, suspend, stop) and of the member's end are the same for
/// every sequence and live in the extension below; each sequence adds its producer-side events.
@usableFromInline
protocol SingleConsumerStateMachine {
  associatedtype Element
  associatedtype Consumer
  /// What the consumer's task does after a take, once the lock is released.
  associatedtype TakeEffect
  /// What is left to resume or release, after the lock is released, when the buffer is emptied
  /// or the member ends.
  associatedtype Leftovers

  var lifecycle: ConsumerLifecycle<Consumer> { get set }
  /// True when the consumer has something to take.
  var hasElements: Bool { get }
  /// Moves what the consumer may take into its `batch`, which has no slots. Only when `hasElements`.
  mutating func moveElements(into batch: inout ElementBatch<Element>) -> TakeEffect
  /// The consumer stopped: empties the buffer.
  mutating func discardAll() -> Leftovers
  /// The member ended: hands over what it had accepted and not yet released to the consumer.
  mutating func finishBuffering() -> Leftovers
}

@usableFromInline
enum ConsumerTakeAction<Effect> {
  /// The consumer's batch now holds elements; perform `Effect` after unlocking.
  case took(Effect)
  /// Nothing to take: the consumer suspends (`suspendConsumer`).
  case suspend
  /// The sequence has ended: the consumer returns nil.
  case end
}

enum ConsumerStopAction<Consumer, Leftovers> {
  /// Already stopped.
  case none
  /// Resume the consumer if it waits, detach the member when asked, release `leftovers`.
  case stop(consumer: Consumer?, detachMember: Bool, leftovers: Leftovers)
}

enum MemberEndAction<Consumer, Leftovers> {
  /// Ended already.
  case none
  /// Release `leftovers`, then resume the consumer if it waits (it drains and ends).
  case end(consumer: Consumer?, leftovers: Leftovers)
}

extension SingleConsumerStateMachine {
  /// `makeAsyncIterator()`: returns false when an iterator was made before.
  mutating func makeIterator() -> Bool { lifecycle.makeIterator() }

  /// The consumer's batch ran out and it asks for more (the consumer's task). `batch` must have
  /// no slots (the consumer emptied it outside the lock).
  @inlinable
  mutating func take(into batch: inout ElementBatch<Element>) -> ConsumerTakeAction<TakeEffect> {
    switch lifecycle.take(hasElements: hasElements) {
    case .take: return .took(moveElements(into: &batch))  // hand the buffer over
    case .suspend: return .suspend  // wait for the loop
    case .end: return .end  // ended or stopped
    }
  }

  /// The consumer found nothing and is about to wait.
  @inlinable
  mutating func suspendConsumer(_ consumer: Consumer) -> ConsumerLifecycle<Consumer>.SuspendAction {
    lifecycle.suspend(consumer, hasElements: hasElements)
  }

  /// The consumer stopped: its task was cancelled, or it dropped its iterator.
  mutating func stopConsuming() -> ConsumerStopAction<Consumer, Leftovers> {
    switch lifecycle.stop() {
    case .none:
      return .none  // stopping twice is a no-op
    case .stop(let consumer, let detachMember):
      return .stop(consumer: consumer, detachMember: detachMember, leftovers: discardAll())  // drop the buffer
    }
  }

  /// The member is gone (invalidated, detached, its loop shut down): what was accepted is still
  /// delivered, then the sequence ends.
  mutating func memberEnded() -> MemberEndAction<Consumer, Leftovers> {
    switch lifecycle.end() {
    case .none:
      return .none  // a second notice
    case .end(let consumer):
      return .end(consumer: consumer, leftovers: finishBuffering())  // release the rest to the consumer
    }
  }
}
