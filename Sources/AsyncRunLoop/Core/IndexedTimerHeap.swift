/// What an `IndexedTimerHeap` stores: a loop-thread-only object (one per timer and mode) that
/// remembers its slot in the heap's position table, so the heap can remove or move it without
/// searching.
///
/// Implement `heapSlot` as a plain stored property of a final class, marked
/// `@exclusivity(unchecked)` (only ever touched on the loop thread), initialised to -1.
protocol TimerHeapElement: AnyObject {
  /// The element's slot in the position table of the heap it is in, or -1 when it is in no
  /// heap. Written only by the heap, when the element goes in and when it comes out (never while
  /// it moves inside the heap).
  var heapSlot: Int { get set }
}

/// A 4-ary min-heap of timer entries ordered by (deadline, sequence), so entries with equal
/// deadlines come out in the order they were scheduled (as libuv orders its timers), that can
/// also remove or re-time any entry in O(log n).
///
/// Four children per node (as Go's timer heap): half the levels of a binary heap, and the four
/// children a sift compares sit next to each other in one or two cache lines.
///
/// Each element has a slot in the heap's position table (`positions`), which the heap keeps
/// equal to the element's place in `entries`, so `remove(_:)` and `update(_:deadline:sequence:)`
/// find its entry at once instead of leaving a stale entry behind. A sift updates that dense
/// table, never the elements themselves: with 100k timers an element is usually out of the
/// caches, and writing each moved element's index made every level of a sift a cache miss. An
/// element is in at most one heap at a time (it has one slot): the loop holds one element per
/// (timer, mode).
///
/// A pure value with no threads or clocks in it; not thread-safe. Tests drive it with plain
/// numbers.
struct IndexedTimerHeap<Element: TimerHeapElement> {
  /// One scheduled element.
  struct Entry {
    /// Absolute deadline, CLOCK_MONOTONIC nanoseconds.
    var deadline: Int64
    /// Tie-breaker: the order in which entries were scheduled.
    var sequence: UInt64
    var element: Element
    /// The element's slot in the position table (a copy of `element.heapSlot`, read by sifts
    /// without touching the element).
    fileprivate var slot: Int

    /// Whether this entry comes out before `other`.
    @inline(__always)
    func precedes(_ other: Entry) -> Bool { precedes(deadline: other.deadline, sequence: other.sequence) }

    /// Whether this entry comes out before an entry with `deadline` and `sequence`.
    @inline(__always)
    func precedes(deadline otherDeadline: Int64, sequence otherSequence: UInt64) -> Bool {
      deadline < otherDeadline || (deadline == otherDeadline && sequence < otherSequence)
    }
  }

  /// The entries in heap order: `entries[i]` precedes its children `entries[4i+1]` through
  /// `entries[4i+4]`, and `positions[entries[i].slot] == i`.
  private(set) var entries: [Entry] = []
  /// By slot: the element's index in `entries` (-1 for a free slot).
  private var positions: [Int] = []
  /// Slots of `positions` free for the next insert.
  private var freeSlots: [Int] = []

  /// Creates an empty heap.
  init() {}

  var isEmpty: Bool { entries.isEmpty }
  var count: Int { entries.count }

  /// The entry with the earliest (deadline, sequence), or nil when the heap is empty.
  var first: Entry? { entries.first }

  /// The first entry's deadline, or nil when the heap is empty (no copy of the entry).
  var firstDeadline: Int64? { entries.isEmpty ? nil : entries[0].deadline }

  /// The smallest deadline among the first entry's children: no entry other than `first` has an
  /// earlier deadline. Used to bound how long tolerance may delay the first timer.
  var deadlineAfterFirst: Int64? {
    guard entries.count > 1 else { return nil }
    var earliest = entries[1].deadline
    for child in 2..<min(entries.count, Self.arity + 1) { earliest = min(earliest, entries[child].deadline) }
    return earliest
  }

  /// Every element in the heap, in storage (not deadline) order (tests inspect the heap with it).
  var elements: LazyMapSequence<[Entry], Element> { entries.lazy.map(\.element) }

  /// Whether `element` is in this heap. O(1).
  func contains(_ element: Element) -> Bool { index(of: element) != nil }

  /// The entry of `element`, or nil when it is not in this heap. O(1).
  func entry(for element: Element) -> Entry? { index(of: element).map { entries[$0] } }

  /// Schedules `element`. O(log n).
  /// - Precondition: `element` is in no heap (`heapSlot == -1`).
  mutating func insert(_ element: Element, deadline: Int64, sequence: UInt64) {
    precondition(element.heapSlot == -1, "IndexedTimerHeap.insert: the element is already in a heap")
    let slot: Int
    if let free = freeSlots.popLast() {
      slot = free
      positions[slot] = entries.count
    } else {
      slot = positions.count
      positions.append(entries.count)
    }
    element.heapSlot = slot
    entries.append(Entry(deadline: deadline, sequence: sequence, element: element, slot: slot))
    siftUp(from: entries.count - 1)
  }

  /// Takes `element` out of the heap and sets its `heapSlot` to -1. O(log n).
  /// - Returns: false (and does nothing) when `element` is not in this heap.
  @discardableResult
  mutating func remove(_ element: Element) -> Bool {
    guard let index = index(of: element) else { return false }
    removeEntry(at: index)
    return true
  }

