import Testing

@testable import AsyncRunLoop

/// The timer heap and the repeat arithmetic as plain values: no loop, no thread, no clock.
@Suite("TimerHeap and fire-date arithmetic")
struct TimerHeapTests {
  /// A payload that says whether its entry is still live (its timer was not moved or removed).
  struct Tag: Equatable {
    var name: Int
    var isLive = true
  }

  /// Pops every entry, in heap order.
  static func drain(_ heap: inout TimerHeap<Tag>) -> [(deadline: Int64, name: Int)] {
    var popped: [(deadline: Int64, name: Int)] = []
    while let entry = heap.popFirst() { popped.append((entry.deadline, entry.payload.name)) }
    return popped
  }

  /// A small deterministic generator (xorshift64*), so "random" heaps are the same on every run.
  struct SeededGenerator: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
      state ^= state >> 12
      state ^= state << 25
      state ^= state >> 27
      return state &* 2_685_821_657_736_338_717
    }
  }

  @Test func equalDeadlinesFireInInsertionOrder() {
    var heap = TimerHeap<Tag>()
    // Deadlines 50, 30, 50, 30, 50, 30: the sequence number breaks each tie.
    for index in 0..<6 {
      heap.push(deadline: index.isMultiple(of: 2) ? 50 : 30, sequence: UInt64(index), payload: Tag(name: index))
    }
    let popped = Self.drain(&heap)
    #expect(popped.map(\.name) == [1, 3, 5, 0, 2, 4])
    #expect(popped.map(\.deadline) == [30, 30, 30, 50, 50, 50])
    #expect(heap.isEmpty)
  }

  @Test func popsInDeadlineThenSequenceOrder() {
    var generator = SeededGenerator(state: 0x9E37_79B9_7F4A_7C15)
    var heap = TimerHeap<Tag>()
    var pushed: [(deadline: Int64, sequence: UInt64)] = []
    for index in 0..<500 {
      let deadline = Int64.random(in: 0..<40, using: &generator)  // many ties on purpose
      heap.push(deadline: deadline, sequence: UInt64(index), payload: Tag(name: index))
      pushed.append((deadline, UInt64(index)))
    }
    #expect(heap.count == 500)
    let expected = pushed.sorted { ($0.deadline, $0.sequence) < ($1.deadline, $1.sequence) }.map { Int($0.sequence) }
    #expect(Self.drain(&heap).map(\.name) == expected)
  }

  @Test func staleEntriesAreDroppedFromTheHead() {
    var heap = TimerHeap<Tag>()
    heap.push(deadline: 10, sequence: 0, payload: Tag(name: 0, isLive: false))
    heap.push(deadline: 20, sequence: 1, payload: Tag(name: 1, isLive: false))
    heap.push(deadline: 30, sequence: 2, payload: Tag(name: 2))
    heap.push(deadline: 40, sequence: 3, payload: Tag(name: 3, isLive: false))
    heap.dropStaleHead { $0.payload.isLive }
    #expect(heap.first?.payload.name == 2)
    // Only the head is cleaned: the stale entry behind a live one stays until it reaches the top.
    #expect(heap.count == 2)
  }

  @Test func droppingStaleEntriesCanEmptyTheHeap() {
    var heap = TimerHeap<Tag>()
    for index in 0..<5 {
      heap.push(deadline: Int64(index), sequence: UInt64(index), payload: Tag(name: index, isLive: false))
    }
    heap.dropStaleHead { $0.payload.isLive }
    #expect(heap.isEmpty)
    #expect(heap.first == nil)
    heap.dropStaleHead { _ in
      Issue.record("an empty heap has no head to test"); return true
    }
  }

  @Test func compactionKeepsOrderAndDropsOnlyStaleEntries() {
    var generator = SeededGenerator(state: 42)
    var heap = TimerHeap<Tag>()
    var live: [(deadline: Int64, sequence: UInt64)] = []
    for index in 0..<300 {
      let deadline = Int64.random(in: -1_000...1_000, using: &generator)
      let isLive = Bool.random(using: &generator)
      heap.push(deadline: deadline, sequence: UInt64(index), payload: Tag(name: index, isLive: isLive))
      if isLive { live.append((deadline, UInt64(index))) }
    }
    heap.compact { $0.payload.isLive }
    #expect(heap.count == live.count)
    let expected = live.sorted { ($0.deadline, $0.sequence) < ($1.deadline, $1.sequence) }.map { Int($0.sequence) }
    #expect(Self.drain(&heap).map(\.name) == expected)
  }

  @Test func compactionOfSmallHeaps() {
    var heap = TimerHeap<Tag>()
    heap.compact { $0.payload.isLive }
    #expect(heap.isEmpty)
    heap.push(deadline: 5, sequence: 0, payload: Tag(name: 0, isLive: false))
    heap.push(deadline: 1, sequence: 1, payload: Tag(name: 1))
    heap.compact { $0.payload.isLive }
    #expect(Self.drain(&heap).map(\.name) == [1])
  }

  @Test func deadlineAfterFirstIsTheSecondSmallestDeadline() {
    var heap = TimerHeap<Tag>()
    #expect(heap.deadlineAfterFirst == nil)
    heap.push(deadline: 100, sequence: 0, payload: Tag(name: 0))
    #expect(heap.deadlineAfterFirst == nil)
    heap.push(deadline: 70, sequence: 1, payload: Tag(name: 1))
    #expect(heap.first?.deadline == 70)
    #expect(heap.deadlineAfterFirst == 100)

    var generator = SeededGenerator(state: 7)
    for round in 0..<50 {
      var random = TimerHeap<Tag>()
      var deadlines: [Int64] = []
      for index in 0..<(2 + round) {
        let deadline = Int64.random(in: 0..<1_000, using: &generator)
        random.push(deadline: deadline, sequence: UInt64(index), payload: Tag(name: index))
        deadlines.append(deadline)
      }
      let sorted = deadlines.sorted()
      #expect(random.first?.deadline == sorted[0])
      #expect(random.deadlineAfterFirst == sorted[1])
    }
  }

  @Test func removeAllEmptiesTheHeap() {
    var heap = TimerHeap<Tag>()
    for index in 0..<10 { heap.push(deadline: 1, sequence: UInt64(index), payload: Tag(name: index)) }
    heap.removeAll()
    #expect(heap.isEmpty)
    #expect(heap.popFirst() == nil)
  }

  // MARK: LoopTimer.nextFireDate(after:interval:now:)

  @Test func onTimeFireMovesOneIntervalAlongTheGrid() {
    #expect(LoopTimer.nextFireDate(after: 1_000, interval: 100, now: 1_000) == 1_100)
    #expect(LoopTimer.nextFireDate(after: 1_000, interval: 100, now: 1_099) == 1_100)
    // A fire handled a little late still stays on the grid (no drift).
    #expect(LoopTimer.nextFireDate(after: 1_000, interval: 100, now: 1_042) == 1_100)
  }

  @Test func missedFiresCollapseToTheNextFutureGridPoint() {
    // Fired at 1 000 with grid 100, handled at 1 350: 1 100, 1 200 and 1 300 are skipped.
    #expect(LoopTimer.nextFireDate(after: 1_000, interval: 100, now: 1_350) == 1_400)
    // A "now" exactly on a grid point: the next point lies strictly after it.
    #expect(LoopTimer.nextFireDate(after: 1_000, interval: 100, now: 1_100) == 1_200)
    #expect(LoopTimer.nextFireDate(after: 1_000, interval: 100, now: 1_400) == 1_500)
    // Every answer is on the grid and in the future.
    for now in stride(from: Int64(1_000), through: 5_000, by: 37) {
      let next = LoopTimer.nextFireDate(after: 1_000, interval: 100, now: now)
      #expect(next > now)
      #expect(next - now <= 100)
      #expect((next - 1_000) % 100 == 0)
    }
  }

  @Test func zeroIntervalFiresAgainAtNow() {
    #expect(LoopTimer.nextFireDate(after: 1_000, interval: 0, now: 1_500) == 1_500)
    #expect(LoopTimer.nextFireDate(after: 1_000, interval: 0, now: 1_000) == 1_000)
    // Never moves backwards.
    #expect(LoopTimer.nextFireDate(after: 2_000, interval: 0, now: 1_500) == 2_000)
  }

  @Test func arithmeticSaturatesNearInt64Max() {
    #expect(LoopTimer.nextFireDate(after: .max - 10, interval: 100, now: .max - 20) == .max)
    #expect(LoopTimer.nextFireDate(after: .max, interval: 1, now: 0) == .max)
    // (missed + 1) × interval overflows: saturate rather than wrap into the past.
    #expect(LoopTimer.nextFireDate(after: 0, interval: .max / 2, now: .max - 1) == .max)
    // A huge interval from a normal date.
    #expect(LoopTimer.nextFireDate(after: 1_000, interval: .max, now: 2_000) == .max)
  }

  @Test func fireDateFarInThePastStillGivesTheNextGridPoint() {
    // A repeating timer created with a huge negative delay starts at Int64.min (saturated):
    // `now - fireDate` does not fit in Int64, yet the next fire must be the next grid point,
    // not "never".
    for (fireDate, interval, now) in [
      (Int64.min, Int64(1_000_000_000), Int64(123_456_789_012)), (Int64.min + 5, 3, 10), (-9_000, 7, 9_000),
    ] {
      let next = LoopTimer.nextFireDate(after: fireDate, interval: interval, now: now)
      #expect(next > now)
      #expect(next - now <= interval)
      // On the grid: (next - fireDate) is a multiple of interval (computed without overflow).
      #expect(UInt64(bitPattern: next &- fireDate) % UInt64(interval) == 0)
    }
  }
}
