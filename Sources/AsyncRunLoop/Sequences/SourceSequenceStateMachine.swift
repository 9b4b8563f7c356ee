/// The cross-thread state of a `SourceSequence`: a pure state machine (no locks, no threads, no
/// clocks), held under the sequence's lock. Each event is one mutating method; its `…Action` says
/// what the caller must do after releasing the lock (resume a continuation, signal the source,
/// invalidate it, release discarded elements).
///
/// Elements move through two buffers: `posted` (accepted from producers; the source is signalled
/// when it stops being empty) and `released` (moved there by the loop when it fires the source in
/// one of its modes; the consumer takes all of it at once into its local batch). The
/// control state (`State`) says who waits and whether the sequence still accepts elements; the
/// buffers are stored beside it so that the per-element path appends in place.
///
/// Generic over the waiter handles (`Consumer`, `Producer`): the sequence uses continuations,
/// tests use plain tokens, so the machine is tested as a value with no tasks or threads.
///
/// Lifecycle: `open` ⇄ `consumerWaiting` → (`invalidate()`) `closing` → (the loop detached the
/// source) `closed` → the consumer drains `released` and ends. The loop detaching the source
/// without `invalidate()` (its shutdown) goes from `open`/`consumerWaiting` to `closed` directly.
/// The consumer stopping (cancelled, iterator dropped) goes to `cancelled` from anywhere, which
/// discards everything.
///
/// The per-element and per-batch paths (`post`, `release`, `take`, `suspendConsumer` and what they
/// touch) are `@usableFromInline`/`@inlinable`, not `private`: `SourceSequence` inlines them into
/// the client so that they are specialized for the element type (unspecialized, each call paid
/// several generic-metadata lookups).
@usableFromInline
struct SourceSequenceStateMachine<Element, Consumer, Producer> {
  @usableFromInline
  enum State {
    /// Accepting elements; the consumer is not suspended (it is running, or has not asked yet).
    case open
    /// Accepting elements; the consumer is suspended until the loop releases some.
    case consumerWaiting(Consumer)
    /// `invalidate()` was called: posts are refused; the loop has yet to detach the source and
    /// release what was accepted. The consumer may be suspended meanwhile.
    case closing(consumer: Consumer?)
    /// The source left its loop and everything accepted was released: the consumer takes what is
    /// left, then the sequence ends.
    case closed
    /// The consumer stopped (task cancelled, iterator dropped): everything is discarded.
    case cancelled
  }

  /// An async producer waiting for room (`.bounded` only), with the element it brings.
  @usableFromInline
  struct WaitingProducer {
    @usableFromInline let id: UInt64
    @usableFromInline let element: Element
    @usableFromInline let continuation: Producer
  }

  /// What to hand back to the caller to release after the lock is released.
  struct Discarded {
    var storages: [[Element]] = []
    var producers: [WaitingProducer] = []
  }

  @usableFromInline
  enum Overflow {
    /// `.unbounded` (never full) and `.bounded`: refuse, async producers wait.
    case refuse
    case dropOldest
    case dropNewest
  }

  @usableFromInline var state = State.open
  @usableFromInline var posted = ElementBatch<Element>()
  @usableFromInline var released = ElementBatch<Element>()
  /// Async producers waiting for room, oldest first. Non-empty only while the buffer is full.
  @usableFromInline var waitingProducers: [WaitingProducer] = []
  @usableFromInline let capacity: Int
  @usableFromInline let overflow: Overflow
  /// Elements dropped by `.dropOldest` / `.dropNewest`.
  @usableFromInline var droppedCount = 0
  private var nextProducerID: UInt64 = 0
  private var iteratorMade = false

  @usableFromInline
  init(buffering: SourceBuffering) {
    capacity = buffering.capacity
    switch buffering {
    case .unbounded, .bounded: overflow = .refuse
    case .dropOldest: overflow = .dropOldest
    case .dropNewest: overflow = .dropNewest
    }
  }

