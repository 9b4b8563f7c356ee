import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

/// A consumer that feeds itself on its own loop fires its source early over and over (see
/// `ConsumerOnItsOwnLoopTests`). Another thread ends the sequence in each of the ways
/// `SourceSequence` lists, at a moment that moves from round to round, while a plain thread posts
/// too: the ending keeps the promises it makes for any consumer.
@Suite struct ConsumerOnItsOwnLoopEndingTests {
  /// Rounds per test; the ending comes after the consumer got `step` more of its own elements
  /// each round (`step` in the first).
  static let rounds = 24
  static let step = 7

  /// An element and who posted it: 0 the consumer itself, 1 the plain thread.
  struct Tagged: Sendable {
    let producer: Int
    let index: Int
  }

  /// What one round saw.
  struct Round: Sendable {
    /// Indices the consumer received from itself and from the thread, in order.
    var fromSelf: [Int] = []
    var fromThread: [Int] = []
    /// Indices whose post answered `.enqueued`.
    var selfAccepted: [Int] = []
    var threadAccepted: [Int] = []
  }

  /// `invalidate()` from another thread: what was accepted is still delivered, exactly once and in
  /// each producer's order, then `next()` returns nil; later posts answer `.terminated`;
  /// `onCancel` runs once.
  @Test func invalidatingDeliversEveryAcceptedElementOnceThenEnds() async throws {
    let loop = try RunLoopThread(name: "early-invalidate")
    loop.setMetricsEnabled(true)  // (the tally counts passes)
    defer { loop.shutdownAndWait() }
    var fed = FedTally()
    for round in 0..<Self.rounds {
      let seen = try await runRound(on: loop, endingAt: (round + 1) * Self.step) { sequence, _ in
        sequence.invalidate()
      }
      #expect(seen.round.fromSelf == seen.round.selfAccepted, "round \(round)")
      #expect(seen.round.fromThread == seen.round.threadAccepted, "round \(round)")
      #expect(seen.cancels == 1, "round \(round): onCancel ran \(seen.cancels) times")
      fed.add(seen)
    }
    fed.expectEarlyFires()
  }

  /// The loop shuts down from another thread: as `invalidate()` (every accepted element delivered
  /// exactly once and in order, then the end; `onCancel` once).
  @Test func shuttingTheLoopDownDeliversEveryAcceptedElementOnceThenEnds() async throws {
    var fed = FedTally()
    for round in 0..<Self.rounds {
      let loop = try RunLoopThread(name: "early-shutdown")
      loop.setMetricsEnabled(true)  // (the tally counts passes)
      defer { loop.shutdownAndWait() }
      let seen = try await runRound(on: loop, endingAt: (round + 1) * Self.step) { _, _ in loop.shutdown() }
      #expect(seen.round.fromSelf == seen.round.selfAccepted, "round \(round)")
      #expect(seen.round.fromThread == seen.round.threadAccepted, "round \(round)")
      #expect(seen.cancels == 1, "round \(round): onCancel ran \(seen.cancels) times")
      fed.add(seen)
    }
    fed.expectEarlyFires()
  }

  /// The consumer's task is cancelled from another thread: the sequence ends at once, so what the
  /// consumer got is an in-order prefix of what was accepted, with nothing twice; later posts
  /// answer `.terminated`; `onCancel` runs once.
  @Test func cancellingTheConsumerEndsTheSequenceOnceWithNothingDeliveredTwice() async throws {
    let loop = try RunLoopThread(name: "early-cancel")
    loop.setMetricsEnabled(true)  // (the tally counts passes)
    defer { loop.shutdownAndWait() }
    var fed = FedTally()
    for round in 0..<Self.rounds {
      let seen = try await runRound(on: loop, endingAt: (round + 1) * Self.step) { _, consumer in consumer.cancel() }
      #expect(seen.round.selfAccepted.starts(with: seen.round.fromSelf), "round \(round)")
      #expect(seen.round.threadAccepted.starts(with: seen.round.fromThread), "round \(round)")
      #expect(seen.cancels == 1, "round \(round): onCancel ran \(seen.cancels) times")
      fed.add(seen)
    }
    fed.expectEarlyFires()
  }

