import Testing

@testable import AsyncRunLoop

/// `LoopChangeQueue` as a plain value: changes are applied one at a time in the order sent, the
/// barrier is the number of the oldest change not applied, a pass's bounded applications share one
/// budget that a nested run does not spend, and a nested application continues the same cursor.
@Suite struct ChangeQueueOrderTests {
  static func change(_ sequence: UInt64) -> SequencedChange {
    SequencedChange(sequence: sequence, change: .custom { _ in })
  }

  static func queue(_ sequences: some Sequence<UInt64>) -> LoopChangeQueue {
    var inbox = ChunkedQueue<SequencedChange>()
    for sequence in sequences { inbox.append(Self.change(sequence)) }
    var queue = LoopChangeQueue()
    _ = queue.take(from: &inbox)
    return queue
  }

  /// Applies (takes) changes as `LoopCore.applyControls` does, returning `appliedThrough` after
  /// each, so the order they were taken in shows.
  static func apply(
    _ queue: inout LoopChangeQueue, through: UInt64 = .max, bounded: Bool = false,
    calloutOf: ((inout LoopChangeQueue, UInt64) -> Void)? = nil
  ) -> [UInt64] {
    var allowance = queue.allowance(bounded: bounded)
    guard allowance > 0 else { return [] }
    var order: [UInt64] = []
    queue.beginApplying()
    while queue.takeNext(through: through, allowance: &allowance, bounded: bounded) != nil {
      order.append(queue.appliedThrough)
      calloutOf?(&queue, queue.appliedThrough)
    }
    queue.endApplying()
    return order
  }

  @Test func changesAreAppliedInTheOrderSentAndTheBarrierFollows() {
    var queue = Self.queue([2, 4, 7])
    #expect(queue.hasWaiting)
    #expect(queue.barrier == 2)
    let upToFive = Self.apply(&queue, through: 5)
    #expect(upToFive == [2, 4])
    #expect(queue.barrier == 7)  // blocks and jobs numbered 5 and 6 may run; 7 and later wait
    #expect(queue.mayWait(7) && !queue.mayWait(4))
    let rest = Self.apply(&queue)
    #expect(rest == [7])
    #expect(!queue.hasWaiting)
    #expect(queue.barrier == .max)
  }

  /// Changes taken later queue behind those still waiting, also across several of the inbox's
  /// chunks.
  @Test func laterArrivalsQueueBehindWaitingChanges() {
    let capacity = UInt64(ChunkedQueue<SequencedChange>.chunkCapacity)
    var queue = Self.queue(1...(capacity + 3))
    let some = Self.apply(&queue, through: 2)
    #expect(some == [1, 2])
    var inbox = ChunkedQueue<SequencedChange>()
    for sequence in (capacity + 4)...(capacity + 6) { inbox.append(Self.change(sequence)) }
    _ = queue.take(from: &inbox)
    let rest = Self.apply(&queue)
    #expect(rest == Array(3...(capacity + 6)))
  }

  /// Every bounded application of one pass draws on one budget; the next pass gets a full one.
  @Test func boundedApplicationsShareThePassBudget() {
    let perPass = LoopChangeQueue.perPass
    var queue = Self.queue(1...UInt64(3 * perPass))
    let first = Self.apply(&queue, through: UInt64(perPass / 2), bounded: true)
    let second = Self.apply(&queue, bounded: true)
    let third = Self.apply(&queue, bounded: true)
    #expect(first.count == perPass / 2)
    #expect(second.count == perPass - perPass / 2)
    #expect(third.isEmpty)  // the pass's budget is spent
    queue.beginPass()
    let nextPass = Self.apply(&queue, bounded: true)
    #expect(nextPass.count == perPass)
    let unbounded = Self.apply(&queue)
    #expect(unbounded.count == perPass)
  }

  /// A run nested in a change's callout gets a budget of its own and gives the outer pass back
  /// what it had; its application continues the outer cursor, so nothing is applied twice.
  @Test func aNestedRunContinuesTheQueueWithABudgetOfItsOwn() {
    let perPass = LoopChangeQueue.perPass
    var queue = Self.queue(1...UInt64(2 * perPass + 10))
    var nested: [UInt64] = []
    let outer = Self.apply(&queue, bounded: true) { queue, applied in
      guard applied == 3 else { return }
      let outerBudget = queue.beginRun()
      nested = Self.apply(&queue, bounded: true)
      queue.endRun(restoring: outerBudget)
    }
    #expect(nested == Array(4...UInt64(3 + perPass)))
    // The outer pass applied 1–3 before the nested run, then its own budget's rest.
    #expect(outer == Array(1...3) + Array(UInt64(4 + perPass)...UInt64(perPass + perPass)))
    #expect(queue.passBudget == 0)
    #expect(queue.barrier == UInt64(2 * perPass + 1))
  }

  @Test func theOutermostApplicationEndsTheApplyingState() {
    var queue = Self.queue([1, 2])
    var insideNested = false
    _ = Self.apply(&queue) { queue, _ in
      insideNested = queue.isApplying
      _ = Self.apply(&queue)  // a loop-thread call inside a change
      #expect(queue.depth == 1)
    }
    #expect(insideNested)
    #expect(!queue.isApplying)
    #expect(!queue.hasWaiting)
  }
}
