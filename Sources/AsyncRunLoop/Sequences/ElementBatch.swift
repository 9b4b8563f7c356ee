/// A first-in first-out run of elements stored in an array with a read index: appending is
/// amortised O(1), removing the oldest is O(1), and handing the whole contents to another owner is
/// a swap (no copy, no allocation).
///
/// A pure value with no locks: the source sequence's state machine keeps two (posted, released)
/// and its iterator keeps one (the consumer's local batch); the arrays rotate between them.
///
/// Slots before `head` are consumed: their values stay in the array until it is emptied with
/// `removeAll()` or replaced by `compactIfWasteful()`. Neither runs under a lock: only the
/// consumer empties its batch (outside every lock), and compaction hands the old storage back to
/// the caller to release after the lock is released, so no element's `deinit` ever runs while a
/// lock is held.
///
/// `@usableFromInline` with `@inlinable` hot members: the source sequence's per-element paths are
/// inlined into (and specialized for) the client's element type.
@usableFromInline
struct ElementBatch<Element> {
  @usableFromInline var elements: [Element] = []
  @usableFromInline var head = 0

  @inlinable
  init() {}

  /// The number of unconsumed elements.
  @inlinable
  var count: Int { elements.count &- head }

  /// True when no unconsumed element is left.
  @inlinable
  var isEmpty: Bool { head == elements.count }

  /// True when the batch has no slots at all (not even consumed ones).
  var hasNoSlots: Bool { elements.isEmpty }

  @inlinable
  mutating func append(_ element: Element) {
    elements.append(element)
  }

  /// Removes and returns the oldest element (its slot keeps the value until the batch is emptied
  /// or compacted).
  @inlinable
  mutating func popFirst() -> Element? {
    guard head < elements.count else { return nil }
    let element = elements[head]
    head &+= 1
    return element
  }

  /// Empties the batch and keeps its capacity. Releases every value still held: never call it
  /// with a lock held.
  @inlinable
  mutating func removeAll() {
    elements.removeAll(keepingCapacity: true)
    head = 0
  }

  /// Moves every unconsumed element of `other` to the end of this batch and leaves `other` empty.
  /// - Returns: storage whose values must be released after the lock is released, or nil.
  @inlinable
  mutating func moveAll(from other: inout ElementBatch<Element>) -> [Element]? {
    if isEmpty {
      // Nothing unconsumed here: trade storage (O(1)). Consumed slots travel with `other` until
      // the consumer empties that array, or it is compacted.
      swap(&self, &other)
      return nil
    }
    guard !other.isEmpty else { return nil }
    elements.append(contentsOf: other.elements[other.head...])
    if other.head == 0 {
      other.elements.removeAll(keepingCapacity: true)  // every value is still held by `self`
      return nil
    }
    // `other` holds consumed values that nobody else holds: release them outside the lock.
    let released = other.elements
    other = ElementBatch()
    return released
  }

  /// Replaces the storage by a copy of the unconsumed elements when consumed slots outnumber them
  /// (so a buffer that drops its oldest elements does not grow without bound).
  /// - Returns: the old storage, to release after the lock is released, or nil.
  @inlinable
  mutating func compactIfWasteful() -> [Element]? {
    guard head >= 64, head >= count else { return nil }
    var live = Array(elements[head...])
    swap(&live, &elements)
    head = 0
    return live
  }
}
