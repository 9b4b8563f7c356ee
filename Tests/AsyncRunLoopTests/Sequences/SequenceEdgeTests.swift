import Glibc
import Testing

@testable import AsyncRunLoop

// MARK: - More sequence promises

@Suite("Sequence edge cases", .serialized, .timeLimit(.minutes(10)))
struct SequenceEdgeTests {
  /// Promised: every factory on a loop that has shut down returns a sequence that has ended
  /// (`for await` ends at once; posts answer `.terminated`, `signal()` false).
  @Test func sequencesMadeAfterShutdownEndAtOnce() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "after shutdown") {
      () async throws -> (counts: [Int], post: SourcePostResult, signal: Bool) in
      let loop = try RunLoopThread(name: "late")
      await execShutdown(loop)
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      writeByte(pipe.write)
      let source = loop.sourceSequence(of: Int.self)
      let post = source.post(1)
      let signals = loop.signalSequence()
      let signal = signals.signal()
      var counts: [Int] = []
      var count = 0
      for await _ in source { count += 1 }
      counts.append(count)
      count = 0
      for await _ in signals { count += 1 }
      counts.append(count)
      count = 0
      for await _ in loop.timer(every: .milliseconds(1)) { count += 1 }
      counts.append(count)
      count = 0
      for await _ in loop.timer(after: .zero) { count += 1 }
      counts.append(count)
      count = 0
      if let readiness = try? loop.readiness(of: pipe.read) {
        for await _ in readiness { count += 1 }
      } else {
        count = -1
      }
      counts.append(count)
      count = 0
      for await _ in loop.activities() { count += 1 }
      counts.append(count)
      return (counts, post, signal)
    }
    guard let outcome else { return }
    #expect(outcome.counts == [0, 0, 0, 0, 0, 0])
    #expect(outcome.post == .terminated)
    #expect(!outcome.signal)
  }

  /// Promised: `invalidate()` delivers what was accepted even when the loop never ran one of the
  /// source's modes (nothing was released yet): posts to a sequence scheduled only in a mode the
  /// loop does not run arrive, in order, after the invalidation.
  @Test func invalidateReleasesElementsOfAModeTheLoopNeverRan() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "unrun mode") {
      () async throws -> (values: [Int], signals: Int) in
      let loop = try RunLoopThread(name: "unrun")
      let sequence = loop.sourceSequence(of: Int.self, modes: [surfaceModeA])
      let signals = loop.signalSequence(modes: [surfaceModeA])
      for value in 0..<5 { _ = sequence.post(value) }
      for _ in 0..<3 { signals.signal() }
      _ = await execOnNewThread { try? loop.performAndWait {} }
      sequence.invalidate()
      signals.invalidate()
      var values: [Int] = []
      for await value in sequence { values.append(value) }
      var total = 0
      for await count in signals { total += count }
      await execShutdown(loop)
      return (values, total)
    }
    guard let outcome else { return }
    #expect(outcome.values == [0, 1, 2, 3, 4])
    #expect(outcome.signals == 3)
  }

  /// Promised: the loop's shutdown answers a producer waiting in `send` (`.bounded` buffer full)
  /// with `.terminated`, delivers the accepted elements and ends the consumer.
  @Test func shutdownAnswersAWaitingSenderAndDeliversTheBuffer() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "sender at shutdown") {
      () async throws -> (send: SourcePostResult, values: [Int]) in
      let loop = try RunLoopThread(name: "sendsd")
      let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(2))
      _ = sequence.post(0)
      _ = sequence.post(1)
      let sender = Task { await sequence.send(2) }
      _ = await pollEveryMillisecond { sequence.waitingProducerCount == 1 }
      await execShutdown(loop)
      let send = await sender.value
      var values: [Int] = []
      for await value in sequence { values.append(value) }
      return (send, values)
    }
    guard let outcome else { return }
    #expect(outcome.send == .terminated)
    #expect(outcome.values == [0, 1])
  }

  /// Promised: with `.dropOldest` / `.dropNewest` buffering under two posting threads and a
  /// consumer that keeps up as it can, every post is either delivered once or counted as dropped
  /// (delivered + dropped = posted), and each producer's delivered elements keep their order.
  @Test(arguments: [SourceBuffering.dropOldest(8), .dropNewest(8)])
  func droppingBuffersAccountForEveryPost(buffering: SourceBuffering) async throws {
    let perThread = 20_000
    let outcome = try await withWatchdog(timeout: .seconds(30), "drop accounting") {
      () async throws -> (delivered: Int, dropped: Int, ordered: Bool, results: [SourcePostResult: Int]) in
      let loop = try RunLoopThread(name: "dacc")
      let sequence = loop.sourceSequence(of: ProducedItem.self, buffering: buffering)
      let consumer = Task { () -> (Int, Bool) in
        var last = [-1, -1]
        var ordered = true
        var delivered = 0
        for await item in sequence {
          if item.index <= last[item.producer] { ordered = false }
          last[item.producer] = item.index
          delivered += 1
        }
        return (delivered, ordered)
      }
      let results = Locked([SourcePostResult: Int]())
      await execOnNewThread {
        race(
          (0..<2).map { producer in
            {
              var local: [SourcePostResult: Int] = [:]
              for index in 0..<perThread {
                local[sequence.post(ProducedItem(producer: producer, index: index)), default: 0] += 1
              }
              results.withLock { $0.merge(local, uniquingKeysWith: +) }
            }
          })
      }
      sequence.invalidate()
      let (delivered, ordered) = await consumer.value
      let dropped = sequence.droppedCount
      await execShutdown(loop)
      return (delivered, dropped, ordered, results.withLock { $0 })
    }
    guard let outcome else { return }
    #expect(
      outcome.delivered + outcome.dropped == 2 * perThread, "delivered \(outcome.delivered), dropped \(outcome.dropped)"
    )
    #expect(outcome.ordered)
    let refused = (outcome.results[.dropped] ?? 0)
    let takenDropping = outcome.results[.enqueuedDroppingOldest] ?? 0
    #expect(refused + takenDropping == outcome.dropped, "\(outcome.results)")
  }

  /// Promised: an activity sequence whose consumer falls behind drops its oldest events and counts
  /// them: delivered + dropped equals what the loop reached (counted by a second observer of the
  /// same activity in the same passes), and the newest `bufferLimit` events are kept.
  @Test func anActivitySequenceAccountsForEveryEventItDropped() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "activity drops") {
      () async throws -> (delivered: Int, dropped: Int, seen: Int) in
      let loop = try RunLoopThread(name: "act")
      let seen = AtomicCounter()
      // Both observers join in one loop-thread call: they are told in the same passes.
      let sequence = try await execOnNewThread {
        Result {
          try loop.performAndWait { () -> ActivitySequence in
            loop.add(LoopObserver(activities: .beforeWaiting) { _, _ in seen.increment() }, to: .common)
            return loop.activities(.beforeWaiting, bufferLimit: 4)
          }
        }
      }.get()
      let counted = await execOnNewThread { () -> Int in
        for _ in 0..<50 { _ = try? loop.performAndWait {} }
        // Between passes: both observers were told in the same passes.
        return
          (try? loop.performAndWait { () -> Int in
            sequence.invalidate()
            return seen.current
          }) ?? -1
      }
      var delivered = 0
      for await _ in sequence { delivered += 1 }
      await execShutdown(loop)
      return (delivered, sequence.droppedCount, counted)
    }
    guard let outcome else { return }
    #expect(outcome.delivered == min(4, outcome.seen), "\(outcome)")
    #expect(outcome.delivered + outcome.dropped == outcome.seen, "\(outcome)")
  }
}