  /// Passes of the loop against elements the consumer fed itself, over all rounds: without early
  /// fires each of those elements needs a pass of its own (measured: passes within one of the
  /// elements, every round; about a third as many with them), so clearly fewer passes than
  /// elements show that the consumer was firing early during the rounds that the endings cut
  /// short at moving points.
  struct FedTally {
    var passes = 0
    var selfFed = 0

    mutating func add(_ seen: (round: Round, cancels: Int, passes: Int)) {
      passes += seen.passes
      selfFed += seen.round.fromSelf.count
    }

    func expectEarlyFires(sourceLocation: SourceLocation = #_sourceLocation) {
      #expect(
        passes * 10 < selfFed * 9, "\(passes) passes for \(selfFed) self-fed elements", sourceLocation: sourceLocation)
    }
  }

  /// One round: a consumer on `loop` that posts its own next element each time it gets one of its
  /// own, and a plain thread that posts up to 2,000 elements and calls `end` once the consumer
  /// got `endAt` of its own (waiting for that after its last post if need be). Returns once the consumer has ended and `onCancel` has run, with what was seen and
  /// how many times `onCancel` ran (counted again after a later pass of the loop, if it still runs).
  private func runRound(
    on loop: RunLoopThread, endingAt endAt: Int,
    _ end: @escaping @Sendable (SourceSequence<Tagged>, Task<Round, Never>) -> Void
  ) async throws -> (round: Round, cancels: Int, passes: Int) {
    let cancels = Locked(0)
    let sequence = loop.sourceSequence(of: Tagged.self, onCancel: { _ in cancels.withLock { $0 += 1 } })
    let threadAccepted = Locked<[Int]>([])
    let selfReceived = Locked(0)
    #expect(sequence.post(Tagged(producer: 0, index: 0)) == .enqueued)
    let passesBefore = loop.metrics.passes
    let consumer = Task(executorPreference: loop) { () -> Round in
      var round = Round(selfAccepted: [0])
      for await element in sequence {
        guard element.producer == 0 else {
          round.fromThread.append(element.index)
          continue
        }
        round.fromSelf.append(element.index)
        selfReceived.withLock { $0 += 1 }
        switch sequence.post(Tagged(producer: 0, index: element.index + 1)) {
        case .enqueued: round.selfAccepted.append(element.index + 1)
        case .terminated: break
        case let other: Issue.record("an unbounded buffer answered \(other)")
        }
      }
      return round
    }
    let producer = startThread {
      var ended = false
      for index in 0..<2_000 {
        if !ended, selfReceived.withLock({ $0 }) >= endAt {
          end(sequence, consumer)
          ended = true
        }
        switch sequence.post(Tagged(producer: 1, index: index)) {
        case .enqueued: threadAccepted.withLock { $0.append(index) }
        case .terminated: return
        case let other: Issue.record("an unbounded buffer answered \(other)")
        }
      }
      while !ended, selfReceived.withLock({ $0 }) < endAt { sched_yield() }
      end(sequence, consumer)  // (again: idempotent)
    }
    let ended = try await withWatchdog(timeout: .seconds(30), "self-fed consumer") { await consumer.value }
    var round = try #require(ended, "the consumer never ended")
    await execOnNewThread { joinThread(producer) }
    let passes = Int(loop.metrics.passes - passesBefore)
    round.threadAccepted = threadAccepted.withLock { $0 }
    #expect(sequence.post(Tagged(producer: 1, index: -1)) == .terminated, "a post after the end was taken")
    await eventually("onCancel ran") { cancels.withLock { $0 } > 0 }
    await loopBarrier(loop)  // a second onCancel would have had its chance (a shut-down loop runs none)
    return (round, cancels.withLock { $0 }, passes)
  }
}
