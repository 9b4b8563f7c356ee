import Dispatch
import Glibc
import Testing

@testable import AsyncRunLoop

// MARK: - Source sequences

@Suite("Source, command and signal sequences racing their end", .serialized, .timeLimit(.minutes(10)))
struct SequencesRacingTheirEndTests {
  /// Promised: every accepted post is delivered exactly once, in each producer's order, also
  /// when the sequence ends (loop shutdown, `invalidate()`, the source's removal) mid-stream; the
  /// consumer (slow: it yields often) then ends, and `onCancel` runs once.
  @Test(arguments: [StreamEnding.shutdown, .invalidate, .remove])
  func sourceSequencePostsRacingTheEndAreDeliveredOnceInOrder(end: StreamEnding) async throws {
    let producers = 4
    let perProducer = 1500
    let outcome = try await withWatchdog(timeout: .seconds(20), "source posts racing \(end)") {
      () async throws -> (seen: [Int: [Int]], accepted: [Int: [Int]], cancels: Int) in
      let loop = try RunLoopThread(name: "src")
      let cancels = AtomicCounter()
      let sequence = loop.sourceSequence(of: ProducedItem.self, onCancel: { _ in cancels.increment() })
      let consumer = Task { () -> [Int: [Int]] in
        var seen: [Int: [Int]] = [:]
        var count = 0
        for await item in sequence {
          seen[item.producer, default: []].append(item.index)
          count += 1
          if count % 32 == 0 { await Task.yield() }
        }
        return seen
      }
      let accepted = await racePostsAgainstEnd(
        producers: producers, perProducer: perProducer,
        end: { endStream(end, loop: loop, source: sequence.source, invalidate: sequence.invalidate) },
        post: { sequence.post($0).isEnqueued })
      let seen = await consumer.value
      await execShutdown(loop)
      return (seen, accepted, cancels.current)
    }
    guard let outcome else { return }
    for producer in 0..<producers {
      let mine = outcome.accepted[producer] ?? []
      #expect(mine == Array(0..<mine.count), "producer \(producer): accepted posts are not a prefix")
      #expect((outcome.seen[producer] ?? []) == mine, "producer \(producer): delivered != accepted")
    }
    #expect(outcome.cancels == 1)
  }

  /// The same with the consumer on a `LoopActor` of the sequence's own loop (resumed from the loop
  /// thread itself), ended by the loop's shutdown: the consumer's jobs then move to the fallback.
  @Test func sourceSequenceConsumedOnItsLoopsActorSurvivesShutdownMidStream() async throws {
    let producers = 3
    let perProducer = 1500
    let outcome = try await withWatchdog(timeout: .seconds(20), "actor consumer racing shutdown") {
      () async throws -> (seen: [Int: [Int]], accepted: [Int: [Int]]) in
      let loop = try RunLoopThread(name: "src-actor")
      let sequence = loop.sourceSequence(of: ProducedItem.self, buffering: .unbounded)
      let actor = CallLoggingActor(loop: loop)
      let consumer = Task { await actor.consume(sequence) }
      let accepted = await racePostsAgainstEnd(
        producers: producers, perProducer: perProducer, end: { loop.shutdown() },
        post: { sequence.post($0).isEnqueued })
      let seen = await consumer.value
      await execShutdown(loop)
      return (seen, accepted)
    }
    guard let outcome else { return }
    for producer in 0..<producers {
      #expect((outcome.seen[producer] ?? []) == (outcome.accepted[producer] ?? []), "producer \(producer)")
    }
  }

