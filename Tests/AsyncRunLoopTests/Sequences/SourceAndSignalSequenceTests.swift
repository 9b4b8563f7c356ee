import Glibc
import Testing

@testable import AsyncRunLoop

// MARK: - Source sequences

@Suite("Source and signal sequences deliver and end exactly", .serialized, .timeLimit(.minutes(10)))
struct SourceAndSignalSequenceTests {
  /// Promised: every accepted element is delivered exactly once and in order per producer. Three
  /// async producers `send` into a `.bounded(3)` buffer (suspending while it is full) while two
  /// plain threads `post` (retrying on `.full`); the consumer prefers the loop. After everything
  /// was sent, `invalidate()` ends the sequence once the accepted elements are delivered.
  @Test func boundedSendAndPostFromManyProducersDeliverEachElementOnceInOrder() async throws {
    let perProducer = 400
    let outcome = try await withWatchdog(timeout: .seconds(40), "many producers") {
      () async throws -> (seen: [Int: [Int]], refused: Int) in
      let loop = try RunLoopThread(name: "mp")
      let sequence = loop.sourceSequence(of: ProducedItem.self, buffering: .bounded(3))
      let consumer = Task(executorPreference: loop) { () -> [Int: [Int]] in
        var seen: [Int: [Int]] = [:]
        for await item in sequence { seen[item.producer, default: []].append(item.index) }
        return seen
      }
      let refused = AtomicCounter()
      async let posters: Void = withTaskGroup(of: Void.self) { group in
        for producer in 3..<5 {
          group.addTask {
            await execOnNewThread {
              for index in 0..<perProducer {
                while true {
                  let result = sequence.post(ProducedItem(producer: producer, index: index))
                  if result == .full {
                    sched_yield()
                    continue
                  }
                  if result != .enqueued { refused.increment() }
                  break
                }
              }
            }
          }
        }
      }
      await withTaskGroup(of: Void.self) { group in
        for producer in 0..<3 {
          group.addTask {
            for index in 0..<perProducer {
              let result = await sequence.send(ProducedItem(producer: producer, index: index))
              if result != .enqueued { refused.increment() }
            }
          }
        }
      }
      await posters
      sequence.invalidate()
      let seen = await consumer.value
      await execShutdown(loop)
      return (seen, refused.current)
    }
    guard let outcome else { return }
    #expect(outcome.refused == 0, "\(outcome.refused) elements were refused")
    for producer in 0..<5 {
      let indices = outcome.seen[producer] ?? []
      #expect(
        indices == Array(0..<perProducer), "producer \(producer): \(indices.count) elements, out of order or lost")
    }
  }

  /// Promised: `.dropOldest` keeps the newest `capacity` elements and `.dropNewest` the oldest,
  /// each dropped one counted, and the kept ones are delivered in order. The loop is held in a
  /// block while ten elements are posted, so none is released in between.
  @Test func dropPoliciesKeepTheRightElementsWhenTheLoopFallsBehind() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "drop policies") {
      () async throws -> (oldest: [Int], newest: [Int], dropped: [Int], results: [[SourcePostResult]]) in
      let loop = try RunLoopThread(name: "drop")
      let dropOldest = loop.sourceSequence(of: Int.self, buffering: .dropOldest(4))
      let dropNewest = loop.sourceSequence(of: Int.self, buffering: .dropNewest(4))
      let results = await execOnNewThread { () -> [[SourcePostResult]] in
        let release = blockLoop(loop)
        defer { release.open() }
        return [(0..<10).map { dropOldest.post($0) }, (0..<10).map { dropNewest.post($0) }]
      }
      let dropped = [dropOldest.droppedCount, dropNewest.droppedCount]
      dropOldest.invalidate()
      dropNewest.invalidate()
      var oldest: [Int] = []
      for await value in dropOldest { oldest.append(value) }
      var newest: [Int] = []
      for await value in dropNewest { newest.append(value) }
      await execShutdown(loop)
      return (oldest, newest, dropped, results)
    }
    guard let outcome else { return }
    #expect(outcome.oldest == [6, 7, 8, 9])
    #expect(outcome.newest == [0, 1, 2, 3])
    #expect(outcome.dropped == [6, 6])
    #expect(
      outcome.results[0] == Array(repeating: .enqueued, count: 4) + Array(repeating: .enqueuedDroppingOldest, count: 6))
    #expect(outcome.results[1] == Array(repeating: .enqueued, count: 4) + Array(repeating: .dropped, count: 6))
  }

  /// Promised: `invalidate()` from another thread while the consumer is suspended in `next()`
  /// delivers what was accepted, then `next()` returns nil; `onCancel` runs once, on the loop
  /// thread; later posts answer `.terminated`.
  @Test func invalidateFromAnotherThreadWhileTheConsumerWaitsDeliversThenEnds() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "invalidate while waiting") {
      () async throws -> (values: [Int], cancels: Int, onLoop: Bool, after: SourcePostResult) in
      let loop = try RunLoopThread(name: "inv")
      let cancels = AtomicCounter()
      let onLoop = Locked(true)
      let sequence = loop.sourceSequence(
        of: Int.self,
        onCancel: { cancelLoop in
          cancels.increment()
          if !cancelLoop.isOnLoopThread { onLoop.withLock { $0 = false } }
        })
      let consumer = Task { () -> [Int] in
        var values: [Int] = []
        for await value in sequence { values.append(value) }
        return values
      }
      _ = await pollEveryMillisecond { isConsumerWaiting(sequence) }
      await execOnNewThread {
        let release = blockLoop(loop)  // the posts and the invalidation reach the loop together
        for value in 0..<5 { _ = sequence.post(value) }
        sequence.invalidate()
        release.open()
      }
      let values = await consumer.value
      let after = sequence.post(99)
      _ = await pollEveryMillisecond { cancels.current > 0 }
      await execShutdown(loop)
      return (values, cancels.current, onLoop.withLock { $0 }, after)
    }
    guard let outcome else { return }
    #expect(outcome.values == [0, 1, 2, 3, 4])
    #expect(outcome.cancels == 1)
    #expect(outcome.onLoop)
    #expect(outcome.after == .terminated)
  }

  /// Promised: cancelling the consuming task while it is not suspended (it holds a batch) ends the
  /// sequence at once: the next `next()` returns nil, `onCancel` runs once, later posts answer
  /// `.terminated`, and a producer waiting in `send` is answered `.terminated`.
  @Test func cancellingTheConsumerBetweenElementsEndsTheSequence() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "cancel between elements") {
      () async throws -> (taken: [Int], cancels: Int, post: SourcePostResult, send: SourcePostResult) in
      let loop = try RunLoopThread(name: "cancel")
      let cancels = AtomicCounter()
      let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(3), onCancel: { _ in cancels.increment() })
      for value in 0..<3 { _ = sequence.post(value) }
      let sender = Task { await sequence.send(3) }  // waits: the buffer is full
      _ = await pollEveryMillisecond { sequence.waitingProducerCount == 1 }
      let consumer = Task { () -> [Int] in
        var taken: [Int] = []
        var iterator = sequence.makeAsyncIterator()
        while let value = await iterator.next() {
          taken.append(value)
          if taken.count == 1 { withUnsafeCurrentTask { $0?.cancel() } }
        }
        return taken
      }
      let taken = await consumer.value
      let send = await sender.value
      _ = await pollEveryMillisecond { cancels.current > 0 }
      let post = sequence.post(7)
      await execShutdown(loop)
      return (taken, cancels.current, post, send)
    }
    guard let outcome else { return }
    #expect(outcome.taken == [0], "after the cancellation the consumer still took \(outcome.taken)")
    #expect(outcome.cancels == 1)
    #expect(outcome.post == .terminated)
    // The sender's element joined the buffer when the consumer took its batch (it was then
    // discarded with the buffer), or it was still waiting and was answered `.terminated`.
    #expect(outcome.send == .enqueued || outcome.send == .terminated, "send answered \(outcome.send)")
  }

  /// Promised: cancelling the consuming task while it is suspended in `next()` ends it (nil);
  /// the source leaves its loop (`onCancel` once) and later posts answer `.terminated`.
  @Test func cancellingASuspendedConsumerEndsItAndDetachesTheSource() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "cancel suspended") {
      () async throws -> (count: Int, cancels: Int, post: SourcePostResult, records: Int?) in
      let loop = try RunLoopThread(name: "cancel2")
      let cancels = AtomicCounter()
      let sequence = loop.sourceSequence(of: Int.self, onCancel: { _ in cancels.increment() })
      let consumer = Task(executorPreference: loop) { () -> Int in
        var count = 0
        for await _ in sequence { count += 1 }
        return count
      }
      _ = await pollEveryMillisecond { isConsumerWaiting(sequence) }
      consumer.cancel()
      let count = await consumer.value
      _ = await pollEveryMillisecond { cancels.current > 0 }
      let post = sequence.post(1)
      let records = await execOnNewThread { try? loop.performAndWait { loop.core.modeTable.allRecords.count } }
      await execShutdown(loop)
      return (count, cancels.current, post, records)
    }
    guard let outcome else { return }
    #expect(outcome.count == 0)
    #expect(outcome.cancels == 1)
    #expect(outcome.post == .terminated)
    #expect(outcome.records == 0, "the loop still holds \(String(describing: outcome.records)) records")
  }

  /// Promised: a `SignalSequence` delivers, after `invalidate()`, every signal made before it:
  /// with four threads signalling 5,000 times each, the elements (each at least 1) add up to
  /// exactly 20,000.
  @Test func signalsFromManyThreadsAddUpExactlyAfterInvalidate() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "signal sums") {
      () async throws -> (sum: Int, smallest: Int, accepted: Int) in
      let loop = try RunLoopThread(name: "sig")
      let sequence = loop.signalSequence()
      let consumer = Task { () -> (Int, Int) in
        var sum = 0
        var smallest = Int.max
        for await count in sequence {
          sum += count
          smallest = min(smallest, count)
        }
        return (sum, smallest)
      }
      let accepted = AtomicCounter()
      await execOnNewThread {
        race(
          (0..<4).map { _ in
            {
              for _ in 0..<5_000 where sequence.signal() { accepted.increment() }
            }
          })
      }
      sequence.invalidate()
      let (sum, smallest) = await consumer.value
      await execShutdown(loop)
      return (sum, smallest, accepted.current)
    }
    guard let outcome else { return }
    #expect(outcome.accepted == 20_000)
    #expect(outcome.sum == 20_000, "the elements add up to \(outcome.sum)")
    #expect(outcome.smallest >= 1)
  }
}