  /// Elements buffered and not yet taken by the consumer.
  @inlinable
  var bufferedCount: Int { posted.count + released.count }

  /// The number of async producers waiting for room.
  var waitingProducerCount: Int { waitingProducers.count }

  // MARK: Events

  /// `makeAsyncIterator()`: returns false when an iterator was made before (one consumer only).
  mutating func makeIterator() -> Bool {
    if iteratorMade { return false }  // second consumer: the caller traps
    iteratorMade = true
    return true
  }

  /// A fresh identity for an async producer about to wait (its cancellation handler names it).
  mutating func makeProducerID() -> UInt64 {
    nextProducerID &+= 1
    return nextProducerID
  }

  @usableFromInline
  enum PostAction {
    /// Taken. Signal the source when `signalSource` (it joined an empty `posted` buffer); release
    /// `discard` after unlocking.
    case accepted(SourcePostResult, signalSource: Bool, discard: [Element]?)
    /// Not taken: the element stays with the caller.
    case refused(SourcePostResult)
  }

  /// A producer posts an element without waiting (any thread).
  @inlinable
  mutating func post(_ element: Element) -> PostAction {
    switch state {
    case .open, .consumerWaiting:
      return admit(element)  // still accepting
    case .closing, .closed, .cancelled:
      return .refused(.terminated)  // ended: nothing is taken any more
    }
  }

  enum SendAction {
    /// Do not wait: resume the producer at once with this result (the element was taken when it
    /// is `.enqueued`); signal the source when asked.
    case resume(SourcePostResult, signalSource: Bool)
    /// The producer waits for room; a later event resumes it.
    case suspended
  }

  /// An async producer found the buffer full (`post` answered `.full`) and is about to wait.
  /// `isCancelled` is its task's cancellation flag, read under the lock: a cancellation that
  /// lands later finds the producer in `waitingProducers`.
  mutating func suspendProducer(
    id: UInt64, element: Element, continuation: Producer, isCancelled: Bool
  ) -> SendAction {
    switch state {
    case .open, .consumerWaiting:
      if isCancelled { return .resume(.full, signalSource: false) }  // cancelled before it waited
      if bufferedCount < capacity {
        let wasEmpty = posted.isEmpty
        posted.append(element)  // room appeared since `post` answered `.full`
        return .resume(.enqueued, signalSource: wasEmpty)
      }
      waitingProducers.append(WaitingProducer(id: id, element: element, continuation: continuation))  // waits
      return .suspended
    case .closing, .closed, .cancelled:
      return .resume(.terminated, signalSource: false)  // ended while it was about to wait
    }
  }

  enum ProducerCancelAction {
    /// The producer was not waiting (already resumed, or not yet suspended): nothing to do.
    case none
    /// Resume it with `.full`; its element was not taken.
    case resume(WaitingProducer)
  }

  /// A waiting producer's task was cancelled.
  mutating func cancelProducer(id: UInt64) -> ProducerCancelAction {
    switch state {
    case .open, .consumerWaiting, .closing, .closed, .cancelled:
      // Producers only wait in `open`/`consumerWaiting`; every other state resumed them already.
      guard let index = waitingProducers.firstIndex(where: { $0.id == id }) else { return .none }
      return .resume(waitingProducers.remove(at: index))  // leaves the queue untaken
    }
  }

  @usableFromInline
  enum ReleaseAction {
    /// Nothing to resume; release `discard` after unlocking.
    case none(discard: [Element]?)
    /// Resume the waiting consumer; release `discard` after unlocking.
    case resumeConsumer(Consumer, discard: [Element]?)
  }