  /// Promised (`CommandSource`): every command `post` accepted is handled exactly once, in
  /// posting order per thread, also when the source is invalidated, removed (then invalidated)
  /// or its loop shuts down mid-stream.
  @Test(arguments: [StreamEnding.shutdown, .invalidate, .remove])
  func commandSourcePostsRacingTheEndAreHandledOnceInOrder(end: StreamEnding) async throws {
    let producers = 4
    let perProducer = 1500
    let outcome = try await withWatchdog(timeout: .seconds(20), "command posts racing \(end)") {
      () async throws -> (seen: [Int: [Int]], accepted: [Int: [Int]], cancels: Int) in
      let loop = try RunLoopThread(name: "cmd")
      let seen = Guarded<[Int: [Int]]>([:])
      let cancels = AtomicCounter()
      let commands = CommandSource<ProducedItem>(cancel: { _, _ in cancels.increment() }) { item in
        seen.withLock { $0[item.producer, default: []].append(item.index) }
      }
      loop.add(commands.source, to: .common)
      let accepted = await racePostsAgainstEnd(
        producers: producers, perProducer: perProducer,
        end: { endStream(end, loop: loop, source: commands.source, invalidate: commands.source.invalidate) },
        post: { commands.post($0) })
      commands.source.invalidate()
      await execShutdown(loop)
      return (seen.snapshot, accepted, cancels.current)
    }
    guard let outcome else { return }
    for producer in 0..<producers {
      #expect((outcome.seen[producer] ?? []) == (outcome.accepted[producer] ?? []), "producer \(producer)")
    }
    #expect(outcome.cancels == 1)
  }