  /// Gives `element` a new deadline and sequence and moves it to its place. O(log n).
  /// - Precondition: `element` is in this heap.
  mutating func update(_ element: Element, deadline: Int64, sequence: UInt64) {
    guard let index = index(of: element) else { preconditionFailure("IndexedTimerHeap.update: not in this heap") }
    let movesLater = entries.withUnsafeMutableBufferPointer { heap in
      let movesLater = heap[index].precedes(deadline: deadline, sequence: sequence)
      heap[index].deadline = deadline
      heap[index].sequence = sequence
      return movesLater
    }
    // Later than before: it can only go down; earlier: only up.
    if movesLater { siftDown(from: index) } else { siftUp(from: index) }
  }

  /// Removes and returns the first entry, setting its element's `heapSlot` to -1. O(log n).
  @discardableResult
  mutating func popFirst() -> Entry? {
    guard !entries.isEmpty else { return nil }
    // The last entry takes the root's place; the root is moved out (not copied: no retain).
    entries.withUnsafeMutableBufferPointer { $0.swapAt(0, $0.count - 1) }
    let first = entries.removeLast()
    release(first)
    if !entries.isEmpty {
      positions[entries[0].slot] = 0
      siftDown(from: 0)
    }
    return first
  }

  /// Empties the heap, setting every element's `heapSlot` to -1. O(n).
  mutating func removeAll() {
    for entry in entries { entry.element.heapSlot = -1 }
    entries.removeAll()
    positions.removeAll()
    freeSlots.removeAll()
  }

  // MARK: Storage

  /// Children per node.
  static var arity: Int { 4 }

  @inline(__always)
  private static func parent(of index: Int) -> Int { (index - 1) / arity }

  /// Where `element` sits in this heap, or nil: its slot must be one of this heap's and point at
  /// an entry holding it (an element of another heap has a slot too).
  @inline(__always)
  func index(of element: Element) -> Int? {
    let slot = element.heapSlot
    guard slot >= 0, slot < positions.count else { return nil }
    let index = positions[slot]
    guard index >= 0, index < entries.count, entries[index].element === element else { return nil }
    return index
  }

  /// An entry left the heap: its slot is free again, and its element is in no heap.
  @inline(__always)
  private mutating func release(_ entry: Entry) {
    entry.element.heapSlot = -1
    positions[entry.slot] = -1
    if freeSlots.count + 1 == positions.count && entries.isEmpty {
      // Empty: start the table over, so a heap that once held many timers stays small.
      positions.removeAll(keepingCapacity: true)
      freeSlots.removeAll(keepingCapacity: true)
    } else {
      freeSlots.append(entry.slot)
    }
  }

  /// Removes the entry at `index`: the last entry fills the hole and sifts whichever way it must.
  private mutating func removeEntry(at index: Int) {
    let last = entries.count - 1
    if index != last { entries.withUnsafeMutableBufferPointer { $0.swapAt(index, last) } }  // no retain/release
    let removed = entries.removeLast()
    release(removed)
    guard index != last else { return }
    positions[entries[index].slot] = index
    // The moved entry came from a leaf: it can belong above or below `index`.
    if index > 0 && entries[index].precedes(entries[Self.parent(of: index)]) {
      siftUp(from: index)
    } else {
      siftDown(from: index)
    }
  }

  // The sifts use the "hole" technique on the buffer: the entry being placed is moved out once,
  // each entry it passes moves one level into the hole (a bitwise move, so the element reference
  // is never retained or released) and its slot gets the new index, and the placed entry is moved
  // into the final hole. Nothing in between can fail, so the hole never outlives the sift.

  private mutating func siftUp(from start: Int) {
    positions.withUnsafeMutableBufferPointer { positions in
      entries.withUnsafeMutableBufferPointer { heap in
        guard let base = heap.baseAddress else { return }
        var hole = start
        let moving = (base + hole).move()
        while hole > 0 {
          let parent = Self.parent(of: hole)
          guard moving.precedes(base[parent]) else { break }
          (base + hole).moveInitialize(from: base + parent, count: 1)
          positions[base[hole].slot] = hole
          hole = parent
        }
        (base + hole).initialize(to: moving)
        positions[moving.slot] = hole
      }
    }
  }

  private mutating func siftDown(from start: Int) {
    positions.withUnsafeMutableBufferPointer { positions in
      entries.withUnsafeMutableBufferPointer { heap in
        guard let base = heap.baseAddress else { return }
        let count = heap.count
        var hole = start
        let moving = (base + hole).move()
        while true {
          let firstChild = Self.arity * hole + 1
          guard firstChild < count else { break }
          var smaller = firstChild
          for child in (firstChild + 1)..<min(firstChild + Self.arity, count) where base[child].precedes(base[smaller])
          {
            smaller = child
          }
          guard base[smaller].precedes(moving) else { break }
          (base + hole).moveInitialize(from: base + smaller, count: 1)
          positions[base[hole].slot] = hole
          hole = smaller
        }
        (base + hole).initialize(to: moving)
        positions[moving.slot] = hole
      }
    }
  }
}