extension SequenceEdgeTests {
  /// Promised: dropping a sequence invalidates its source, also when the drop races the add
  /// that schedules it: `onSchedule` and `onCancel` come in pairs (each at most once), and the
  /// loop keeps no record. Four threads make and drop 300 sequences each.
  @Test func sequencesDroppedAsTheyAreMadePairScheduleAndCancel() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "made and dropped") {
      () async throws -> (schedules: Int, cancels: Int, records: Int?) in
      let loop = try RunLoopThread(name: "drop2")
      let schedules = AtomicCounter()
      let cancels = AtomicCounter()
      await execOnNewThread {
        race(
          (0..<4).map { thread in
            {
              for index in 0..<300 {
                if (index + thread) % 2 == 0 {
                  _ = loop.sourceSequence(
                    of: Int.self, onSchedule: { _, _ in schedules.increment() }, onCancel: { _ in cancels.increment() })
                } else {
                  let signals = loop.signalSequence(
                    onSchedule: { _, _ in schedules.increment() }, onCancel: { _ in cancels.increment() })
                  signals.signal()
                }
              }
            }
          })
      }
      _ = await pollEveryMillisecond {
        (try? loop.performAndWait { loop.core.modeTable.allRecords.count }) == 0
      }
      let records = await execOnNewThread { try? loop.performAndWait { loop.core.modeTable.allRecords.count } }
      let counts = (schedules.current, cancels.current)
      await execShutdown(loop)
      return (counts.0, counts.1, records)
    }
    guard let outcome else { return }
    #expect(outcome.schedules == outcome.cancels, "\(outcome.schedules) schedules, \(outcome.cancels) cancels")
    #expect(outcome.schedules <= 1200)
    #expect(outcome.records == 0)
  }

  /// Promised: a producer and a consumer that both run on the source's own loop (a `.bounded(1)`
  /// buffer, the producer suspending in `send`) pass 2,000 elements in order without deadlocking.
  @Test func aProducerAndAConsumerOnTheSameLoopPassEveryElement() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "same loop") { () async throws -> (Bool, Int) in
      let loop = try RunLoopThread(name: "same")
      let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(1))
      let consumer = Task(executorPreference: loop) { () -> [Int] in
        var values: [Int] = []
        for await value in sequence { values.append(value) }
        return values
      }
      let refused = await Task(executorPreference: loop) { () -> Int in
        var refused = 0
        for value in 0..<2_000 where await sequence.send(value) != .enqueued { refused += 1 }
        sequence.invalidate()
        return refused
      }.value
      let values = await consumer.value
      await execShutdown(loop)
      return (values == Array(0..<2_000), refused)
    }
    guard let outcome else { return }
    #expect(outcome.0)
    #expect(outcome.1 == 0)
  }

  /// Promised: `invalidate()` from another thread while the consumer waits ends a timer, a
  /// readiness and an activity sequence (their `for await` ends; none hangs).
  @Test func invalidatingFromAnotherThreadEndsEveryKindWhileItsConsumerWaits() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "invalidate kinds") {
      () async throws -> (waited: [Bool], ended: Int) in
      let loop = try RunLoopThread(name: "invk")
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let timer = loop.timer(every: .seconds(3600))
      let readiness = try loop.readiness(of: pipe.read)
      let activities = loop.activities(.exit)
      let ended = AtomicCounter()
      let tasks = [
        Task(executorPreference: loop) {
          for await _ in timer {}
          ended.increment()
        },
        Task {
          for await _ in readiness {}
          ended.increment()
        },
        Task(executorPreference: loop) {
          for await _ in activities {}
          ended.increment()
        },
      ]
      let waited = [
        await pollEveryMillisecond { isConsumerWaiting(timer) },
        await pollEveryMillisecond { isConsumerWaiting(readiness) },
        await pollEveryMillisecond { isConsumerWaiting(activities) },
      ]
      await execOnNewThread {
        timer.invalidate()
        readiness.invalidate()
        activities.invalidate()
      }
      for task in tasks { await task.value }
      let count = ended.current
      await execShutdown(loop)
      return (waited, count)
    }
    guard let outcome else { return }
    #expect(outcome.waited == [true, true, true])
    #expect(outcome.ended == 3)
  }
}
