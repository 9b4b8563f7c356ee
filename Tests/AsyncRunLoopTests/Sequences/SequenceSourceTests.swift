import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

/// Source sequences on real loops, with real producer threads.
@Suite("Sequence: source sequences on a loop")
struct SequenceSourceTests {
  @Test func fourProducersDeliverEveryElementInPerProducerOrder() async throws {
    let loop = try RunLoopThread(name: "seq-4x")
    defer { loop.shutdownAndWait() }
    let perProducer = 100_000 * stressFactor
    let producers = 4
    let sequence = loop.sourceSequence(of: Int.self)
    let threads = (0..<producers).map { producer in
      SequenceTestThread.start {
        for index in 0..<perProducer {
          let result = sequence.post(producer << 32 | index)
          precondition(result == .enqueued, "post refused: \(result)")
        }
      }
    }
    let outcome = try await withWatchdog(timeout: .seconds(120), "4 producers") {
      await consumeOnLoop(loop) { () async -> (Int, Bool) in
        var next = Array(repeating: 0, count: producers)
        var received = 0
        var ordered = true
        for await value in sequence {
          let producer = value >> 32
          if value & 0xFFFF_FFFF != next[producer] { ordered = false }
          next[producer] += 1
          received += 1
          if received == producers * perProducer { break }
        }
        return (received, ordered)
      }
    }
    threads.forEach { $0.join() }
    #expect(outcome?.0 == producers * perProducer)
    #expect(outcome?.1 == true)
  }

  @Test func cancellingTheConsumerEndsItPromptlyAndRunsCancelOnceOnTheLoopThread() async throws {
    let loop = try RunLoopThread(name: "seq-cancel")
    defer { loop.shutdownAndWait() }
    let cancels = SequenceCallLog()
    let sequence = loop.sourceSequence(
      of: Int.self, onCancel: { cancelLoop in cancels.record(onLoopThread: cancelLoop.isOnLoopThread) })
    let consumer = Task(executorPreference: loop) { () async -> Int in
      var count = 0
      for await _ in sequence { count += 1 }
      return count
    }
    #expect(sequence.post(1) == .enqueued)
    // The consumer takes 1 and waits (a fixed sleep could end first on a loaded machine).
    await eventually("the consumer to take 1") { sequence.bufferedCount == 0 }
    consumer.cancel()
    let count = try await withWatchdog(timeout: .seconds(10), "cancelled consumer") { await consumer.value }
    #expect(count == 1)
    await eventually("cancel routine") { cancels.count == 1 }
    #expect(cancels.allOnLoopThread)
    #expect(sequence.post(2) == .terminated)
    try await Task.sleep(for: .milliseconds(10))
    #expect(cancels.count == 1)
  }

  @Test func invalidatingWhileTheConsumerWaitsEndsItAfterWhatWasAccepted() async throws {
    let loop = try RunLoopThread(name: "seq-invalidate")
    defer { loop.shutdownAndWait() }
    let cancels = SequenceCallLog()
    let sequence = loop.sourceSequence(
      of: Int.self, onCancel: { cancelLoop in cancels.record(onLoopThread: cancelLoop.isOnLoopThread) })
    let consumer = Task(executorPreference: loop) { () async -> [Int] in
      var values: [Int] = []
      for await value in sequence { values.append(value) }
      return values
    }
    try await Task.sleep(for: .milliseconds(10))
    #expect(sequence.post(1) == .enqueued)
    #expect(sequence.post(2) == .enqueued)
    sequence.invalidate()
    #expect(sequence.post(3) == .terminated)
    let values = try await withWatchdog(timeout: .seconds(10), "invalidated consumer") { await consumer.value }
    #expect(values == [1, 2])
    await eventually("cancel routine") { cancels.count == 1 }
    #expect(cancels.allOnLoopThread)
  }

  @Test func shuttingTheLoopDownEndsAWaitingConsumer() async throws {
    let loop = try RunLoopThread(name: "seq-shutdown")
    let sequence = loop.sourceSequence(of: Int.self)
    let consumer = Task { () async -> Int in
      var count = 0
      for await _ in sequence { count += 1 }
      return count
    }
    #expect(sequence.post(1) == .enqueued)
    try await Task.sleep(for: .milliseconds(20))
    loop.shutdownAndWait()
    let count = try await withWatchdog(timeout: .seconds(10), "consumer after shutdown") { await consumer.value }
    #expect(count == 1)
    #expect(sequence.post(2) == .terminated)
  }

