/// The blocks (`perform`) the loop's thread took from its inbox and has not run yet. Loop thread
/// only (a part of `LoopCore`).
///
/// Invariants:
/// - `slots` holds the blocks in arrival order; a nil slot ran already. `liveCount` counts the
///   others.
/// - A block runs only in a mode it names (`PerformRequest.canRun`), and only once every change
///   that arrived before it was applied (it is numbered before the change barrier); the others
///   stay, in order.
/// - A run nested in a block scans the same slots (a scan is a cursor, `index`, over them), so a
///   block never runs twice and blocks keep their order across nesting levels. Slots are only
///   compacted when the outermost scan ends (`scanDepth` returns to 0): an outer scan's cursor
///   stays valid.
/// - No method calls out: a scan takes a block, then the loop runs it outside any access to the
///   queue.
struct LoopBlockQueue {
  private(set) var slots: [PerformRequest?] = []
  /// The blocks in `slots` that have not run.
  private(set) var liveCount = 0
  /// Chunks taken from the inbox, appended to `slots` once the lock is released.
  private var arrived: [[PerformRequest]] = []
  /// A taken chunk kept (emptied) to hand the inbox its next chunk with capacity.
  private var spareChunk: [PerformRequest] = []
  /// How many scans are on the stack.
  private var scanDepth = 0

  /// No block waits.
  @inline(__always)
  var isEmpty: Bool { liveCount == 0 }

  /// Under the inbox lock: moves the inbox's blocks out in chunks; true when it took any (call
  /// `adoptArrived()` once the lock is released).
  @inline(__always)
  mutating func take(from inbox: inout ChunkedQueue<PerformRequest>) -> Bool {
    guard !inbox.isEmpty else { return false }
    inbox.takeAll(appendingTo: &arrived, spare: &spareChunk)
    return true
  }

  /// Appends the chunks `take(from:)` moved out behind the blocks waiting, outside the inbox lock.
  mutating func adoptArrived() {
    for chunk in arrived {
      for request in chunk { slots.append(request) }
      liveCount += chunk.count
    }
    if !arrived.isEmpty { ChunkedQueue.recycle(&arrived[arrived.count - 1], asSpare: &spareChunk) }
    arrived.removeAll(keepingCapacity: true)
  }

  /// Whether a block may run in `mode` now (`inCommon`: `mode` is in the common set), having
  /// arrived before `barrier`.
  func hasRunnable(in mode: RunLoopMode, inCommon: Bool, before barrier: UInt64) -> Bool {
    guard liveCount > 0 else { return false }
    return slots.contains { request in
      guard let request else { return false }
      return request.sequence < barrier && request.canRun(in: mode, inCommon: inCommon)
    }
  }

  /// A scan begins; its cursor starts at 0.
  @inline(__always)
  mutating func beginScan() { scanDepth += 1 }

  /// The next block from `index` on that may run in `mode` and arrived before `barrier`, taken
  /// out of its slot; `index` moves past it. nil at the end of the slots.
  mutating func takeNext(
    from index: inout Int, in mode: RunLoopMode, inCommon: Bool, before barrier: UInt64
  ) -> PerformRequest? {
    while index < slots.count {
      defer { index += 1 }
      if let request = slots[index], request.sequence < barrier, request.canRun(in: mode, inCommon: inCommon) {
        slots[index] = nil
        liveCount -= 1
        return request
      }
    }
    return nil
  }

  /// A scan ended. The outermost one drops the slots that ran (all of them when none is left,
  /// otherwise once they outnumber the rest well: compacting is O(slots)).
  mutating func endScan() {
    scanDepth -= 1
    guard scanDepth == 0 else { return }  // a scan further out still walks the slots
    if liveCount == 0 {
      slots.removeAll(keepingCapacity: true)
    } else if slots.count > 2 * liveCount + 16 {
      slots.removeAll { $0 == nil }
    }
  }

  /// Takes every block not run yet, oldest first (whatever its modes), leaving the queue empty.
  mutating func takeAll() -> [PerformRequest] {
    defer { removeAll() }
    return slots.compactMap { $0 }
  }

  /// Drops every block (the loop has terminated).
  mutating func removeAll() {
    slots.removeAll()
    liveCount = 0
  }
}

extension PerformRequest {
  /// Whether the block may run during a pass in `mode` (`inCommon`: `mode` is in the common set).
  @inline(__always)
  func canRun(in mode: RunLoopMode, inCommon: Bool) -> Bool {
    anyMode || modes.contains(mode) || (inCommon && modes.contains(.common))
  }
}
