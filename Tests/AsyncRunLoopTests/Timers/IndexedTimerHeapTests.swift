import Testing

@testable import AsyncRunLoop

/// The indexed timer heap as a plain value: no loop, no thread, no clock.
@Suite("IndexedTimerHeap")
struct IndexedTimerHeapTests {
  /// A heap element that carries a name, so tests can say which entry came out.
  final class Handle: TimerHeapElement {
    @exclusivity(unchecked) var heapSlot = -1
    let name: Int
    init(_ name: Int) { self.name = name }
  }

  typealias Heap = IndexedTimerHeap<Handle>

  /// SplitMix64: a small deterministic generator, so "random" runs are the same every time.
  struct SplitMix64: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
      state &+= 0x9E37_79B9_7F4A_7C15
      var z = state
      z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
      z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
      return z ^ (z >> 31)
    }
  }

  /// Pops every entry; returns the names in the order they came out.
  static func drain(_ heap: inout Heap) -> [Int] {
    var names: [Int] = []
    while let entry = heap.popFirst() {
      #expect(entry.element.heapSlot == -1)
      names.append(entry.element.name)
    }
    return names
  }

  /// The first broken invariant (heap order, or an element's index not pointing at its own
  /// entry), or nil.
  static func brokenInvariant(_ heap: Heap) -> String? {
    let entries = heap.entries
    for (index, entry) in entries.enumerated() {
      if heap.index(of: entry.element) != index {
        let found = heap.index(of: entry.element).map(String.init) ?? "nowhere"
        return "element \(entry.element.name) at \(index) is found at \(found)"
      }
      let children = (1...Heap.arity).map { Heap.arity * index + $0 }
      for child in children where child < entries.count && entries[child].precedes(entry) {
        return "entry \(child) precedes its parent \(index)"
      }
    }
    return nil
  }

  static func expectConsistent(_ heap: Heap, sourceLocation: SourceLocation = #_sourceLocation) {
    #expect(brokenInvariant(heap) == nil, sourceLocation: sourceLocation)
  }

  /// `heap.remove(handle)`, callable inside `#expect` (which cannot call a mutating method).
  static func remove(_ handle: Handle, from heap: inout Heap) -> Bool { heap.remove(handle) }

  /// Inserts `deadlines` with sequence = position, element names = position.
  static func heap(deadlines: [Int64]) -> (Heap, [Handle]) {
    var heap = Heap()
    let handles = deadlines.indices.map(Handle.init)
    for (index, deadline) in deadlines.enumerated() {
      heap.insert(handles[index], deadline: deadline, sequence: UInt64(index))
    }
    return (heap, handles)
  }

  @Test func popsInDeadlineOrder() {
    var (heap, _) = Self.heap(deadlines: [50, 10, 40, 20, 30])
    #expect(heap.count == 5)
    #expect(heap.first?.deadline == 10)
    Self.expectConsistent(heap)
    #expect(Self.drain(&heap) == [1, 3, 4, 2, 0])
    #expect(heap.isEmpty)
  }

  @Test func equalDeadlinesComeOutInSequenceOrder() {
    // Deadlines 50, 30, 50, 30, 50, 30: the sequence number breaks each tie.
    var (heap, _) = Self.heap(deadlines: [50, 30, 50, 30, 50, 30])
    #expect(Self.drain(&heap) == [1, 3, 5, 0, 2, 4])
  }

  @Test func removesTheHeadAnEntryInTheMiddleAndTheTail() {
    var (heap, handles) = Self.heap(deadlines: [10, 20, 30, 40, 50, 60, 70])
    #expect(Self.remove(handles[0], from: &heap))  // the head
    Self.expectConsistent(heap)
    #expect(heap.first?.element === handles[1])
    #expect(Self.remove(handles[3], from: &heap))  // in the middle
    Self.expectConsistent(heap)
    let tail = heap.entries.last!.element
    #expect(Self.remove(tail, from: &heap))  // the last slot
    Self.expectConsistent(heap)
    for handle in [handles[0], handles[3], tail] { #expect(handle.heapSlot == -1) }
    #expect(heap.count == 4)
    #expect(Self.drain(&heap) == [1, 2, 4, 5, 6].filter { $0 != tail.name })
  }

  @Test func removingAnEntryThatMustMoveUpKeepsOrder() {
    // The last entry (deadline 5, under the right subtree) replaces an entry in the left subtree
    // and must rise above its new parent.
    var (heap, handles) = Self.heap(deadlines: [0, 100, 1, 101, 102, 2, 3, 103, 104, 105, 106, 4, 5])
    #expect(heap.entries.last?.deadline == 5)
    #expect(Self.remove(handles[7], from: &heap))
    Self.expectConsistent(heap)
    #expect(Self.remove(handles[3], from: &heap))
    Self.expectConsistent(heap)
    #expect(Self.drain(&heap).count == 11)
  }

  @Test func updateMovesAnEntryUpAndDown() {
    var (heap, handles) = Self.heap(deadlines: [10, 20, 30, 40, 50])
    heap.update(handles[4], deadline: 5, sequence: 10)  // up, to the head
    Self.expectConsistent(heap)
    #expect(heap.first?.element === handles[4])
    heap.update(handles[4], deadline: 100, sequence: 11)  // down, to the end
    Self.expectConsistent(heap)
    heap.update(handles[2], deadline: 30, sequence: 12)  // same deadline, later sequence: stays
    Self.expectConsistent(heap)
    #expect(heap.entry(for: handles[2])?.sequence == 12)
    #expect(Self.drain(&heap) == [0, 1, 2, 3, 4])
  }

  @Test func updateToAnEqualDeadlineOrdersBySequence() {
    var (heap, handles) = Self.heap(deadlines: [10, 10, 10])
    heap.update(handles[0], deadline: 10, sequence: 3)  // rescheduled last: comes out last
    #expect(Self.drain(&heap) == [1, 2, 0])
  }

  @Test func deadlineAfterFirstIsTheEarliestOtherDeadline() {
    var (heap, handles) = Self.heap(deadlines: [30])
    #expect(heap.deadlineAfterFirst == nil)
    heap.insert(Handle(1), deadline: 50, sequence: 1)
    #expect(heap.deadlineAfterFirst == 50)
    heap.insert(Handle(2), deadline: 40, sequence: 2)
    #expect(heap.deadlineAfterFirst == 40)
    heap.remove(handles[0])
    #expect(heap.first?.deadline == 40)
    #expect(heap.deadlineAfterFirst == 50)
  }

  @Test func removingANonMemberIsANoOp() {
    var (heap, _) = Self.heap(deadlines: [10, 20, 30])
    let stranger = Handle(99)
    #expect(!Self.remove(stranger, from: &heap))
    #expect(stranger.heapSlot == -1)
    // An element of another heap has an index that is in range here: still not a member.
    var (other, otherHandles) = Self.heap(deadlines: [1, 2])
    #expect(!heap.contains(otherHandles[1]))
    #expect(!Self.remove(otherHandles[1], from: &heap))
    #expect(other.contains(otherHandles[1]))
    #expect(heap.count == 3)
    Self.expectConsistent(heap)
    Self.expectConsistent(other)
    // Removing twice: the second time is a no-op.
    #expect(Self.remove(otherHandles[0], from: &other))
    #expect(!Self.remove(otherHandles[0], from: &other))
    #expect(Self.drain(&other) == [1])
  }

  @Test func removeAllResetsEveryIndex() {
    var (heap, handles) = Self.heap(deadlines: [5, 3, 8, 1])
    #expect(Set(heap.elements.map(\.name)) == [0, 1, 2, 3])
    heap.removeAll()
    #expect(heap.isEmpty)
    #expect(heap.first == nil)
    for handle in handles { #expect(handle.heapSlot == -1) }
    // The elements can be scheduled again.
    heap.insert(handles[2], deadline: 7, sequence: 9)
    #expect(heap.first?.element === handles[2])
  }

  @Test func poppedElementsCanBeInsertedAgain() {
    var (heap, handles) = Self.heap(deadlines: [10, 20])
    let popped = heap.popFirst()
    #expect(popped?.element === handles[0])
    heap.insert(handles[0], deadline: 30, sequence: 2)
    Self.expectConsistent(heap)
    #expect(Self.drain(&heap) == [1, 0])
  }

  /// Thousands of random inserts, removes, updates and pops, checked after every step against a
  /// model kept as a sorted array of (deadline, sequence, name).
  ///
  /// 2,000 steps (more under stress), their checks collected and reported once: 6,000 steps of
  /// seven `#expect`s each kept a cooperative-pool thread busy for seconds in a debug build,
  /// which, with another test blocking the other of a 2-core machine's two, stalled every async
  /// test past its watchdog.
  @Test func randomOperationsMatchASortedArrayModel() {
    var failures: [String] = []
    func check(_ holds: Bool, _ what: @autoclosure () -> String, step: Int) {
      if !holds && failures.count < 10 { failures.append("step \(step): \(what())") }
    }
    typealias Key = (deadline: Int64, sequence: UInt64, name: Int)
    var generator = SplitMix64(state: 0x5EED)
    var heap = Heap()
    var model: [Key] = []
    let handles = (0..<300).map(Handle.init)
    var sequence: UInt64 = 0
    func nextKey(_ name: Int) -> Key {
      sequence += 1
      return (Int64.random(in: 0..<200, using: &generator), sequence, name)  // many ties on purpose
    }
    func sortModel() { model.sort { ($0.deadline, $0.sequence) < ($1.deadline, $1.sequence) } }

    for step in 0..<(2_000 * stressFactor) {
      let handle = handles.randomElement(using: &generator)!
      let isMember = model.contains { $0.name == handle.name }
      switch Int.random(in: 0..<10, using: &generator) {
      case 0..<4:  // insert (or, for a member, update)
        let key = nextKey(handle.name)
        if isMember {
          heap.update(handle, deadline: key.deadline, sequence: key.sequence)
          model.removeAll { $0.name == handle.name }
        } else {
          heap.insert(handle, deadline: key.deadline, sequence: key.sequence)
        }
        model.append(key)
        sortModel()
      case 4..<6:  // remove, member or not
        check(Self.remove(handle, from: &heap) == isMember, "remove of \(handle.name)", step: step)
        model.removeAll { $0.name == handle.name }
      case 6..<8:  // update a member
        guard isMember else { continue }
        let key = nextKey(handle.name)
        heap.update(handle, deadline: key.deadline, sequence: key.sequence)
        model.removeAll { $0.name == handle.name }
        model.append(key)
        sortModel()
      default:  // pop
        let popped = heap.popFirst()
        let expected = model.isEmpty ? nil : model.removeFirst()
        check(popped?.element.name == expected?.name, "popped \(String(describing: popped?.element.name))", step: step)
        check(popped?.deadline == expected?.deadline, "popped deadline", step: step)
      }
      if let broken = Self.brokenInvariant(heap) { check(false, broken, step: step) }
      check(heap.count == model.count, "count \(heap.count) != \(model.count)", step: step)
      check(heap.first?.element.name == model.first?.name, "first", step: step)
      let others = model.dropFirst().map(\.deadline)
      check(heap.deadlineAfterFirst.map { $0 == others.min() } ?? others.isEmpty, "deadline after first", step: step)
      let members = Set(model.map(\.name))
      check(handles.allSatisfy { members.contains($0.name) || $0.heapSlot == -1 }, "slots of non-members", step: step)
    }
    #expect(failures.isEmpty, "\(failures)")
    #expect(Self.drain(&heap) == model.map(\.name))
  }
}
