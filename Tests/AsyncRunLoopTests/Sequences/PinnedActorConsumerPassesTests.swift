import Synchronization
import Testing

@testable import AsyncRunLoop

/// An actor pinned to a loop that consumes a sequence of the same loop, and counts the elements it
/// received off the loop's thread (there must be none).
private actor PinnedConsumer: LoopActor {
  nonisolated let loop: RunLoopThread

  init(loop: RunLoopThread) { self.loop = loop }

  func consume(
    _ sequence: SourceSequence<Int>, count: Int, published: SharedCount? = nil
  ) async -> (received: Int, offLoop: Int) {
    var received = 0
    var offLoop = 0
    for await _ in sequence {
      received += 1
      if !loop.isOnLoopThread { offLoop += 1 }
      published?.value.store(received, ordering: .releasing)
      if received == count { break }
    }
    return (received, offLoop)
  }

  /// As `consume`, calling the iterator's `next()` itself instead of `for await` (which passes its
  /// isolation to `next(isolation:)`).
  func consumeCallingNext(_ sequence: SourceSequence<Int>, count: Int) async -> (received: Int, offLoop: Int) {
    var iterator = sequence.makeAsyncIterator()
    var received = 0
    var offLoop = 0
    while received < count, await iterator.next() != nil {
      received += 1
      if !loop.isOnLoopThread { offLoop += 1 }
    }
    return (received, offLoop)
  }
}

/// A count shared between threads: the loop's passes (counted by a `beforeTimers` observer), or
/// the elements the consumer took so far.
private final class SharedCount: Sendable {
  let value = Atomic<Int>(0)
}

/// Who drives the `PinnedConsumer`.
enum PinnedConsumerDriver: String, CaseIterable, Sendable {
  /// `Task.detached`: no task-executor preference.
  case detached
  /// `Task(executorPreference: loop)`: the consumer's own loop.
  case preferringTheLoop
  /// `Task(executorPreference: other)`: another loop. Each executor hop inside the actor fails the
  /// runtime's task-executor check and goes through the loop's queue, so this driver makes a hop
  /// per element visible as a job per element.
  case preferringAnotherLoop
}

/// An actor pinned to a loop takes a whole batch of its sequence without going back through the
/// loop for each element, and without an executor hop per element, whatever its task prefers: the
/// loop makes a few passes and runs a few jobs for the batch, not one per element. Counted, not
/// timed (issue 26; see Benchmarks/results/analysis-preference-and-futex.md).
@Suite struct PinnedActorConsumerPassesTests {
  static let elements = 3_000

