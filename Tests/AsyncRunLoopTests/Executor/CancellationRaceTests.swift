import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("Cancellation racing completion ends each wait once", .serialized, .timeLimit(.minutes(10)))
struct CancellationRaceTests {
  /// Promised: a `loop.clock` sleep cancelled at any moment (before it starts, while its timer is
  /// on its way to the loop, or while it waits) throws `CancellationError`, once, and leaves no
  /// timer on the loop: 400 sleeps cancelled right after they start all end, and the loop ends up
  /// holding no record.
  @Test func clockSleepsCancelledAtAnyMomentAllEndAndLeaveNothing() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(40), "cancelled sleeps") {
      () async throws -> (cancelled: Int, total: Int, records: Int?) in
      let loop = try RunLoopThread(name: "csl")
      var tasks: [Task<Bool, Never>] = []
      for index in 0..<400 {
        let task = Task { () -> Bool in
          do {
            try await loop.clock.sleep(until: .now.advanced(by: .seconds(60)))
            return false
          } catch { return error is CancellationError }
        }
        if index % 4 == 0 { await Task.yield() }
        task.cancel()
        tasks.append(task)
      }
      var cancelled = 0
      for task in tasks where await task.value { cancelled += 1 }
      _ = await pollEveryMillisecond(timeout: .seconds(5)) {
        (try? loop.performAndWait { loop.core.modeTable.allRecords.count }) == 0
      }
      let records = await execOnNewThread { try? loop.performAndWait { loop.core.modeTable.allRecords.count } }
      await execShutdown(loop)
      return (cancelled, tasks.count, records)
    }
    guard let outcome else { return }
    #expect(outcome.cancelled == outcome.total)
    #expect(outcome.records == 0, "the loop still holds \(String(describing: outcome.records)) records")
  }

  /// Promised: a consumer cancelled at any moment (before its first `next()`, while it registers,
  /// while it waits) ends, and its source leaves the loop: `onSchedule` and `onCancel` pair up and
  /// the loop holds no record. 300 sequences, each with a consumer cancelled right away while a
  /// thread posts to it.
  @Test func consumersCancelledAtAnyMomentEndAndDetachTheirSources() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(40), "cancelled consumers") {
      () async throws -> (schedules: Int, cancels: Int, records: Int?) in
      let loop = try RunLoopThread(name: "ccons")
      let schedules = AtomicCounter()
      let cancels = AtomicCounter()
      for round in 0..<300 {
        let sequence = loop.sourceSequence(
          of: Int.self, onSchedule: { _, _ in schedules.increment() }, onCancel: { _ in cancels.increment() })
        let consumer = Task(executorPreference: round % 2 == 0 ? loop : nil) { () -> Int in
          var count = 0
          for await _ in sequence { count += 1 }
          return count
        }
        _ = sequence.post(round)
        if round % 3 == 0 { await Task.yield() }
        consumer.cancel()
        _ = sequence.post(round)
        _ = await consumer.value
      }
      _ = await pollEveryMillisecond(timeout: .seconds(5)) {
        (try? loop.performAndWait { loop.core.modeTable.allRecords.count }) == 0
      }
      let records = await execOnNewThread { try? loop.performAndWait { loop.core.modeTable.allRecords.count } }
      let counts = (schedules.current, cancels.current)
      await execShutdown(loop)
      return (counts.0, counts.1, records)
    }
    guard let outcome else { return }
    #expect(outcome.schedules == outcome.cancels, "\(outcome.schedules) schedules, \(outcome.cancels) cancels")
    #expect(outcome.records == 0, "the loop still holds \(String(describing: outcome.records)) records")
  }
}

extension CancellationRaceTests {
  /// Promised: a `send` whose task is cancelled while it waits for room answers `.full` and its
  /// element is not taken; the other waiting producers are admitted oldest first, so the
  /// consumer sees the first element, then the remaining senders' elements in the order they
  /// started waiting.
  @Test func aCancelledSenderIsSkippedAndTheOthersKeepTheirOrder() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "cancelled sender") {
      () async throws -> (results: [SourcePostResult], values: [Int]) in
      let loop = try RunLoopThread(name: "csend")
      let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(1))
      _ = sequence.post(0)
      var senders: [Task<SourcePostResult, Never>] = []
      for value in 1...4 {
        senders.append(Task { await sequence.send(value) })
        _ = await pollEveryMillisecond { sequence.waitingProducerCount == value }
      }
      senders[1].cancel()  // the producer of 2
      _ = await pollEveryMillisecond { sequence.waitingProducerCount == 3 }
      var values: [Int] = []
      var iterator = sequence.makeAsyncIterator()
      while values.count < 4, let value = await iterator.next() { values.append(value) }
      var results: [SourcePostResult] = []
      for sender in senders { results.append(await sender.value) }
      sequence.invalidate()
      while let value = await iterator.next() { values.append(value) }
      await execShutdown(loop)
      return (results, values)
    }
    guard let outcome else { return }
    #expect(outcome.results == [.enqueued, .full, .enqueued, .enqueued])
    #expect(outcome.values == [0, 1, 3, 4])
  }
}

extension CancellationRaceTests {
  /// Promised: after the last signal at least one element is always delivered: a consumer that
  /// signals, then waits for the next element, 2,000 times (on the loop, and off it), while a
  /// thread signals in bursts, is never left waiting; the elements add up to every signal made.
  @Test(arguments: [true, false])
  func everySignalIsFollowedByAnElement(consumerOnLoop: Bool) async throws {
    let outcome = try await withWatchdog(timeout: .seconds(40), "signal then element") {
      () async throws -> (received: Int, sent: Int) in
      let loop = try RunLoopThread(name: "sigel")
      let signals = loop.signalSequence()
      let sent = AtomicCounter()
      let stop = TestGate()
      let noiseDone = TestGate()
      startThread(detached: true) {
        while !stop.opened {
          for _ in 0..<10 where signals.signal() { sent.increment() }
          usleep(50)
        }
        noiseDone.open()
      }
      let received = await Task(executorPreference: consumerOnLoop ? loop : nil) { () -> Int in
        var received = 0
        var iterator = signals.makeAsyncIterator()
        for _ in 0..<2_000 {
          if signals.signal() { sent.increment() }
          guard let count = await iterator.next() else { return -1 }
          received += count
        }
        stop.open()
        _ = await pollEveryMillisecond { noiseDone.opened }
        // The rest, after the invalidation: every signal made is delivered.
        signals.invalidate()
        while let count = await iterator.next() { received += count }
        return received
      }.value
      await execShutdown(loop)
      return (received, sent.current)
    }
    guard let outcome else { return }
    #expect(outcome.received == outcome.sent, "received \(outcome.received) of \(outcome.sent) signals")
  }
}
