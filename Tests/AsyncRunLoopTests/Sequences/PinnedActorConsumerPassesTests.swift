import Synchronization
import Testing

@testable import AsyncRunLoop

/// An actor pinned to a loop that consumes a sequence of the same loop.
private actor PinnedConsumer: LoopActor {
  nonisolated let loop: RunLoopThread

  init(loop: RunLoopThread) { self.loop = loop }

  func consume(_ sequence: SourceSequence<Int>, count: Int) async -> Int {
    var received = 0
    for await _ in sequence {
      received += 1
      if received == count { break }
    }
    return received
  }
}

/// The loop's passes, counted by a `beforeTimers` observer.
private final class PassCount: Sendable {
  let value = Atomic<Int>(0)
}

/// An actor pinned to a loop takes a whole batch of its sequence without going back through the
/// loop for each element: the loop makes a few passes for the batch, not one per element. Counted,
/// not timed (issue 26; see Benchmarks/results/analysis-preference-and-futex.md).
@Suite struct PinnedActorConsumerPassesTests {
  static let elements = 3_000

  /// The loop's passes while a `PinnedConsumer` takes `elements` elements that were all posted
  /// (and released) before it started, driven by a task that prefers the loop or a detached one.
  private func passesWhileConsuming(preferringTheLoop: Bool) async throws -> (passes: Int, received: Int) {
    let loop = try RunLoopThread(name: "consumer-passes")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: Int.self)
    for element in 0..<Self.elements { #expect(sequence.post(element) == .enqueued) }
    let count = PassCount()
    let observer = LoopObserver(activities: .beforeTimers) { _, _ in count.value.add(1, ordering: .relaxed) }
    loop.add(observer, to: .common)
    defer { observer.invalidate() }
    // The source has fired (the elements are the consumer's) and the observer is in.
    try loop.performAndWait {}
    let before = count.value.load(ordering: .relaxed)
    let consumer = PinnedConsumer(loop: loop)
    let elements = Self.elements
    let task =
      preferringTheLoop
      ? Task(executorPreference: loop) { await consumer.consume(sequence, count: elements) }
      : Task.detached { await consumer.consume(sequence, count: elements) }
    let received = try await withWatchdog("the consumer takes every element") { await task.value } ?? 0
    try loop.performAndWait {}
    return (count.value.load(ordering: .relaxed) - before, received)
  }

  @Test func actorDrivenByADetachedTaskTakesABatchInAFewPasses() async throws {
    let (passes, received) = try await passesWhileConsuming(preferringTheLoop: false)
    #expect(received == Self.elements)
    #expect(passes < Self.elements / 100, "\(passes) passes for \(Self.elements) elements")
  }

  /// A task that prefers the loop: its job runs on the loop's task executor too once it has
  /// enqueued itself from its own run, so its later hops inside the actor stay inline.
  @Test func actorDrivenByATaskPreferringTheLoopTakesABatchInAFewPasses() async throws {
    let (passes, received) = try await passesWhileConsuming(preferringTheLoop: true)
    #expect(received == Self.elements)
    #expect(passes < Self.elements / 100, "\(passes) passes for \(Self.elements) elements")
  }
}