  @Test func aSequenceMadeOnAShutDownLoopEndsAtOnce() async throws {
    let loop = try RunLoopThread(name: "seq-dead")
    loop.shutdownAndWait()
    let sequence = loop.sourceSequence(of: Int.self)
    #expect(sequence.post(1) == .terminated)
    let ended = try await withWatchdog(timeout: .seconds(10), "sequence on a dead loop") { () async -> Bool in
      for await _ in sequence { return false }
      return true
    }
    #expect(ended == true)
  }

  @Test func breakingOutOfTheLoopRemovesTheSource() async throws {
    let loop = try RunLoopThread(name: "seq-break")
    defer { loop.shutdownAndWait() }
    let cancels = SequenceCallLog()
    let sequence = loop.sourceSequence(
      of: Int.self, onCancel: { cancelLoop in cancels.record(onLoopThread: cancelLoop.isOnLoopThread) })
    for value in 0..<5 { _ = sequence.post(value) }
    let first = await consumeOnLoop(loop) { () async -> Int? in
      for await value in sequence { return value }
      return nil
    }
    #expect(first == 0)
    await eventually("cancel routine after break") { cancels.count == 1 }
    #expect(sequence.post(9) == .terminated)
  }

  @Test func anAsyncProducerSuspendsOnAFullBufferAndResumesWhenTheConsumerTakes() async throws {
    let loop = try RunLoopThread(name: "seq-bounded")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(2))
    #expect(await sequence.send(1) == .enqueued)
    #expect(await sequence.send(2) == .enqueued)
    #expect(sequence.post(3) == .full)  // a synchronous poster is told, nothing is lost silently
    let producer = Task { await sequence.send(3) }
    await eventually("producer waits for room") { sequence.waitingProducerCount == 1 }
    let values = try await withWatchdog(timeout: .seconds(10), "consumer of a bounded buffer") {
      await consumeOnLoop(loop) { () async -> [Int] in
        var values: [Int] = []
        for await value in sequence {
          values.append(value)
          if values.count == 3 { break }
        }
        return values
      }
    }
    #expect(values == [1, 2, 3])
    #expect(await producer.value == .enqueued)
  }

  @Test func aCancelledAsyncProducerIsAnsweredFullWithoutItsElementTaken() async throws {
    let loop = try RunLoopThread(name: "seq-prodcancel")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(1))
    #expect(sequence.post(1) == .enqueued)
    let producer = Task { await sequence.send(2) }
    await eventually("producer waits") { sequence.waitingProducerCount == 1 }
    producer.cancel()
    let result = try await withWatchdog(timeout: .seconds(10), "cancelled producer") { await producer.value }
    #expect(result == .full)
    #expect(sequence.bufferedCount == 1)
  }

  @Test func invalidatingAnswersWaitingProducersTerminated() async throws {
    let loop = try RunLoopThread(name: "seq-prodinval")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(1))
    #expect(sequence.post(1) == .enqueued)
    let producer = Task { await sequence.send(2) }
    await eventually("producer waits") { sequence.waitingProducerCount == 1 }
    sequence.invalidate()
    let result = try await withWatchdog(timeout: .seconds(10), "producer after invalidate") { await producer.value }
    #expect(result == .terminated)
  }

  @Test func dropPoliciesCountDropsExactly() async throws {
    let loop = try RunLoopThread(name: "seq-drops")
    defer { loop.shutdownAndWait() }
    for buffering in [SourceBuffering.dropOldest(10), .dropNewest(10)] {
      let sequence = loop.sourceSequence(of: Int.self, buffering: buffering)
      var taken = 0
      for value in 0..<1_000 where sequence.post(value).isEnqueued { taken += 1 }
      #expect(sequence.droppedCount == 990, "\(buffering)")
      let values = await consumeOnLoop(loop) { () async -> [Int] in
        var values: [Int] = []
        for await value in sequence {
          values.append(value)
          if values.count == 10 { break }
        }
        return values
      }
      switch buffering {
      case .dropOldest: #expect(values == Array(990..<1_000))
      case .dropNewest: #expect(values == Array(0..<10))
      case .unbounded, .bounded: break
      }
      #expect(taken == (buffering == .dropOldest(10) ? 1_000 : 10))
    }
  }

  @Test func elementsAreReleasedOnlyWhileTheLoopRunsOneOfTheSourcesModes() async throws {
    let loop = try RunLoopThread(name: "seq-modes")
    defer { loop.shutdownAndWait() }
    let tracking = RunLoopMode("tracking")
    let sequence = loop.sourceSequence(of: Int.self, modes: [tracking])
    let received = Locked<[Int]>([])
    let consumer = Task(executorPreference: loop) {
      for await value in sequence { received.withLock { $0.append(value) } }
    }
    #expect(sequence.post(1) == .enqueued)
    try await Task.sleep(for: .milliseconds(50))
    #expect(received.withLock { $0 }.isEmpty)  // the loop runs .default: the source does not fire
    loop.perform(inModes: [.default]) {
      loop.run(mode: tracking, for: .milliseconds(100))  // a nested run in the source's mode
    }
    await eventually("released in the tracking mode") { received.withLock { $0 } == [1] }
    sequence.invalidate()
    _ = try await withWatchdog(timeout: .seconds(10), "consumer end") { await consumer.value }
  }

  @Test func aConsumerOnTheSourcesLoopTakesElementsInBatches() async throws {
    let loop = try RunLoopThread(name: "seq-batch")
    defer { loop.shutdownAndWait() }
    let passes = Atomic<Int>(0)
    let observer = LoopObserver(activities: .beforeTimers) { _, _ in
      passes.wrappingAdd(1, ordering: .relaxed)  // counting only
    }
    loop.add(observer, to: .common)
    let count = 20_000
    let sequence = loop.sourceSequence(of: Int.self)
    for value in 0..<count { _ = sequence.post(value) }
    let before = passes.load(ordering: .relaxed)
    let sum = await consumeOnLoop(loop) { () async -> Int in
      var sum = 0
      var received = 0
      for await value in sequence {
        sum += value
        received += 1
        if received == count { break }
      }
      return sum
    }
    let used = passes.load(ordering: .relaxed) - before
    observer.invalidate()
    #expect(sum == count * (count - 1) / 2)
    #expect(used < 100, "the consumer should take its elements in a few passes, not one per element: \(used)")
  }

  @Test func aSecondIteratorTrapsWithAClearMessage() async {
    await #expect(processExitsWith: .failure) {
      let loop = try RunLoopThread(name: "seq-trap")
      let sequence = loop.sourceSequence(of: Int.self)
      _ = sequence.makeAsyncIterator()
      _ = sequence.makeAsyncIterator()
    }
  }

  @Test func cancellationRacingPostsEndsOnceAndRunsCancelOnceOnTheLoopThread() async throws {
    let loop = try RunLoopThread(name: "seq-race")
    defer { loop.shutdownAndWait() }
    let rounds = 200 * stressFactor
    var scheduledRounds = 0
    for round in 0..<rounds {
      let schedules = SequenceCallLog()
      let cancels = SequenceCallLog()
      let sequence = loop.sourceSequence(
        of: Int.self,
        onSchedule: { scheduleLoop, _ in schedules.record(onLoopThread: scheduleLoop.isOnLoopThread) },
        onCancel: { cancelLoop in cancels.record(onLoopThread: cancelLoop.isOnLoopThread) })
      let posting = Atomic<Bool>(true)
      let poster = SequenceTestThread.start {
        var value = 0
        while posting.load(ordering: .relaxed) {
          if sequence.post(value) == .terminated { break }
          value += 1
        }
      }
      let consumer = Task(executorPreference: round.isMultiple(of: 2) ? loop : nil) { () async -> Int in
        var count = 0
        for await _ in sequence { count += 1 }
        return count
      }
      if round % 3 != 0 { usleep(UInt32(round % 7) * 50) }
      consumer.cancel()
      let ended = try await withWatchdog(timeout: .seconds(10), "round \(round)") { () async -> Bool in
        _ = await consumer.value
        return true
      }
      #expect(ended == true)
      #expect(sequence.post(-1) == .terminated, "round \(round)")
      posting.store(false, ordering: .relaxed)
      poster.join()
      await loopBarrier(loop)  // the add and the removal were queued before this block
      // Cancel is paired with schedule (as in CF): a source cancelled before its loop scheduled
      // it is never scheduled, and gets no cancel either.
      #expect(schedules.count <= 1, "round \(round)")
      #expect(cancels.count == schedules.count, "round \(round)")
      #expect(cancels.allOnLoopThread && schedules.allOnLoopThread, "round \(round)")
      scheduledRounds += schedules.count
    }
    #expect(scheduledRounds > rounds / 2)
  }
}