  /// Promised (`SignalSequence`): the elements are the numbers of signals they stand for, and
  /// signals made before `invalidate()` are still delivered: the delivered counts add up to the
  /// number of signals `signal()` accepted (returned true for), with many signalling threads.
  @Test(arguments: [StreamEnding.shutdown, .invalidate, .remove])
  func signalSequenceCountsAddUpToTheAcceptedSignals(end: StreamEnding) async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "signals racing \(end)") {
      () async throws -> (delivered: Int, accepted: Int, elements: Int) in
      let loop = try RunLoopThread(name: "sig")
      let sequence = loop.signalSequence()
      let consumer = Task { () -> (Int, Int) in
        var total = 0
        var elements = 0
        for await count in sequence {
          total += count
          elements += 1
          if elements % 8 == 0 { await Task.yield() }
        }
        return (total, elements)
      }
      let accepted = await racePostsAgainstEnd(
        producers: 4, perProducer: 3000,
        end: { endStream(end, loop: loop, source: sequence.source, invalidate: sequence.invalidate) },
        post: { _ in sequence.signal() })
      let (total, elements) = await consumer.value
      await execShutdown(loop)
      return (total, accepted.values.map(\.count).reduce(0, +), elements)
    }
    guard let outcome else { return }
    #expect(outcome.delivered == outcome.accepted)
    #expect(outcome.elements >= (outcome.accepted > 0 ? 1 : 0))
  }

  /// Promised: async producers waiting in `send` on a full `.bounded` buffer learn
  /// `.terminated` when the sequence ends; each element `send` answered `.enqueued` for is
  /// delivered once; nothing hangs.
  @Test(arguments: [StreamEnding.shutdown, .invalidate])
  func waitingSendersAreReleasedWhenABoundedSequenceEnds(end: StreamEnding) async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "senders racing \(end)") {
      () async throws -> (seen: [Int], enqueued: [Int], terminated: Int) in
      let loop = try RunLoopThread(name: "send")
      let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(2))
      // Fill the buffer; no consumer yet.
      #expect(sequence.post(-1) == .enqueued)
      #expect(sequence.post(-2) == .enqueued)
      let senders = (0..<6).map { value in Task { (value, await sequence.send(value)) } }
      #expect(await pollEveryMillisecond { sequence.waitingProducerCount == 6 })
      await execOnNewThread { endStream(end, loop: loop, source: sequence.source, invalidate: sequence.invalidate) }
      var results: [Int: SourcePostResult] = [:]
      for sender in senders {
        let (value, result) = await sender.value
        results[value] = result
      }
      var seen: [Int] = []
      for await value in sequence { seen.append(value) }
      await execShutdown(loop)
      let enqueued = results.filter { $0.value == .enqueued }.keys.sorted()
      return (seen, enqueued, results.values.filter { $0 == .terminated }.count)
    }
    guard let outcome else { return }
    #expect(outcome.seen == [-1, -2] + outcome.enqueued)
    #expect(outcome.terminated == 6 - outcome.enqueued.count)
  }

  /// Promised: a consumer whose task is cancelled before it first asks gets nil at once, the
  /// source leaves the loop (`onCancel` once), and later posts answer `.terminated`.
  @Test func consumerCancelledBeforeItAsksEndsAtOnceAndDetaches() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "cancelled-first consumer") {
      () async throws -> (first: Int?, later: SourcePostResult, cancels: Int) in
      let loop = try RunLoopThread(name: "cancel-first")
      let cancels = AtomicCounter()
      let sequence = loop.sourceSequence(of: Int.self, onCancel: { _ in cancels.increment() })
      _ = sequence.post(1)
      let gate = TestGate()
      let consumer = Task { () -> Int? in
        await execOnNewThread { _ = gate.wait(timeout: .seconds(10)) }
        var iterator = sequence.makeAsyncIterator()
        return await iterator.next()
      }
      consumer.cancel()
      gate.open()
      let first = await consumer.value
      #expect(await pollEveryMillisecond { cancels.current == 1 })
      let later = sequence.post(2)
      await execShutdown(loop)
      return (first, later, cancels.current)
    }
    guard let outcome else { return }
    #expect(outcome.first == nil)
    #expect(outcome.later == .terminated)
    #expect(outcome.cancels == 1)
  }

  /// Promised: `next()` after the sequence ended keeps returning nil (no trap, no hang), for every
  /// kind of sequence that ends through `invalidate()`.
  @Test func nextAfterTheEndKeepsReturningNil() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "next after end") { () async throws -> [Bool] in
      let loop = try RunLoopThread(name: "after-end")
      let source = loop.sourceSequence(of: Int.self)
      _ = source.post(7)
      source.invalidate()
      var sourceIterator = source.makeAsyncIterator()
      let a = await sourceIterator.next() == 7
      let b = await sourceIterator.next() == nil
      let c = await sourceIterator.next() == nil
      let signals = loop.signalSequence()
      signals.invalidate()
      var signalIterator = signals.makeAsyncIterator()
      let d = await signalIterator.next() == nil
      let e = await signalIterator.next() == nil
      let timer = loop.timer(after: .zero)
      var timerIterator = timer.makeAsyncIterator()
      let f = await timerIterator.next() != nil
      let g = await timerIterator.next() == nil
      let h = await timerIterator.next() == nil
      await execShutdown(loop)
      return [a, b, c, d, e, f, g, h]
    }
    #expect(outcome == Array(repeating: true, count: 8))
  }

  /// A sequence made on a loop that has shut down ends at once: the consumer gets nil, posts
  /// answer `.terminated`, `signal()` false.
  @Test func sequencesOnAShutDownLoopEndAtOnce() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "sequences on a dead loop") {
      () async throws -> [Bool] in
      let loop = try RunLoopThread(name: "dead")
      await execShutdown(loop)
      let source = loop.sourceSequence(of: Int.self)
      let post = source.post(1)
      var sourceIterator = source.makeAsyncIterator()
      let sourceEnd = await sourceIterator.next()
      let signals = loop.signalSequence()
      let signalled = signals.signal()
      var signalIterator = signals.makeAsyncIterator()
      let signalEnd = await signalIterator.next()
      var timerIterator = loop.timer(every: .seconds(3600)).makeAsyncIterator()
      let timerEnd = await timerIterator.next()
      var activityIterator = loop.activities().makeAsyncIterator()
      let activityEnd = await activityIterator.next()
      return [post == .terminated, sourceEnd == nil, !signalled, signalEnd == nil, timerEnd == nil, activityEnd == nil]
    }
    #expect(outcome == Array(repeating: true, count: 6))
  }
}