  /// The loop fired the source (loop thread, in one of its modes): what was posted becomes
  /// available to the consumer.
  @inlinable
  mutating func release() -> ReleaseAction {
    switch state {
    case .open:
      return .none(discard: released.moveAll(from: &posted))  // the consumer takes it when it asks
    case .consumerWaiting(let consumer):
      let discard = released.moveAll(from: &posted)
      guard !released.isEmpty else { return .none(discard: discard) }  // a stale signal: nothing new
      state = .open  // hand over: the consumer runs again
      return .resumeConsumer(consumer, discard: discard)
    case .closing(let consumer):
      let discard = released.moveAll(from: &posted)
      guard let consumer, !released.isEmpty else { return .none(discard: discard) }  // nobody waits
      state = .closing(consumer: nil)  // the consumer runs again; the detach is still to come
      return .resumeConsumer(consumer, discard: discard)
    case .closed, .cancelled:
      return .none(discard: nil)  // ended: `posted` is empty already
    }
  }

  @usableFromInline
  enum TakeAction {
    /// `batch` now holds elements. Resume these producers (their elements were taken) with
    /// `.enqueued`, and signal the source when asked.
    case took(producers: [Producer], signalSource: Bool)
    /// Nothing to take: the consumer suspends (`suspendConsumer`).
    case suspend
    /// The sequence has ended: the consumer returns nil.
    case end
  }

