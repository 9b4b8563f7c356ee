import Glibc
import Testing

@testable import AsyncRunLoop

/// The inbox's job queue in chunks (`ChunkedQueue`): a burst of executor jobs never grows and
/// copies one array under the inbox lock, and still runs in the order it was enqueued, each job
/// once, also when a current loop's run ends with jobs it took and did not run.
@Suite("Bursts of executor jobs", .serialized, .timeLimit(.minutes(10)))
struct JobBurstTests {
  /// The queue's two ways of handing the loop its elements: one chunk swapped whole in O(1) (the
  /// spare array becoming the new tail), or refused once chunks were set aside; and chunks put
  /// back in front of what arrived meanwhile.
  @Test func oneChunkIsSwappedAndChunksPutBackGoFirst() {
    let capacity = ChunkedQueue<Int>.chunkCapacity
    var queue = ChunkedQueue<Int>()
    for value in 0..<10 { queue.append(value) }
    var batch: [Int] = []
    batch.reserveCapacity(64)
    let swapped = queue.takeTail(swappingWith: &batch)
    let tailCapacity = queue.tail.capacity
    #expect(swapped)
    #expect(batch == Array(0..<10))
    #expect(queue.isEmpty)
    #expect(tailCapacity >= 64)  // the batch's storage is the queue's tail now

    for value in 0..<(2 * capacity + 5) { queue.append(value) }
    var empty: [Int] = []
    let swappedBurst = queue.takeTail(swappingWith: &empty)
    #expect(!swappedBurst)
    #expect(queue.count == 2 * capacity + 5)  // unchanged
    var taken: [[Int]] = []
    var spare: [Int] = []
    queue.takeAll(appendingTo: &taken, spare: &spare)
    #expect(taken.flatMap { $0 } == Array(0..<(2 * capacity + 5)))

    // Jobs taken and not run go back ahead of the ones that arrived since.
    for value in 10_000..<10_003 { queue.append(value) }
    let leftover = ChunkedQueue<Int>.chunks(of: Array(0..<(capacity + 7)))
    #expect(leftover.map(\.count) == [capacity, 7])
    queue.prepend(leftover)
    #expect(queue.elements == Array(0..<(capacity + 7)) + [10_000, 10_001, 10_002])
    #expect(queue.count == capacity + 10)
    queue.append(20_000)
    var again: [[Int]] = []
    queue.takeAll(appendingTo: &again, spare: &spare)
    #expect(again.flatMap { $0 } == Array(0..<(capacity + 7)) + [10_000, 10_001, 10_002, 20_000])
    #expect(queue.isEmpty)

    // Into an empty queue, one chunk becomes its tail.
    queue.prepend(ChunkedQueue<Int>.chunks(of: [1, 2, 3]))
    queue.append(4)
    #expect(queue.fullChunks.isEmpty)
    #expect(queue.elements == [1, 2, 3, 4])
  }

  /// 3,500 jobs enqueued from one task while the loop is held in a block wait in several chunks
  /// (no array grown and copied under the lock); released, the loop runs every one once, in the
  /// order enqueued, on its thread.
  @Test func aBurstOfJobsWhileTheLoopIsBusyRunsInOrderOnce() async throws {
    let loop = try RunLoopThread(name: "job-burst")
    defer { loop.shutdown() }
    let count = 3_500
    let order = Guarded<[Int]>([])
    let offThread = AtomicCounter()
    let release = blockLoop(loop)
    let tasks = (0..<count).map { index in
      Task(executorPreference: loop) {
        if !loop.isOnLoopThread { offThread.increment() }
        order.withLock { $0.append(index) }
      }
    }
    let chunksWaiting = await execOnNewThread { () -> Int in
      waitUntil("the jobs waiting") { loop.shared.inboxLock.withLock { loop.shared.inbox.jobs.count } >= count }
      return loop.shared.inboxLock.withLock { loop.shared.inbox.jobs.fullChunks.count }
    }
    release.open()
    let done: Void? = try await withWatchdog(timeout: .seconds(20), "every job") {
      for task in tasks { await task.value }
    }
    #expect(done != nil)
    #expect(chunksWaiting == count / ChunkedQueue<LoopJob>.chunkCapacity)
    #expect(order.snapshot == Array(0..<count), "the jobs ran out of order, or not once each")
    #expect(offThread.current == 0)
  }

  /// A current loop's run takes a burst of 6,000 jobs, and a stop from the first ends it after one
  /// pass's share (three work points of 1,024 jobs): the rest (three chunks' worth) go back to
  /// the front of the inbox, ahead of 500 jobs enqueued after the run ended. The next run runs all of them, in the order enqueued,
  /// once each.
  @Test func jobsACurrentLoopsRunLeftGoBackAheadOfLaterOnes() async throws {
    let thread = CommandedCurrentLoopThread()
    let loop = await thread.loop()
    let order = Guarded<[Int]>([])
    let first = 6_000
    let total = 6_500
    func start(_ range: Range<Int>) -> [Task<Void, Never>] {
      range.map { index in
        Task(executorPreference: loop) {
          order.withLock { $0.append(index) }
          if index == 0 || index == total - 1 { RunLoopThread.current.stop() }
        }
      }
    }
    var tasks = start(0..<first)
    _ = await execOnNewThread {
      waitUntil("the jobs waiting") { loop.shared.inboxLock.withLock { loop.shared.inbox.jobs.count } >= first }
    }
    func runUntilStopped() async -> RunLoopRunResult {
      await thread.exec { loop -> RunLoopRunResult in
        let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
        loop.add(keepAlive)
        defer { keepAlive.invalidate() }
        return loop.run(for: .seconds(20))
      }
    }
    let firstRun = await runUntilStopped()
    let ranInFirst = order.snapshot.count
    let leftWaiting = loop.shared.inboxLock.withLock { loop.shared.inbox.jobs.count }
    tasks += start(first..<total)
    let secondRun = await runUntilStopped()
    let allTasks = tasks
    let done: Void? = try await withWatchdog(timeout: .seconds(20), "every job") {
      for task in allTasks { await task.value }
    }
    thread.quit()
    #expect(done != nil)
    #expect(firstRun == .stopped)
    #expect(secondRun == .stopped)
    #expect(ranInFirst < first)  // the run ended with jobs left over
    #expect(leftWaiting == first - ranInFirst)
    #expect(order.snapshot == Array(0..<total), "the jobs ran out of order, or not once each")
    loop.shutdown()
  }
}
