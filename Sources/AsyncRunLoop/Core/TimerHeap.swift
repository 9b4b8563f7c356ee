/// A binary min-heap of timer entries ordered by (deadline, sequence), so timers with equal
/// deadlines come out in the order they were scheduled (as libuv orders its timers).
///
/// A pure value with no threads or clocks in it: the loop owns one per mode and tests drive it
/// with plain numbers. Entries are never removed from the middle; an entry whose timer was
/// rescheduled or removed goes stale and is dropped when it reaches the top (`isLive` decides),
/// and `compact` rebuilds the heap when stale entries pile up.
struct TimerHeap<Payload> {
  struct Entry {
    /// Absolute deadline, CLOCK_MONOTONIC nanoseconds.
    var deadline: Int64
    /// Tie-breaker: the order in which entries were pushed.
    var sequence: UInt64
    var payload: Payload

    @inline(__always)
    func precedes(_ other: Entry) -> Bool {
      deadline < other.deadline || (deadline == other.deadline && sequence < other.sequence)
    }
  }

  private(set) var entries: [Entry] = []

  var isEmpty: Bool { entries.isEmpty }
  var count: Int { entries.count }

  /// The entry with the earliest (deadline, sequence), live or stale.
  var first: Entry? { entries.first }

  /// The smallest deadline among the first entry's children: no entry other than `first` has an
  /// earlier deadline. Used to bound how long tolerance may delay the first timer.
  var deadlineAfterFirst: Int64? {
    switch entries.count {
    case 0, 1: return nil
    case 2: return entries[1].deadline
    default: return min(entries[1].deadline, entries[2].deadline)
    }
  }

  mutating func push(deadline: Int64, sequence: UInt64, payload: Payload) {
    entries.append(Entry(deadline: deadline, sequence: sequence, payload: payload))
    siftUp(from: entries.count - 1)
  }

  @discardableResult
  mutating func popFirst() -> Entry? {
    guard !entries.isEmpty else { return nil }
    let last = entries.removeLast()
    guard !entries.isEmpty else { return last }
    let first = entries[0]
    entries[0] = last
    siftDown(from: 0)
    return first
  }

  /// Drops stale entries from the top until the first entry is live (or the heap is empty).
  mutating func dropStaleHead(isLive: (Entry) -> Bool) {
    while let head = entries.first, !isLive(head) { popFirst() }
  }

  /// Keeps only the entries for which `isLive` is true and restores heap order. O(n).
  mutating func compact(isLive: (Entry) -> Bool) {
    entries.removeAll { !isLive($0) }
    guard entries.count > 1 else { return }
    for index in stride(from: entries.count / 2 - 1, through: 0, by: -1) { siftDown(from: index) }
  }

  mutating func removeAll() { entries.removeAll() }

  // The sifts move entries with `swapAt` on the buffer and compare keys in place, so the payload
  // (a class reference) is never copied: no retain/release per level.

  private mutating func siftUp(from start: Int) {
    entries.withUnsafeMutableBufferPointer { heap in
      var child = start
      while child > 0 {
        let parent = (child - 1) / 2
        guard heap[child].precedes(heap[parent]) else { break }
        heap.swapAt(child, parent)
        child = parent
      }
    }
  }

  private mutating func siftDown(from start: Int) {
    entries.withUnsafeMutableBufferPointer { heap in
      var parent = start
      let count = heap.count
      while true {
        let left = 2 * parent + 1
        guard left < count else { break }
        let right = left + 1
        let smaller = right < count && heap[right].precedes(heap[left]) ? right : left
        guard heap[smaller].precedes(heap[parent]) else { break }
        heap.swapAt(parent, smaller)
        parent = smaller
      }
    }
  }
}