  /// The loop's passes and jobs while a `PinnedConsumer` takes `elements` elements that were all
  /// posted (and released) before it started, driven as `driver` says.
  private func countsWhileConsuming(
    _ driver: PinnedConsumerDriver, callingNext: Bool = false
  ) async throws -> (passes: Int, jobs: UInt64, received: Int, offLoop: Int) {
    let loop = try RunLoopThread(name: "consumer-passes")
    let other = try RunLoopThread(name: "consumer-passes-other")
    defer {
      loop.shutdownAndWait()
      other.shutdownAndWait()
    }
    let sequence = loop.sourceSequence(of: Int.self)
    for element in 0..<Self.elements { #expect(sequence.post(element) == .enqueued) }
    let count = SharedCount()
    let observer = LoopObserver(activities: .beforeTimers) { _, _ in count.value.add(1, ordering: .relaxed) }
    loop.add(observer, to: .common)
    defer { observer.invalidate() }
    loop.setMetricsEnabled(true)
    // The source has fired (the elements are the consumer's) and the observer is in.
    try loop.performAndWait {}
    let before = (passes: count.value.load(ordering: .relaxed), jobs: loop.metrics.jobs)
    let consumer = PinnedConsumer(loop: loop)
    let elements = Self.elements
    let consume: @Sendable () async -> (received: Int, offLoop: Int) = {
      callingNext
        ? await consumer.consumeCallingNext(sequence, count: elements)
        : await consumer.consume(sequence, count: elements)
    }
    let task: Task<(received: Int, offLoop: Int), Never>
    switch driver {
    case .detached: task = Task.detached { await consume() }
    case .preferringTheLoop: task = Task(executorPreference: loop) { await consume() }
    case .preferringAnotherLoop: task = Task(executorPreference: other) { await consume() }
    }
    let outcome = try await withWatchdog("the consumer takes every element") { await task.value }
    try loop.performAndWait {}
    return (
      count.value.load(ordering: .relaxed) - before.passes, loop.metrics.jobs - before.jobs,
      outcome?.received ?? 0, outcome?.offLoop ?? 0
    )
  }

  @Test(arguments: PinnedConsumerDriver.allCases)
  func actorTakesABatchInAFewPassesAndJobsWhateverItsTaskPrefers(_ driver: PinnedConsumerDriver) async throws {
    let (passes, jobs, received, offLoop) = try await countsWhileConsuming(driver)
    #expect(received == Self.elements)
    #expect(offLoop == 0)
    #expect(passes < Self.elements / 100, "\(passes) passes for \(Self.elements) elements")
    #expect(jobs < UInt64(Self.elements / 100), "\(jobs) jobs for \(Self.elements) elements")
  }

  /// The same when the actor calls the iterator's `next()` itself: it runs in the actor's
  /// isolation as `for await`'s `next(isolation:)` does, so taking an element from the batch does
  /// not leave the loop and come back in a job.
  @Test(arguments: PinnedConsumerDriver.allCases)
  func actorCallingNextItselfTakesABatchInAFewPassesAndJobs(_ driver: PinnedConsumerDriver) async throws {
    let (passes, jobs, received, offLoop) = try await countsWhileConsuming(driver, callingNext: true)
    #expect(received == Self.elements)
    #expect(offLoop == 0)
    #expect(passes < Self.elements / 100, "\(passes) passes for \(Self.elements) elements")
    #expect(jobs < UInt64(Self.elements / 100), "\(jobs) jobs for \(Self.elements) elements")
  }

  static let suspensions = 200

  /// The loop's jobs while a `PinnedConsumer` takes `suspensions` elements posted one at a time,
  /// each after the consumer took the one before (so it suspends for every element).
  private func jobsWhileConsumingOneAtATime(
    _ driver: PinnedConsumerDriver
  ) async throws -> (jobs: UInt64, received: Int) {
    let loop = try RunLoopThread(name: "consumer-suspensions")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: Int.self)
    loop.setMetricsEnabled(true)
    try loop.performAndWait {}
    let before = loop.metrics.jobs
    let consumer = PinnedConsumer(loop: loop)
    let published = SharedCount()
    let count = Self.suspensions
    let task: Task<(received: Int, offLoop: Int), Never>
    switch driver {
    case .detached: task = Task.detached { await consumer.consume(sequence, count: count, published: published) }
    case .preferringTheLoop, .preferringAnotherLoop:
      task = Task(executorPreference: loop) { await consumer.consume(sequence, count: count, published: published) }
    }
    // Each element waits until the consumer took the one before it (and suspended again: the
    // element is taken only from the loop's source callout after the consumer found nothing).
    let outcome = try await withWatchdog("the consumer takes every element") {
      for element in 0..<count {
        while published.value.load(ordering: .acquiring) < element { await Task.yield() }
        #expect(sequence.post(element) == .enqueued)
      }
      return await task.value
    }
    try loop.performAndWait {}
    return (loop.metrics.jobs - before, outcome?.received ?? 0)
  }

  /// A consumer driven by a task that prefers the loop resumes in two of the loop's jobs per
  /// suspension: the task executor's (where the runtime resumes it) and the actor's, which then
  /// needs no second trip for its hops (`JobRole.serialOnTaskExecutor`). Detached, it resumes
  /// through the global pool and then in one loop job.
  @Test(arguments: [PinnedConsumerDriver.detached, .preferringTheLoop])
  func suspendedConsumerResumesInAtMostTwoLoopJobs(_ driver: PinnedConsumerDriver) async throws {
    let (jobs, received) = try await jobsWhileConsumingOneAtATime(driver)
    #expect(received == Self.suspensions)
    let perSuspension = driver == .detached ? 1 : 2
    #expect(jobs <= UInt64(perSuspension * Self.suspensions + 10), "\(jobs) jobs for \(Self.suspensions) suspensions")
  }
}