// MARK: - Helpers for the sequence tests

/// Runs `body` in a task that prefers `loop` (so its nonisolated code runs on the loop thread).
func consumeOnLoop<T: Sendable>(_ loop: RunLoopThread, _ body: @escaping @Sendable () async -> T) async -> T {
  await Task(executorPreference: loop) { await body() }.value
}

/// Suspends until the loop has run a block performed now: everything queued for the loop before
/// (registration changes, removals, blocks) has been applied.
func loopBarrier(_ loop: RunLoopThread) async {
  await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
    if !loop.perform({ continuation.resume() }) { continuation.resume() }
  }
}

/// Polls `condition` every millisecond without blocking a thread; records a failure after
/// `timeout`. For async tests (the blocking `waitUntil` would starve the cooperative pool).
@discardableResult
func eventually(
  _ what: String, timeout: Duration = .seconds(20), sourceLocation: SourceLocation = #_sourceLocation,
  _ condition: () -> Bool
) async -> Bool {
  let timeout = timeout * watchdogScale
  let deadline = ContinuousClock.now.advanced(by: timeout)
  while !condition() {
    if ContinuousClock.now >= deadline {
      Issue.record("timed out after \(timeout) waiting for \(what)", sourceLocation: sourceLocation)
      return false
    }
    try? await Task.sleep(for: .milliseconds(1))
  }
  return true
}

