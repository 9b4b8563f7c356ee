import Testing

@testable import AsyncRunLoop

/// `LoopJobQueue` as a plain value: a batch taken whole from the inbox, run oldest first from a
/// cursor, never replaced while a job runs, and stopped at the first job that waits for a change.
@Suite struct LoopJobQueueTests {
  /// A stand-in job: only its arrival number matters to the queue.
  struct Job: NumberedArrival, Equatable {
    let sequence: UInt64
  }

  static func inbox(_ sequences: some Sequence<UInt64>) -> ChunkedQueue<Job> {
    var inbox = ChunkedQueue<Job>()
    for sequence in sequences { inbox.append(Job(sequence: sequence)) }
    return inbox
  }

  static func drain(_ queue: inout LoopJobQueue<Job>, before barrier: UInt64 = .max, limit: Int = 1 << 30) -> [UInt64] {
    let end = queue.end(runningAtMost: limit)
    var taken: [UInt64] = []
    while let job = queue.takeNext(before: barrier, end: end) { taken.append(job.sequence) }
    return taken
  }

  @Test func jobsRunOldestFirstAndAtMostTheLimitPerCall() {
    var queue = LoopJobQueue<Job>()
    var inbox = Self.inbox(1...5)
    let prepared = queue.prepareForNewBatch()
    #expect(prepared)
    let needsAdopting = queue.take(from: &inbox)
    #expect(!needsAdopting)  // one chunk: swapped in O(1)
    #expect(inbox.isEmpty)
    let first = Self.drain(&queue, limit: 3)
    let rest = Self.drain(&queue, limit: 3)
    #expect(first == [1, 2, 3])
    #expect(rest == [4, 5])
    #expect(!queue.hasLeft)
  }

  /// A burst that filled several of the inbox's chunks arrives whole, in order, once adopted.
  @Test func aBurstOfChunksIsAdoptedInOrder() {
    let count = 2 * ChunkedQueue<Job>.chunkCapacity + 7
    var queue = LoopJobQueue<Job>()
    var inbox = Self.inbox(1...UInt64(count))
    let prepared = queue.prepareForNewBatch()
    #expect(prepared)
    let needsAdopting = queue.take(from: &inbox)
    #expect(needsAdopting)
    queue.adoptArrived()
    let taken = Self.drain(&queue)
    #expect(taken == Array(1...UInt64(count)))
  }

  /// No new batch while one is unfinished or a job runs: a run nested in a job cannot swap the
  /// batch under the loop iterating it.
  @Test func noNewBatchWhileJobsAreLeftOrAJobRuns() {
    var queue = LoopJobQueue<Job>()
    var inbox = Self.inbox([1, 2])
    _ = queue.prepareForNewBatch()
    _ = queue.take(from: &inbox)
    let one = Self.drain(&queue, limit: 1)
    #expect(one == [1])
    let whileJobsAreLeft = queue.prepareForNewBatch()  // job 2 is left
    _ = Self.drain(&queue)
    queue.depth = 1  // inside a job
    let insideAJob = queue.prepareForNewBatch()
    #expect(!queue.mayRun)
    queue.depth = 0
    let afterwards = queue.prepareForNewBatch()
    #expect(!whileJobsAreLeft && !insideAJob && afterwards)
    #expect(queue.batch.isEmpty && queue.cursor == 0)
  }

  /// The first job numbered at or after the change barrier stops the run: it and every later job
  /// wait, also ones that would be numbered before it.
  @Test func theFirstJobAfterAWaitingChangeHoldsTheRestBack() {
    var queue = LoopJobQueue<Job>()
    var inbox = Self.inbox([3, 5, 9, 4])
    _ = queue.prepareForNewBatch()
    _ = queue.take(from: &inbox)
    let beforeSix = Self.drain(&queue, before: 6)
    #expect(beforeSix == [3, 5])
    #expect(!queue.hasRunnable(before: 6))
    #expect(queue.hasRunnable(before: .max))
    let rest = Self.drain(&queue)
    #expect(rest == [9, 4])
  }

  @Test func theRemainingJobsAreTakenInOrder() {
    var queue = LoopJobQueue<Job>()
    var inbox = Self.inbox(1...4)
    _ = queue.prepareForNewBatch()
    _ = queue.take(from: &inbox)
    _ = Self.drain(&queue, limit: 1)
    let remaining = Array(queue.remaining.map(\.sequence))
    let rest = queue.takeRemaining()
    let taken = rest.map(\.sequence)
    #expect(remaining == [2, 3, 4])
    #expect(taken == [2, 3, 4])
    #expect(!queue.hasLeft)
  }
}
