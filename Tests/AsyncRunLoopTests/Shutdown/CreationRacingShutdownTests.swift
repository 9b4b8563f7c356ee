import Dispatch
import Glibc
import Testing

@testable import AsyncRunLoop

// MARK: - Lost wake-ups, buffering, creation racing shutdown

@Suite("Wake-ups, buffering and creation racing shutdown", .serialized, .timeLimit(.minutes(10)))
struct CreationRacingShutdownTests {
  /// Promised: one post from a plain thread always reaches a waiting consumer (no lost wake-up),
  /// whether the consumer runs on the global pool or prefers the loop. Ping-pong, one element at
  /// a time.
  @Test(arguments: [false, true])
  func singlePostsAlwaysWakeTheConsumer(preferLoop: Bool) async throws {
    let rounds = 300
    let outcome = try await withWatchdog(timeout: .seconds(20), "ping-pong") { () async throws -> [Int] in
      let loop = try RunLoopThread(name: "pingpong")
      let sequence = loop.sourceSequence(of: Int.self)
      let got = AtomicCounter()
      let body: @Sendable () async -> [Int] = {
        var seen: [Int] = []
        for await value in sequence {
          seen.append(value)
          got.increment()
          if seen.count == rounds { break }
        }
        return seen
      }
      let consumer = preferLoop ? Task(executorPreference: loop, operation: body) : Task(operation: body)
      await execOnNewThread {
        for round in 0..<rounds {
          _ = sequence.post(round)
          while got.current <= round { sched_yield() }
        }
      }
      let seen = await consumer.value
      await execShutdown(loop)
      return seen
    }
    #expect(outcome == Array(0..<rounds))
  }

  /// Promised: after the last signal at least one element is delivered. One signal at a time from
  /// a plain thread; every signal is answered.
  @Test func everySingleSignalIsAnswered() async throws {
    let rounds = 300
    let outcome = try await withWatchdog(timeout: .seconds(20), "signal ping-pong") { () async throws -> Int in
      let loop = try RunLoopThread(name: "sigpong")
      let sequence = loop.signalSequence()
      let got = AtomicCounter()
      let consumer = Task(executorPreference: loop) { () -> Int in
        var total = 0
        for await count in sequence {
          total += count
          got.value.store(total, ordering: .sequentiallyConsistent)
          if total == rounds { break }
        }
        return total
      }
      await execOnNewThread {
        for round in 0..<rounds {
          sequence.signal()
          while got.current <= round { sched_yield() }
        }
      }
      let total = await consumer.value
      await execShutdown(loop)
      return total
    }
    #expect(outcome == rounds)
  }

  /// SourceBuffering as documented, with no consumer while posting: `.bounded(3)` keeps the first
  /// three and answers `.full`; `.dropNewest(3)` keeps the first three; `.dropOldest(3)` keeps the
  /// last three; `droppedCount` counts the rest.
  @Test(arguments: [SourceBuffering.bounded(3), .dropNewest(3), .dropOldest(3)])
  func bufferingPoliciesKeepTheDocumentedElements(buffering: SourceBuffering) async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "buffering \(buffering)") {
      () async throws -> (seen: [Int], results: [SourcePostResult], dropped: Int) in
      let loop = try RunLoopThread(name: "buffering")
      let sequence = loop.sourceSequence(of: Int.self, buffering: buffering)
      var results: [SourcePostResult] = []
      for value in 0..<10 {
        results.append(sequence.post(value))
        if value % 2 == 0 { try await Task.sleep(for: .milliseconds(1)) }  // let the loop release some
      }
      sequence.invalidate()
      var seen: [Int] = []
      for await value in sequence { seen.append(value) }
      let dropped = sequence.droppedCount
      await execShutdown(loop)
      return (seen, results, dropped)
    }
    guard let outcome else { return }
    switch buffering {
    case .bounded:
      #expect(outcome.seen == [0, 1, 2])
      #expect(outcome.results == Array(repeating: .enqueued, count: 3) + Array(repeating: .full, count: 7))
      #expect(outcome.dropped == 0)
    case .dropNewest:
      #expect(outcome.seen == [0, 1, 2])
      #expect(outcome.results == Array(repeating: .enqueued, count: 3) + Array(repeating: .dropped, count: 7))
      #expect(outcome.dropped == 7)
    case .dropOldest:
      #expect(outcome.seen == [7, 8, 9])
      #expect(
        outcome.results == Array(repeating: .enqueued, count: 3)
          + Array(repeating: .enqueuedDroppingOldest, count: 7))
      #expect(outcome.dropped == 7)
    case .unbounded:
      Issue.record("not a case here")
    }
  }

  /// Sequences made on another thread while the loop shuts down: each consumer ends, every
  /// accepted post is delivered, and schedules and cancels pair up.
  @Test func sequencesMadeRacingShutdownEndAndDeliverWhatTheyAccepted() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "sequences racing shutdown") {
      () async throws -> [String] in
      var problems: [String] = []
      for round in 0..<40 {
        let loop = try RunLoopThread(name: "make-race")
        let pairs = PairLog()
        let made = Guarded<(SourceSequence<Int>, TimerSequence, ActivitySequence)?>(nil)
        let accepted = Guarded<Bool>(false)
        await execOnNewThread {
          race([
            { loop.shutdown() },
            {
              let source = loop.sourceSequence(
                of: Int.self, onSchedule: { loop, _ in pairs.schedule(loop) }, onCancel: { pairs.cancel($0) })
              let ok = source.post(round).isEnqueued
              accepted.withLock { $0 = ok }
              made.withLock { $0 = (source, loop.timer(every: .seconds(3600)), loop.activities([.entry])) }
            },
          ])
        }
        guard let (source, timer, activities) = made.snapshot else { continue }
        var seen: [Int] = []
        for await value in source { seen.append(value) }
        for await _ in timer {}
        for await _ in activities {}
        await execShutdown(loop)
        if seen != (accepted.snapshot ? [round] : []) { problems.append("round \(round): saw \(seen)") }
        problems += pairs.unpaired
      }
      return problems
    }
    #expect(outcome == [])
  }

  /// Promised (`TimerSequence`): ticks the loop has fired and the consumer has not taken are
  /// delivered before `invalidate()` ends the sequence.
  @Test func firedTicksAreDeliveredBeforeInvalidateEndsTheTimerSequence() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "fired ticks at invalidate") {
      () async throws -> Int in
      let loop = try RunLoopThread(name: "ticks")
      let timer = loop.timer(every: .milliseconds(1))
      #expect(await pollEveryMillisecond { timer.lock.withLock { timer.machine.hasElements } })
      timer.invalidate()
      var n = 0
      for await _ in timer { n += 1 }
      await execShutdown(loop)
      return n
    }
    #expect(outcome == 1)
  }

  /// Promised (`ActivitySequence`): events recorded before the loop's shutdown are delivered
  /// before it ends, with no consumer while they were recorded.
  @Test func recordedActivitiesAreDeliveredAfterShutdown() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "activities after shutdown") {
      () async throws -> [LoopActivity] in
      let loop = try RunLoopThread(name: "act-end")
      let hold = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(hold, to: endRaceModeA)
      let activities = loop.activities([.entry, .exit], modes: [endRaceModeA])
      for _ in 0..<3 {
        _ = try loop.performAndWait { loop.run(mode: endRaceModeA, for: .milliseconds(1)) }
      }
      await execShutdown(loop)
      var seen: [LoopActivity] = []
      for await event in activities { seen.append(event.activity) }
      return seen
    }
    #expect(outcome == [.entry, .exit, .entry, .exit, .entry, .exit])
  }
}
