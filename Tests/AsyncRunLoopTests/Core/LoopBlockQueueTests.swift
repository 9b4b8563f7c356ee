import Testing

@testable import AsyncRunLoop

/// `LoopBlockQueue` as a plain value: blocks run in arrival order, only in their modes and only
/// before the change barrier; a nested scan continues the same slots; slots are compacted only by
/// the outermost scan.
@Suite struct LoopBlockQueueTests {
  static func request(_ sequence: UInt64, _ modes: [RunLoopMode] = [.default]) -> PerformRequest {
    PerformRequest(modes: modes, block: {}, sequence: sequence)
  }

  static func queue(_ requests: [PerformRequest]) -> LoopBlockQueue {
    var inbox = ChunkedQueue<PerformRequest>()
    for request in requests { inbox.append(request) }
    var queue = LoopBlockQueue()
    if queue.take(from: &inbox) { queue.adoptArrived() }
    return queue
  }

  static func scan(
    _ queue: inout LoopBlockQueue, in mode: RunLoopMode = .default, inCommon: Bool = true,
    before barrier: UInt64 = .max
  ) -> [UInt64] {
    var index = 0
    var ran: [UInt64] = []
    queue.beginScan()
    while let request = queue.takeNext(from: &index, in: mode, inCommon: inCommon, before: barrier) {
      ran.append(request.sequence)
    }
    queue.endScan()
    return ran
  }

  @Test func blocksRunInArrivalOrderOnlyInTheirModes() {
    let other = RunLoopMode("other")
    var queue = Self.queue([
      Self.request(1), Self.request(2, [other]), Self.request(3, [.common]), Self.request(4, [other, .default]),
    ])
    #expect(queue.liveCount == 4)
    let inDefault = Self.scan(&queue)
    #expect(inDefault == [1, 3, 4])
    #expect(queue.hasRunnable(in: other, inCommon: false, before: .max))
    let inOther = Self.scan(&queue, in: other, inCommon: false)
    #expect(inOther == [2])
    #expect(queue.isEmpty)
    #expect(queue.slots.isEmpty)  // the outermost scan ended with nothing left: dropped
  }

  /// A block sent after a change that still waits stays; those sent before it run.
  @Test func blocksAfterTheBarrierWait() {
    var queue = Self.queue([Self.request(1), Self.request(5), Self.request(2)])
    let ran = Self.scan(&queue, before: 3)
    #expect(ran == [1, 2])
    #expect(!queue.hasRunnable(in: .default, inCommon: true, before: 3))
    #expect(queue.hasRunnable(in: .default, inCommon: true, before: 6))
    let later = Self.scan(&queue, before: 6)
    #expect(later == [5])
  }

  /// A scan nested in a block (a nested run) continues the same slots: no block runs twice, and
  /// the outer scan's cursor stays valid (no compaction until it ends).
  @Test func aNestedScanContinuesTheSameSlots() {
    var queue = Self.queue((1...4).map { Self.request($0) })
    var outer = 0
    var ran: [UInt64] = []
    queue.beginScan()
    if let first = queue.takeNext(from: &outer, in: .default, inCommon: true, before: .max) {
      ran.append(first.sequence)
      ran += Self.scan(&queue)  // the nested run, inside block 1
    }
    #expect(queue.slots.count == 4)  // not compacted under the outer cursor
    while let request = queue.takeNext(from: &outer, in: .default, inCommon: true, before: .max) {
      ran.append(request.sequence)
    }
    queue.endScan()
    #expect(ran == [1, 2, 3, 4])
    #expect(queue.slots.isEmpty)
  }

  @Test func takeAllReturnsTheBlocksNotRunWhateverTheirModes() {
    var queue = Self.queue([Self.request(1), Self.request(2, [RunLoopMode("other")]), Self.request(3)])
    _ = Self.scan(&queue, before: 2)
    let rest = queue.takeAll().map(\.sequence)
    #expect(rest == [2, 3])
    #expect(queue.isEmpty && queue.slots.isEmpty)
  }
}