/// A plain thread for producers (C-callback style: no task, no await).
final class SequenceTestThread: @unchecked Sendable {
  // Safety: `thread` is written by `start` before it returns and read by `join` on the thread
  // that called `start`; `body` is immutable.
  private let body: @Sendable () -> Void
  private var thread = pthread_t()

  private init(_ body: @escaping @Sendable () -> Void) { self.body = body }

  static func start(_ body: @escaping @Sendable () -> Void) -> SequenceTestThread {
    let started = SequenceTestThread(body)
    let context = Unmanaged.passRetained(started).toOpaque()
    let rc = pthread_create(
      &started.thread, nil,
      { raw in
        let thread = Unmanaged<SequenceTestThread>.fromOpaque(raw!).takeRetainedValue()
        thread.body()
        return nil
      }, context)
    precondition(rc == 0, "pthread_create failed: \(rc)")
    return started
  }

  func join() { pthread_join(thread, nil) }
}

/// The three ways a waiting consumer must be ended promptly.
enum SequenceEnding: String, CaseIterable {
  /// The consuming task is cancelled.
  case cancel
  /// The sequence (its source, timer, descriptor or observer) is invalidated.
  case invalidate
  /// The loop shuts down.
  case shutdown

  /// Lets `consumer` start waiting (20 ms), ends it this way (cancelling it, calling `invalidate`
  /// or shutting `loop` down) and awaits its result; nil if it is still running after 10 s (the
  /// watchdog then records "`what` after `self`").
  func end<Result: Sendable>(
    _ consumer: Task<Result, Never>, invalidate: () -> Void, loop: RunLoopThread, _ what: String,
    sourceLocation: SourceLocation = #_sourceLocation
  ) async throws -> Result? {
    try await Task.sleep(for: .milliseconds(20))
    switch self {
    case .cancel: consumer.cancel()
    case .invalidate: invalidate()
    case .shutdown: loop.shutdown()
    }
    return try await withWatchdog(timeout: .seconds(10), "\(what) after \(self)", sourceLocation: sourceLocation) {
      await consumer.value
    }
  }
}

/// Records calls of a routine and whether each ran on the loop thread.
final class SequenceCallLog: Sendable {
  private let calls = Locked<[Bool]>([])

  func record(onLoopThread: Bool) { calls.withLock { $0.append(onLoopThread) } }
  var count: Int { calls.withLock { $0.count } }
  var allOnLoopThread: Bool { calls.withLock { $0.allSatisfy { $0 } } }
}