  /// The consumer's batch ran out and it asks for more (the consumer's task). `batch` must have
  /// no slots (the consumer emptied it outside the lock).
  @inlinable
  mutating func take(into batch: inout ElementBatch<Element>) -> TakeAction {
    switch state {
    case .open:
      guard !released.isEmpty else { return .suspend }  // nothing released yet: wait for the loop
      _ = batch.moveAll(from: &released)  // O(1) swap: `batch` has no slots
      return admitWaitingProducers()  // room freed: waiting producers' elements join `posted`
    case .closing(consumer: .none):
      guard !released.isEmpty else { return .suspend }  // wait for the loop's detach
      _ = batch.moveAll(from: &released)
      return .took(producers: [], signalSource: false)  // nobody waits in `closing`
    case .closed:
      guard !released.isEmpty else { return .end }  // drained: the sequence ends
      _ = batch.moveAll(from: &released)
      return .took(producers: [], signalSource: false)
    case .cancelled:
      return .end  // stopped: nothing more
    case .consumerWaiting, .closing(consumer: .some):
      preconditionFailure(concurrentNextViolation("SourceSequence"))
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
  mutating func suspendConsumer(_ continuation: Consumer) -> SuspendAction {
    switch state {
    case .open:
      guard released.isEmpty else { return .resume }  // released meanwhile: take it
      state = .consumerWaiting(continuation)  // wait for the loop to release
      return .suspended
    case .closing(consumer: .none):
      guard released.isEmpty else { return .resume }
      state = .closing(consumer: continuation)  // wait for the loop's detach
      return .suspended
    case .closed, .cancelled:
      return .resume  // ended meanwhile: take sees the end
    case .consumerWaiting, .closing(consumer: .some):
      preconditionFailure(concurrentNextViolation("SourceSequence"))
    }
  }

  enum StopAction {
    /// Already stopped.
    case none
    /// Resume the consumer if it waits, resume every producer with `.terminated`, invalidate the
    /// source when asked, and release `discarded` after unlocking.
    case stop(consumer: Consumer?, invalidateSource: Bool, discarded: Discarded)
  }

  /// The consumer stopped: its task was cancelled, or it dropped its iterator.
  mutating func stopConsuming() -> StopAction {
    switch state {
    case .open:
      state = .cancelled  // discard everything; the source must leave its loop
      return .stop(consumer: nil, invalidateSource: true, discarded: discardAll())
    case .consumerWaiting(let consumer):
      state = .cancelled  // the cancellation handler ends the wait
      return .stop(consumer: consumer, invalidateSource: true, discarded: discardAll())
    case .closing(let consumer):
      state = .cancelled  // invalidated already: no need to invalidate again
      return .stop(consumer: consumer, invalidateSource: false, discarded: discardAll())
    case .closed:
      state = .cancelled  // the source is gone already; drop what was not taken
      return .stop(consumer: nil, invalidateSource: false, discarded: discardAll())
    case .cancelled:
      return .none  // stopping twice is a no-op
    }
  }

  enum InvalidateAction {
    /// Already ending.
    case none
    /// Resume these producers with `.terminated` (their elements were not taken), then
    /// invalidate the source; its detach releases what was accepted.
    case invalidateSource(producers: [WaitingProducer])
  }

  /// `invalidate()`: refuse later posts; what was accepted is still delivered.
  mutating func invalidate() -> InvalidateAction {
    switch state {
    case .open:
      state = .closing(consumer: nil)  // the loop's detach releases the rest
      return .invalidateSource(producers: takeWaitingProducers())
    case .consumerWaiting(let consumer):
      state = .closing(consumer: consumer)  // the consumer keeps waiting for the detach
      return .invalidateSource(producers: takeWaitingProducers())
    case .closing, .closed, .cancelled:
      return .none  // ending already
    }
  }

  enum DetachAction {
    /// Ended already: nothing to do.
    case none
    /// Resume the consumer if it waits and every producer with `.terminated`; release `discard`
    /// after unlocking.
    case end(consumer: Consumer?, producers: [WaitingProducer], discard: [Element]?)
  }

  /// The source left its loop (its cancel routine on the loop thread; or the source never reached
  /// a loop): everything accepted is released, and the sequence ends once the consumer took it.
  mutating func sourceDetached() -> DetachAction {
    switch state {
    case .open:
      state = .closed  // the loop shut down (or removed the source) without invalidate()
      return .end(consumer: nil, producers: takeWaitingProducers(), discard: released.moveAll(from: &posted))
    case .consumerWaiting(let consumer):
      state = .closed  // as above; wake the consumer to drain and end
      return .end(consumer: consumer, producers: takeWaitingProducers(), discard: released.moveAll(from: &posted))
    case .closing(let consumer):
      state = .closed  // the detach that invalidate() asked for
      return .end(consumer: consumer, producers: [], discard: released.moveAll(from: &posted))
    case .closed, .cancelled:
      return .none  // a second detach notice (cancel routine and fallback): no-op
    }
  }

  // MARK: Helpers (not events)

  /// Takes `element` into `posted`, or applies the overflow policy when full.
  @inlinable
  mutating func admit(_ element: Element) -> PostAction {
    guard bufferedCount >= capacity else {
      let wasEmpty = posted.isEmpty
      posted.append(element)
      return .accepted(.enqueued, signalSource: wasEmpty, discard: nil)
    }
    switch overflow {
    case .refuse:
      return .refused(.full)
    case .dropNewest:
      droppedCount += 1
      return .refused(.dropped)
    case .dropOldest:
      droppedCount += 1
      if released.isEmpty { _ = posted.popFirst() } else { _ = released.popFirst() }  // the oldest
      let wasEmpty = posted.isEmpty
      posted.append(element)
      return .accepted(.enqueuedDroppingOldest, signalSource: wasEmpty, discard: posted.compactIfWasteful())
    }
  }

  /// After the consumer took a batch: moves waiting producers' elements into `posted` while there
  /// is room, oldest producer first.
  @inlinable
  mutating func admitWaitingProducers() -> TakeAction {
    guard !waitingProducers.isEmpty else { return .took(producers: [], signalSource: false) }
    var resumed: [Producer] = []
    var signalSource = false
    while bufferedCount < capacity, !waitingProducers.isEmpty {
      let producer = waitingProducers.removeFirst()
      if posted.isEmpty { signalSource = true }
      posted.append(producer.element)
      resumed.append(producer.continuation)
    }
    return .took(producers: resumed, signalSource: signalSource)
  }

  private mutating func takeWaitingProducers() -> [WaitingProducer] {
    defer { waitingProducers = [] }
    return waitingProducers
  }

  private mutating func discardAll() -> Discarded {
    var discarded = Discarded()
    discarded.producers = takeWaitingProducers()
    var dropped = ElementBatch<Element>()
    swap(&dropped, &posted)
    discarded.storages.append(dropped.elements)
    dropped = ElementBatch()
    swap(&dropped, &released)
    discarded.storages.append(dropped.elements)
    return discarded
  }
}
