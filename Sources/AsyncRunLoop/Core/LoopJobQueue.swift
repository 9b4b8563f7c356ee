/// Work that carries the inbox's sequence number of its arrival (see `LoopInbox.sequence`): it may
/// run only once every registration change numbered before it was applied (`LoopChangeQueue`).
protocol NumberedArrival {
  var sequence: UInt64 { get }
}

extension LoopJob: NumberedArrival {}
extension PerformRequest: NumberedArrival {}

/// The executor jobs the loop's thread took from its inbox and has not run yet, and how many of
/// the loop's jobs are on the stack. Loop thread only (a part of `LoopCore`). Generic over the
/// job only so that its value tests need no runtime job; the loop uses `LoopJobQueue<LoopJob>`.
///
/// Invariants:
/// - `batch[cursor...]` are the jobs taken and not run yet, oldest first; the ones before the
///   cursor ran.
/// - A new batch is taken only when the current one is used up and no job runs (`depth == 0`), so
///   a run nested in a job never swaps the batch under the loop that is iterating it.
/// - A job runs only once every change that arrived before it was applied (`takeNext(before:)`
///   stops at the first job numbered at or after the change barrier: it and every later job wait).
/// - No method calls out: the loop takes a job, then runs it outside any access to the queue.
struct LoopJobQueue<Job: NumberedArrival> {
  /// The batch being run, from `cursor`.
  private(set) var batch: [Job] = []
  private(set) var cursor = 0
  /// Chunks taken from the inbox (a burst that filled more than one), appended to `batch` once
  /// the lock is released.
  private var arrived: [[Job]] = []
  /// A taken chunk kept (emptied) to hand the inbox its next chunk with capacity.
  private var spareChunk: [Job] = []
  /// How many of the loop's jobs are on the stack: a run nested in one runs no jobs (the serial
  /// contract; see "One pass of the loop").
  var depth = 0

  init() {
    batch.reserveCapacity(256)
  }

  /// Whether jobs may run here now: not inside one of the loop's own jobs.
  @inline(__always)
  var mayRun: Bool { depth == 0 }

  /// Jobs taken and not run yet (whether or not they may run now).
  @inline(__always)
  var hasLeft: Bool { cursor < batch.count }

  /// The jobs taken and not run yet, oldest first.
  var remaining: ArraySlice<Job> { batch[cursor...] }

  /// Whether the next job may run now: no job runs, and it arrived before `barrier`.
  @inline(__always)
  func hasRunnable(before barrier: UInt64) -> Bool {
    depth == 0 && cursor < batch.count && batch[cursor].sequence < barrier
  }

  /// Before taking the inbox: true when a new batch may be taken (used up, no job runs); the used
  /// batch is then emptied, keeping its storage.
  @inline(__always)
  mutating func prepareForNewBatch() -> Bool {
    guard depth == 0, cursor >= batch.count else { return false }
    if !batch.isEmpty {
      batch.removeAll(keepingCapacity: true)
      cursor = 0
    }
    return true
  }

  /// Under the inbox lock, after `prepareForNewBatch()` said yes: takes the inbox's jobs as the new
  /// batch. The inbox's one chunk is swapped with the empty batch in O(1) (the usual case, which
  /// allocates nothing once both are warm); a burst's chunks are moved out whole, and the result
  /// is true: call `adoptArrived()` once the lock is released.
  @inline(__always)
  mutating func take(from inbox: inout ChunkedQueue<Job>) -> Bool {
    guard !inbox.isEmpty, !inbox.takeTail(swappingWith: &batch) else { return false }
    inbox.takeAll(appendingTo: &arrived, spare: &spareChunk)
    return true
  }

  /// Appends the chunks `take(from:)` moved out to the (empty) batch, outside the inbox lock.
  mutating func adoptArrived() {
    for chunk in arrived { batch.append(contentsOf: chunk) }
    if !arrived.isEmpty { ChunkedQueue.recycle(&arrived[arrived.count - 1], asSpare: &spareChunk) }
    arrived.removeAll(keepingCapacity: true)
  }

  /// Where a call that runs at most `limit` jobs stops: the batch's end or `limit` jobs on.
  @inline(__always)
  func end(runningAtMost limit: Int) -> Int { min(batch.count, cursor + limit) }

  /// The next job, moving the cursor past it; nil at `end`, or when the next job arrived at or
  /// after `barrier` (it waits for a change, and every later job with it).
  @inline(__always)
  mutating func takeNext(before barrier: UInt64, end: Int) -> Job? {
    guard cursor < end else { return nil }
    let job = batch[cursor]
    guard job.sequence < barrier else { return nil }
    cursor += 1
    return job
  }

  /// Empties the batch (keeping its storage); the caller took `remaining` first.
  mutating func discardBatch() {
    batch.removeAll(keepingCapacity: true)
    cursor = 0
  }

  /// Takes the jobs not run yet, oldest first, and empties the batch (releasing its storage).
  mutating func takeRemaining() -> ArraySlice<Job> {
    let rest = batch[cursor...]
    batch = []
    cursor = 0
    return rest
  }
}
