/// An element that several firings can be folded into when the buffer is full (a tick that
/// stands for two firings, a performance that covers more signals).
protocol FoldableFiring: Sendable {
  /// Folds `later`, which happened after `self`, into `self`.
  mutating func fold(_ later: Self)
}

/// The cross-thread state of a `CFRunLoopTimerSequence` or `CFRunLoopSourceSequence`: a pure
/// state machine held under the sequence's lock, generic over the consumer's waiter handle. Each
/// event returns what the caller does after releasing the lock.
///
/// Buffer policy: up to `limit` elements wait for the consumer; a firing that finds the buffer
/// full is folded into the newest buffered element (its count grows), so nothing is lost and the
/// buffer never grows past `limit`. Firings after the end are ignored.
struct FiringBuffer<Element: FoldableFiring, Consumer> {
  enum Phase: Equatable {
    /// Firings are accepted.
    case open
    /// The timer or source ended (`invalidate()`, the executor's shutdown): what is buffered
    /// is still delivered, then the consumer gets nil.
    case finished
    /// The consumer stopped (its task was cancelled): the buffer is discarded.
    case cancelled
  }

  let limit: Int
  private(set) var phase = Phase.open
  private(set) var buffered: [Element] = []
  /// The suspended consumer (only while `buffered` is empty and the phase is `.open`).
  private var consumer: Consumer?
  private(set) var hasIterator = false
  /// `signal()` calls accepted and not yet taken by a performance (source sequences only).
  private(set) var pendingSignals = 0
  /// Firings folded into an element that was already buffered, because the buffer was full.
  private(set) var foldedCount = 0

  init(limit: Int) {
    precondition(limit > 0, "AsyncRunLoopFoundation: a sequence's buffer limit must be positive, not \(limit)")
    self.limit = limit
  }

  /// `makeAsyncIterator()`: false for a second call (the caller traps).
  mutating func makeIterator() -> Bool {
    guard !hasIterator else { return false }
    hasIterator = true
    return true
  }

  enum DeliverAction {
    /// Buffered (or ignored after the end): nothing to do.
    case none
    /// The consumer waited: resume it with the element.
    case resume(Consumer, Element)
  }

  /// The timer fired or the source was performed (the run loop's thread).
  mutating func deliver(_ element: Element) -> DeliverAction {
    guard phase == .open else { return .none }  // a callout that raced the end
    if let waiting = consumer {
      consumer = nil  // the consumer waits only on an empty buffer
      return .resume(waiting, element)
    }
    if buffered.count < limit {
      buffered.append(element)  // room: one element per firing
    } else {
      buffered[buffered.count - 1].fold(element)  // full: the newest element stands for one more firing
      foldedCount += 1
    }
    return .none
  }

  enum NextAction {
    /// Return this to the consumer now (nil: the sequence ended).
    case `return`(Element?)
    /// The consumer was stored: it is resumed by a firing or the end.
    case suspended
  }

  /// The consumer asks for the next element; `consumer` is its waiter, stored when nothing is
  /// buffered and the sequence is open.
  mutating func next(_ waiter: Consumer) -> NextAction {
    if !buffered.isEmpty { return .return(buffered.removeFirst()) }  // oldest first
    guard phase == .open else { return .return(nil) }  // ended and drained
    precondition(consumer == nil, "AsyncRunLoopFoundation: a second concurrent next() on a single-consumer sequence")
    consumer = waiter
    return .suspended
  }

  enum EndAction {
    /// Nothing to do.
    case none
    /// Resume the waiting consumer with this (nil: the sequence ended).
    case resume(Consumer, Element?)
  }

  /// The timer or source ended (`invalidate()`, the executor's shutdown): buffered elements are
  /// still delivered, then nil. `final`, when not nil, is delivered as the last element (a
  /// source's signals that no performance took yet).
  mutating func finish(final: Element? = nil) -> EndAction {
    guard phase == .open else { return .none }  // ended already
    phase = .finished
    let waiting = consumer
    consumer = nil
    if let final {
      if let waiting { return .resume(waiting, final) }  // it waited on an empty buffer: `final` is next, then nil
      if buffered.count < limit { buffered.append(final) } else { buffered[buffered.count - 1].fold(final) }
      return .none
    }
    if let waiting { return .resume(waiting, nil) }  // it waited on an empty buffer: the end is next
    return .none
  }

  /// The consumer's task was cancelled: the sequence ends now and the buffer is discarded. True
  /// when it was open; the waiting consumer, if any, is to be resumed with nil (the caller
  /// invalidated the timer or source before it called this).
  mutating func cancel() -> (wasOpen: Bool, resume: Consumer?) {
    let wasOpen = phase == .open
    phase = .cancelled
    buffered.removeAll()
    pendingSignals = 0
    let waiting = consumer
    consumer = nil
    return (wasOpen, waiting)
  }

  /// `signal()` on a source sequence: false once the sequence has ended.
  mutating func acceptSignal() -> Bool {
    guard phase == .open else { return false }
    pendingSignals += 1
    return true
  }

  /// A performance takes the signals accepted so far.
  mutating func takeSignals() -> Int {
    defer { pendingSignals = 0 }
    return pendingSignals
  }
}
