import Dispatch
import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("Dropping policies under load, leaks, busy timers", .serialized, .timeLimit(.minutes(10)))
struct DroppingPoliciesUnderLoadTests {
  /// Promised: with `.dropOldest` / `.dropNewest` and many producers against a slow consumer,
  /// what is delivered keeps each producer's order, and delivered + `droppedCount` equals the
  /// posts that were answered `.enqueued`, `.enqueuedDroppingOldest` or `.dropped`.
  @Test(arguments: [SourceBuffering.dropOldest(4), .dropNewest(4)])
  func droppingPoliciesAccountForEveryPost(buffering: SourceBuffering) async throws {
    let producers = 4
    let perProducer = 2000
    let outcome = try await withWatchdog(timeout: .seconds(20), "dropping \(buffering)") {
      () async throws -> (seen: [Int: [Int]], dropped: Int, results: [SourcePostResult: Int]) in
      let loop = try RunLoopThread(name: "drop-load")
      let sequence = loop.sourceSequence(of: ProducedItem.self, buffering: buffering)
      let consumer = Task { () -> [Int: [Int]] in
        var seen: [Int: [Int]] = [:]
        for await item in sequence {
          seen[item.producer, default: []].append(item.index)
          if item.index % 16 == 0 { await Task.yield() }
        }
        return seen
      }
      let results = Guarded<[SourcePostResult: Int]>([:])
      await execOnNewThread {
        race(
          (0..<producers).map { producer in
            {
              for index in 0..<perProducer {
                let result = sequence.post(ProducedItem(producer: producer, index: index))
                results.withLock { $0[result, default: 0] += 1 }
              }
            }
          })
      }
      sequence.invalidate()
      let seen = await consumer.value
      let dropped = sequence.droppedCount
      await execShutdown(loop)
      return (seen, dropped, results.snapshot)
    }
    guard let outcome else { return }
    let delivered = outcome.seen.values.map(\.count).reduce(0, +)
    for (producer, indices) in outcome.seen {
      #expect(indices == indices.sorted() && Set(indices).count == indices.count, "producer \(producer) out of order")
    }
    #expect(outcome.results.values.reduce(0, +) == producers * perProducer)
    #expect((outcome.results[.full] ?? 0) == 0 && (outcome.results[.terminated] ?? 0) == 0)
    #expect(delivered + outcome.dropped == producers * perProducer)
    if case .dropNewest = buffering {
      #expect(outcome.dropped == (outcome.results[.dropped] ?? 0))
    } else {
      #expect(outcome.dropped == (outcome.results[.enqueuedDroppingOldest] ?? 0))
    }
  }

  /// No leak: every kind of sequence is freed once it ended (cancelled consumer, `invalidate()`,
  /// the loop's shutdown) and nothing references it.
  @Test func endedSequencesAreFreed() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "freed sequences") { () async throws -> [String] in
      let loop = try RunLoopThread(name: "leak")
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      var weaks: [(String, WeakReference)] = []
      do {
        let source = loop.sourceSequence(of: Int.self)
        let signals = loop.signalSequence()
        let timer = loop.timer(every: .seconds(3600))
        let readiness = try loop.readiness(of: pipe.read)
        let activities = loop.activities([.entry])
        weaks = [
          ("source", WeakReference(source)), ("signal", WeakReference(signals)), ("timer", WeakReference(timer)),
          ("readiness", WeakReference(readiness)), ("activity", WeakReference(activities)),
        ]
        _ = source.post(1)
        signals.signal()
        let t1 = Task { for await _ in source {} }
        let t2 = Task { for await _ in signals {} }
        let t3 = Task { for await _ in timer {} }
        let t4 = Task { for await _ in readiness {} }
        let t5 = Task { for await _ in activities {} }
        try await Task.sleep(for: .milliseconds(10))
        t1.cancel()
        signals.invalidate()
        timer.invalidate()
        t4.cancel()
        await t1.value
        await t2.value
        await t3.value
        await t4.value
        await execShutdown(loop)
        await t5.value
      }
      let watched = weaks
      let allGone = await pollEveryMillisecond(timeout: .seconds(5)) { watched.allSatisfy { $0.1.isGone } }
      return allGone ? [] : watched.filter { !$0.1.isGone }.map(\.0)
    }
    #expect(outcome == [])
  }

  /// A timer sequence with a tiny interval keeps its loop busy but responsive: blocks and jobs
  /// still run, a consumer on the loop takes its ticks, and the loop shuts down.
  @Test func aTinyIntervalTimerDoesNotStarveTheLoop() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "tiny interval") { () async throws -> (Int, Int) in
      let loop = try RunLoopThread(name: "tiny")
      let timer = loop.timer(every: .nanoseconds(100), missedTicks: .burst)
      let consumer = Task(executorPreference: loop) { () -> Int in
        var n = 0
        for await _ in timer {
          n += 1
          if n == 500 { break }
        }
        return n
      }
      var answered = 0
      for value in 0..<20 where (try? loop.performAndWait { value }) == value { answered += 1 }
      let ticks = await consumer.value
      await execShutdown(loop)
      return (ticks, answered)
    }
    #expect(outcome?.0 == 500)
    #expect(outcome?.1 == 20)
  }

  /// `assumeIsolated` of an actor on a loop, off that loop, traps with a message naming the loop.
  @Test func assumeIsolatedOffTheLoopTrapsNamingTheLoop() async throws {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let loop = try RunLoopThread(name: "trap-loop")
      let actor = CallLoggingActor(loop: loop)
      assumeIsolatedFromSyncCode(actor)
    }
    expectStandardError(of: result, mentions: "trap-loop")
  }
}
