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
/// The lifecycle (who waits, how the sequence ends) is the shared `ConsumerLifecycle`: `open` ⇄
/// `consumerWaiting` → (`invalidate()`) `closing` → (the loop detached the source) `ended` → the
/// consumer drains `released` and ends; the loop detaching the source without `invalidate()` (its
/// shutdown) ends it directly; the consumer stopping cancels it from anywhere, which discards
/// everything. This type adds the buffers, the overflow policy and the waiting producers.
///
/// The per-element and per-batch paths (`post`, `release`, `take`, `suspendConsumer` and what they
/// touch) are `@usableFromInline`/`@inlinable`, not `private`: `SourceSequence` inlines them into
/// the client so that they are specialized for the element type (unspecialized, each call paid
/// several generic-metadata lookups).
@usableFromInline
struct SourceSequenceStateMachine<Element, Consumer, Producer>: ClosableStateMachine {
  /// An async producer waiting for room (`.bounded` only), with the element it brings.
  @usableFromInline
  struct WaitingProducer {
    @usableFromInline let id: UInt64
    @usableFromInline let element: Element
    @usableFromInline let continuation: Producer
  }

  /// What to hand back to the caller to release after the lock is released.
  @usableFromInline
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

  @usableFromInline var lifecycle = ConsumerLifecycle<Consumer>(sequenceName: "SourceSequence")
  @usableFromInline var posted = ElementBatch<Element>()
  @usableFromInline var released = ElementBatch<Element>()
  /// Async producers waiting for room, oldest first. Non-empty only while the buffer is full.
  @usableFromInline var waitingProducers: [WaitingProducer] = []
  @usableFromInline let capacity: Int
  @usableFromInline let overflow: Overflow
  /// Elements dropped by `.dropOldest` / `.dropNewest`.
  @usableFromInline var droppedCount = 0
  private var nextProducerID: UInt64 = 0

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
    guard lifecycle.isAccepting else { return .refused(.terminated) }  // ended: nothing is taken any more
    return admit(element)
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
    guard lifecycle.isAccepting else { return .resume(.terminated, signalSource: false) }  // ended meanwhile
    if isCancelled { return .resume(.full, signalSource: false) }  // cancelled before it waited
    if bufferedCount < capacity {
      let wasEmpty = posted.isEmpty
      posted.append(element)  // room appeared since `post` answered `.full`
      return .resume(.enqueued, signalSource: wasEmpty)
    }
    waitingProducers.append(WaitingProducer(id: id, element: element, continuation: continuation))  // waits
    return .suspended
  }

  enum ProducerCancelAction {
    /// The producer was not waiting (already resumed, or not yet suspended): nothing to do.
    case none
    /// Resume it with `.full`; its element was not taken.
    case resume(WaitingProducer)
  }

  /// A waiting producer's task was cancelled. (Producers only wait while the sequence accepts;
  /// every other state resumed them already, so the queue is the whole truth.)
  mutating func cancelProducer(id: UInt64) -> ProducerCancelAction {
    guard let index = waitingProducers.firstIndex(where: { $0.id == id }) else { return .none }
    return .resume(waitingProducers.remove(at: index))  // leaves the queue untaken
  }

  @usableFromInline
  enum ReleaseAction {
    /// Nothing to resume; release `discard` after unlocking.
    case none(discard: [Element]?)
    /// Resume the waiting consumer; release `discard` after unlocking.
    case resumeConsumer(Consumer, discard: [Element]?)
  }

  /// The loop fired the source (loop thread, in one of its modes): what was posted becomes
  /// available to the consumer. (Once the sequence ended or stopped, `posted` is empty.)
  @inlinable
  mutating func release() -> ReleaseAction {
    let discard = released.moveAll(from: &posted)
    guard let consumer = lifecycle.delivered(hasElements: !released.isEmpty) else { return .none(discard: discard) }
    return .resumeConsumer(consumer, discard: discard)
  }

  // MARK: SingleConsumerStateMachine

  /// True when the loop has released elements the consumer has not taken.
  @inlinable
  var hasElements: Bool { !released.isEmpty }

  /// The consumer takes everything released (an O(1) swap: `batch` has no slots); room freed, so
  /// waiting producers' elements join `posted`. Returns those producers (resume them with
  /// `.enqueued`) and whether to signal the source.
  @inlinable
  mutating func moveElements(
    into batch: inout ElementBatch<Element>
  ) -> (producers: [Producer], signalSource: Bool) {
    _ = batch.moveAll(from: &released)
    return admitWaitingProducers()
  }

  /// The consumer stopped: every buffer and every waiting producer is discarded.
  @usableFromInline
  mutating func discardAll() -> Discarded {
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

  /// `invalidate()` closed the sequence: producers waiting for room are answered `.terminated`
  /// (their elements were not taken); what was accepted is still delivered.
  @usableFromInline
  mutating func stopAccepting() -> Discarded {
    var leftovers = Discarded()
    leftovers.producers = takeWaitingProducers()
    return leftovers
  }

  /// The source left its loop (its cancel routine on the loop thread; or it never reached a loop):
  /// everything accepted is released; producers still waiting (no `invalidate()` first) end.
  @usableFromInline
  mutating func finishBuffering() -> Discarded {
    var leftovers = Discarded()
    leftovers.producers = takeWaitingProducers()
    if let storage = released.moveAll(from: &posted) { leftovers.storages.append(storage) }
    return leftovers
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
      // The oldest is the first released one, if any. Its slot keeps the value until the batch
      // is compacted, so the batch dropped from is compacted when wasteful: a stalled consumer
      // must not make dropped elements pile up (each post released before the next kept every
      // one of them in `released` before).
      let droppedFromReleased = !released.isEmpty
      if droppedFromReleased { _ = released.popFirst() } else { _ = posted.popFirst() }
      let wasEmpty = posted.isEmpty
      posted.append(element)
      let discard = droppedFromReleased ? released.compactIfWasteful() : posted.compactIfWasteful()
      return .accepted(.enqueuedDroppingOldest, signalSource: wasEmpty, discard: discard)
    }
  }

  /// After the consumer took a batch: moves waiting producers' elements into `posted` while there
  /// is room, oldest producer first.
  @inlinable
  mutating func admitWaitingProducers() -> (producers: [Producer], signalSource: Bool) {
    guard !waitingProducers.isEmpty else { return ([], false) }
    var resumed: [Producer] = []
    var signalSource = false
    while bufferedCount < capacity, !waitingProducers.isEmpty {
      let producer = waitingProducers.removeFirst()
      if posted.isEmpty { signalSource = true }
      posted.append(producer.element)
      resumed.append(producer.continuation)
    }
    return (resumed, signalSource)
  }

  private mutating func takeWaitingProducers() -> [WaitingProducer] {
    defer { waitingProducers = [] }
    return waitingProducers
  }
}
