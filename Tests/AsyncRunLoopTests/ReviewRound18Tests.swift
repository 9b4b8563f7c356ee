import Dispatch
import Glibc
import Testing

@_spi(Testing) @testable import AsyncRunLoop

// Review round 18: an external acceptance pass over the async surface (source, command, signal,
// timer, readiness and activity sequences racing their end), the executor (actors pinned to a
// loop, sleeps, modal runs, shutdown with pending work, LoopGroup). Blocking work runs on threads
// of the tests' own; results are checked after the watchdog returns.

private let r18ModeA: RunLoopMode = "r18-a"

/// One element of a multi-producer test.
private struct R18Item: Sendable, Equatable {
  let producer: Int
  let index: Int
}

/// How a stream is ended while producers still post.
enum R18End: Sendable, CustomStringConvertible {
  case shutdown
  case invalidate
  case remove

  var description: String {
    switch self {
    case .shutdown: return "shutdown"
    case .invalidate: return "invalidate"
    case .remove: return "remove"
    }
  }
}

/// An actor pinned to a loop that logs calls in order.
private actor R18Logger: LoopActor {
  nonisolated let loop: RunLoopThread
  private(set) var entries: [Int] = []
  init(loop: RunLoopThread) { self.loop = loop }

  func append(_ value: Int) -> Bool {
    entries.append(value)
    return loop.isOnLoopThread || loop.isShutDown
  }

  func sleepThenAppend(_ value: Int) async throws {
    try await Task.sleep(for: .milliseconds(30))
    entries.append(value)
  }

  /// Consumes `sequence` on this actor (the loop's thread).
  func consume(_ sequence: SourceSequence<R18Item>) async -> [Int: [Int]] {
    var seen: [Int: [Int]] = [:]
    for await item in sequence { seen[item.producer, default: []].append(item.index) }
    return seen
  }
}

/// Polls `condition` every millisecond without blocking a pool thread; false after `timeout`.
private func r18Poll(timeout: Duration = .seconds(10), _ condition: @Sendable () -> Bool) async -> Bool {
  let deadline = ContinuousClock.now.advanced(by: timeout * watchdogScale)
  while !condition() {
    if ContinuousClock.now >= deadline { return false }
    try? await Task.sleep(for: .milliseconds(1))
  }
  return true
}

/// Ends a stream the way `end` says, from the calling thread.
private func r18End(_ end: R18End, loop: RunLoopThread, source: InputSource, invalidate: () -> Void) {
  switch end {
  case .shutdown: loop.shutdown()
  case .invalidate: invalidate()
  case .remove: loop.remove(source, from: .common)
  }
}

/// `producers` threads post `perProducer` items each through `post`, while one more thread ends
/// the stream once a third of the posts were made. Returns, per producer, the indices accepted.
private func r18RacePosts(
  producers: Int, perProducer: Int, end: @escaping @Sendable () -> Void,
  post: @escaping @Sendable (R18Item) -> Bool
) async -> [Int: [Int]] {
  let accepted = Guarded<[Int: [Int]]>([:])
  let posted = AtomicCounter()
  await execOnNewThread {
    var bodies: [@Sendable () -> Void] = (0..<producers).map { producer in
      {
        var mine: [Int] = []
        for index in 0..<perProducer {
          if post(R18Item(producer: producer, index: index)) { mine.append(index) }
          posted.increment()
        }
        accepted.withLock { $0[producer] = mine }
      }
    }
    bodies.append {
      while posted.current < producers * perProducer / 3 { sched_yield() }
      end()
    }
    race(bodies)
  }
  return accepted.snapshot
}

// MARK: - Source sequences

@Suite("ReviewRound18: source, command and signal sequences racing their end", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound18SourceTests {
  /// Promised: every accepted post is delivered exactly once, in each producer's order, also
  /// when the sequence ends (loop shutdown, `invalidate()`, the source's removal) mid-stream; the
  /// consumer (slow: it yields often) then ends, and `onCancel` runs once.
  @Test(arguments: [R18End.shutdown, .invalidate, .remove])
  func sourceSequencePostsRacingTheEndAreDeliveredOnceInOrder(end: R18End) async throws {
    let producers = 4
    let perProducer = 1500
    let outcome = try await withWatchdog(timeout: .seconds(20), "source posts racing \(end)") {
      () async throws -> (seen: [Int: [Int]], accepted: [Int: [Int]], cancels: Int) in
      let loop = try RunLoopThread(name: "r18-src")
      let cancels = AtomicCounter()
      let sequence = loop.sourceSequence(of: R18Item.self, onCancel: { _ in cancels.increment() })
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
      let accepted = await r18RacePosts(
        producers: producers, perProducer: perProducer,
        end: { r18End(end, loop: loop, source: sequence.source, invalidate: sequence.invalidate) },
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
      let loop = try RunLoopThread(name: "r18-src-actor")
      let sequence = loop.sourceSequence(of: R18Item.self, buffering: .unbounded)
      let actor = R18Logger(loop: loop)
      let consumer = Task { await actor.consume(sequence) }
      let accepted = await r18RacePosts(
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
  @Test(arguments: [R18End.shutdown, .invalidate, .remove])
  func commandSourcePostsRacingTheEndAreHandledOnceInOrder(end: R18End) async throws {
    let producers = 4
    let perProducer = 1500
    let outcome = try await withWatchdog(timeout: .seconds(20), "command posts racing \(end)") {
      () async throws -> (seen: [Int: [Int]], accepted: [Int: [Int]], cancels: Int) in
      let loop = try RunLoopThread(name: "r18-cmd")
      let seen = Guarded<[Int: [Int]]>([:])
      let cancels = AtomicCounter()
      let commands = CommandSource<R18Item>(cancel: { _, _ in cancels.increment() }) { item in
        seen.withLock { $0[item.producer, default: []].append(item.index) }
      }
      loop.add(commands.source, to: .common)
      let accepted = await r18RacePosts(
        producers: producers, perProducer: perProducer,
        end: { r18End(end, loop: loop, source: commands.source, invalidate: commands.source.invalidate) },
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
  @Test(arguments: [R18End.shutdown, .invalidate, .remove])
  func signalSequenceCountsAddUpToTheAcceptedSignals(end: R18End) async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "signals racing \(end)") {
      () async throws -> (delivered: Int, accepted: Int, elements: Int) in
      let loop = try RunLoopThread(name: "r18-sig")
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
      let accepted = await r18RacePosts(
        producers: 4, perProducer: 3000,
        end: { r18End(end, loop: loop, source: sequence.source, invalidate: sequence.invalidate) },
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
  @Test(arguments: [R18End.shutdown, .invalidate])
  func waitingSendersAreReleasedWhenABoundedSequenceEnds(end: R18End) async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "senders racing \(end)") {
      () async throws -> (seen: [Int], enqueued: [Int], terminated: Int) in
      let loop = try RunLoopThread(name: "r18-send")
      let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(2))
      // Fill the buffer; no consumer yet.
      #expect(sequence.post(-1) == .enqueued)
      #expect(sequence.post(-2) == .enqueued)
      let senders = (0..<6).map { value in Task { (value, await sequence.send(value)) } }
      #expect(await r18Poll { sequence.waitingProducerCount == 6 })
      await execOnNewThread { r18End(end, loop: loop, source: sequence.source, invalidate: sequence.invalidate) }
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
      let loop = try RunLoopThread(name: "r18-cancel-first")
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
      #expect(await r18Poll { cancels.current == 1 })
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
      let loop = try RunLoopThread(name: "r18-after-end")
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
      let loop = try RunLoopThread(name: "r18-dead")
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

// MARK: - Timer, readiness and activity sequences

@Suite("ReviewRound18: timer, readiness and activity sequences", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound18MemberSequenceTests {
  /// Promised: a consumer waiting on a timer, readiness or activity sequence ends (nil) when the
  /// loop shuts down.
  @Test func waitingConsumersEndWhenTheLoopShutsDown() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "consumers at shutdown") { () async throws -> Int in
      let loop = try RunLoopThread(name: "r18-member-end")
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let timer = loop.timer(every: .seconds(3600))
      let readiness = try loop.readiness(of: pipe.read)
      let activities = loop.activities([.entry])
      let ended = AtomicCounter()
      let t1 = Task {
        for await _ in timer {}
        ended.increment()
      }
      let t2 = Task {
        for await _ in readiness {}
        ended.increment()
      }
      let t3 = Task {
        for await _ in activities {}
        ended.increment()
      }
      try await Task.sleep(for: .milliseconds(20))
      await execShutdown(loop)
      _ = await (t1.value, t2.value, t3.value)
      return ended.current
    }
    #expect(outcome == 3)
  }

  /// Promised: `invalidate()` from another thread ends a waiting timer, readiness or activity
  /// consumer.
  @Test func invalidateEndsWaitingMemberConsumers() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "consumers at invalidate") {
      () async throws -> Int in
      let loop = try RunLoopThread(name: "r18-member-inval")
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let timer = loop.timer(every: .seconds(3600))
      let readiness = try loop.readiness(of: pipe.read)
      let activities = loop.activities([.entry])
      let ended = AtomicCounter()
      let t1 = Task {
        for await _ in timer {}
        ended.increment()
      }
      let t2 = Task {
        for await _ in readiness {}
        ended.increment()
      }
      let t3 = Task {
        for await _ in activities {}
        ended.increment()
      }
      try await Task.sleep(for: .milliseconds(20))
      await execOnNewThread {
        timer.invalidate()
        readiness.invalidate()
        activities.invalidate()
      }
      _ = await (t1.value, t2.value, t3.value)
      await execShutdown(loop)
      return ended.current
    }
    #expect(outcome == 3)
  }

  /// Promised: cancelling the consuming task ends a waiting timer / readiness consumer (nil), and
  /// the member leaves the loop (a timer sequence's timer is invalidated).
  @Test func cancellingWaitingMemberConsumersEndsThem() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "cancelled member consumers") {
      () async throws -> (Bool, Bool) in
      let loop = try RunLoopThread(name: "r18-member-cancel")
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let timer = loop.timer(every: .seconds(3600))
      let readiness = try loop.readiness(of: pipe.read)
      let t1 = Task { () -> Int in
        var n = 0
        for await _ in timer { n += 1 }
        return n
      }
      let t2 = Task { () -> Int in
        var n = 0
        for await _ in readiness { n += 1 }
        return n
      }
      try await Task.sleep(for: .milliseconds(20))
      t1.cancel()
      t2.cancel()
      let counts = await (t1.value, t2.value)
      let timerGone = await r18Poll { !timer.timer.isValid }
      await execShutdown(loop)
      return (counts == (0, 0), timerGone)
    }
    #expect(outcome?.0 == true)
    #expect(outcome?.1 == true)
  }

  /// Readiness: a readable pipe yields, draining it lets the consumer wait again, the next write
  /// yields again; closing its loop then ends it.
  @Test func readinessYieldsPerWriteAfterEachDrain() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "readiness per write") { () async throws -> Int in
      let loop = try RunLoopThread(name: "r18-ready")
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let readiness = try loop.readiness(of: pipe.read)
      let count = AtomicCounter()
      let consumer = Task {
        for await _ in readiness {
          drainDescriptor(pipe.read)
          if count.increment() == 3 { break }
        }
      }
      for round in 1...3 {
        writeByte(pipe.write)
        #expect(await r18Poll { count.current >= round })
      }
      await consumer.value
      await execShutdown(loop)
      return count.current
    }
    #expect(outcome == 3)
  }

  /// Activities: a consumer on another executor sees `entry` and `exit` of nested runs in pairs
  /// and in order.
  @Test func activitySequenceSeesNestedRunsEntryExitInOrder() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "activities of nested runs") {
      () async throws -> [LoopActivity] in
      let loop = try RunLoopThread(name: "r18-act")
      let hold = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(hold, to: r18ModeA)
      let activities = loop.activities([.entry, .exit], modes: [r18ModeA])
      let seen = Guarded<[LoopActivity]>([])
      let consumer = Task {
        for await event in activities { seen.withLock { $0.append(event.activity) } }
      }
      for _ in 0..<3 {
        _ = try loop.performAndWait { loop.run(mode: r18ModeA, for: .milliseconds(1)) }
      }
      #expect(await r18Poll { seen.snapshot.count >= 6 })
      activities.invalidate()
      await consumer.value
      await execShutdown(loop)
      return seen.snapshot
    }
    #expect(outcome == [.entry, .exit, .entry, .exit, .entry, .exit])
  }

  /// A one-shot timer sequence delivers exactly one tick, then ends, even when the consumer asks
  /// late.
  @Test func oneShotTimerSequenceDeliversOneTickToALateConsumer() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "one-shot late") { () async throws -> Int in
      let loop = try RunLoopThread(name: "r18-oneshot")
      let timer = loop.timer(after: .milliseconds(1))
      #expect(await r18Poll { !timer.timer.isValid })
      var n = 0
      for await _ in timer { n += 1 }
      await execShutdown(loop)
      return n
    }
    #expect(outcome == 1)
  }
}

// MARK: - Executor

@Suite("ReviewRound18: executor", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound18ExecutorTests {
  /// Promised: no hung awaits. Calls to an actor pinned to a loop, made by one task in order and
  /// racing the loop's shutdown, each complete once, in order.
  @Test func actorCallsRacingShutdownCompleteOnceInOrder() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "actor calls racing shutdown") {
      () async throws -> (entries: [Int], offLoop: Int) in
      let loop = try RunLoopThread(name: "r18-actor")
      let actor = R18Logger(loop: loop)
      let offLoop = AtomicCounter()
      let caller = Task {
        // (1,000 calls, not 3,000: each is two hops through the shared cooperative pool, and
        // with other tests holding it the 3,000 once outlasted the watchdog.)
        for value in 0..<1000 where await !actor.append(value) { offLoop.increment() }
      }
      try await Task.sleep(for: .milliseconds(2))
      await execShutdown(loop)
      await caller.value
      return (await actor.entries, offLoop.current)
    }
    guard let outcome else { return }
    #expect(outcome.entries == Array(0..<1000))
    #expect(outcome.offLoop == 0)
  }

  /// Promised: `Task.sleep` in an actor pinned to a loop that shuts down meanwhile still completes
  /// (at its deadline, elsewhere): nobody hangs, nothing throws.
  @Test func actorSleepAcrossShutdownCompletes() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "actor sleep across shutdown") {
      () async throws -> [Int] in
      let loop = try RunLoopThread(name: "r18-actor-sleep")
      let actor = R18Logger(loop: loop)
      let sleepers = (0..<4).map { value in Task { try await actor.sleepThenAppend(value) } }
      try await Task.sleep(for: .milliseconds(5))
      await execShutdown(loop)
      for sleeper in sleepers { try await sleeper.value }
      return await actor.entries.sorted()
    }
    #expect(outcome == [0, 1, 2, 3])
  }

  /// Promised: a sleep on a loop's `clock` ends with `CancellationError` when the loop shuts down;
  /// `Task.sleep` under the loop's task-executor preference completes.
  @Test func loopClockSleepThrowsAtShutdownAndPreferredSleepCompletes() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "sleeps across shutdown") {
      () async throws -> (Bool, Bool) in
      let loop = try RunLoopThread(name: "r18-clock")
      let clockSleep = Task { () -> Bool in
        do {
          try await loop.clock.sleep(for: .seconds(3600))
          return false
        } catch { return error is CancellationError }
      }
      let preferred = Task(executorPreference: loop) { () -> Bool in
        do {
          try await Task.sleep(for: .milliseconds(30))
          return true
        } catch { return false }
      }
      try await Task.sleep(for: .milliseconds(5))
      await execShutdown(loop)
      return (await clockSleep.value, await preferred.value)
    }
    #expect(outcome?.0 == true)
    #expect(outcome?.1 == true)
  }

  /// Promised: jobs run in every mode, so an actor on the loop keeps answering while the loop is
  /// in a modal run (`runModal`) of a mode the actor knows nothing about; cancelling the modal
  /// task ends that run with `.stopped`.
  @Test func actorAnswersDuringAModalRunOfAnotherMode() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "actor during modal run") {
      () async throws -> (RunLoopRunResult?, Int) in
      let loop = try RunLoopThread(name: "r18-modal")
      let hold = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(hold, to: r18ModeA)
      let inModal = AtomicCounter()
      let observer = LoopObserver(activities: [.entry], repeats: true) { _, _ in inModal.increment() }
      loop.add(observer, to: r18ModeA)
      let actor = R18Logger(loop: loop)
      let modal = Task { try? await loop.runModal(mode: r18ModeA) }
      #expect(await r18Poll { inModal.current == 1 })
      for value in 0..<50 { _ = await actor.append(value) }
      modal.cancel()
      let result = await modal.value
      let count = await actor.entries.count
      await execShutdown(loop)
      return (result, count)
    }
    #expect(outcome?.0 == .stopped)
    #expect(outcome?.1 == 50)
  }

  /// SPEC §10: a run nested in one of the loop's own jobs runs no jobs; a job enqueued meanwhile
  /// runs after the outer job returns.
  @Test func jobsEnqueuedDuringANestedRunInAJobRunAfterIt() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "nested run in a job") {
      () async throws -> [String] in
      let loop = try RunLoopThread(name: "r18-nested")
      let log = EventLog()
      let actor = R18Nester(loop: loop, log: log)
      await actor.nest()
      await execShutdown(loop)
      return log.snapshot
    }
    #expect(outcome == ["outer-start", "outer-end", "inner"])
  }

  /// Off the loop `isIsolatingCurrentContext()` is false and on it true; `assumeIsolated` of an
  /// actor pinned to the loop holds in a source handler there.
  @Test func assumeIsolatedHoldsInAHandlerOnTheLoop() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "assumeIsolated in a handler") {
      () async throws -> (Bool?, Int) in
      let loop = try RunLoopThread(name: "r18-iso")
      let actor = R18Logger(loop: loop)
      let handled = AtomicCounter()
      let commands = CommandSource<Int> { value in
        actor.assumeIsolated { isolated in
          _ = isolated.append(value)
        }
        handled.increment()
      }
      loop.add(commands.source, to: .common)
      for value in 0..<10 { commands.post(value) }
      #expect(await r18Poll { handled.current == 10 })
      let offLoop = loop.isIsolatingCurrentContext()
      let entries = await actor.entries
      await execShutdown(loop)
      return (offLoop, entries.count)
    }
    #expect(outcome?.0 == false)
    #expect(outcome?.1 == 10)
  }

  /// `LoopGroup.next()` hands out every loop round-robin; after `shutdownAndWait()` actors on its
  /// loops still answer (fallback), exactly once per call.
  @Test func loopGroupRoundRobinAndActorsAfterShutdown() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "loop group") { () async throws -> (Bool, Int) in
      let group = try LoopGroup(count: 3, name: "r18-group")
      let picked = (0..<6).map { _ in ObjectIdentifier(group.next()) }
      let expected = (group.loops + group.loops).map { ObjectIdentifier($0) }
      let actors = group.loops.map { R18Logger(loop: $0) }
      await execOnNewThread { group.shutdownAndWait() }
      for actor in actors { _ = await actor.append(1) }
      var total = 0
      for actor in actors { total += await actor.entries.count }
      return (picked == expected, total)
    }
    #expect(outcome?.0 == true)
    #expect(outcome?.1 == 3)
  }
}

/// An actor whose method runs its loop nested in a custom mode while a job for itself is queued.
private actor R18Nester: LoopActor {
  nonisolated let loop: RunLoopThread
  let log: EventLog
  init(loop: RunLoopThread, log: EventLog) {
    self.loop = loop
    self.log = log
  }

  func inner() { log.add("inner") }

  func nest() async {
    log.add("outer-start")
    let task = Task { self.inner() }  // its first job queues on this loop now
    let hold = LoopTimer(after: .seconds(3600)) { _ in }
    loop.add(hold, to: r18ModeA)
    _ = loop.run(mode: r18ModeA, for: .milliseconds(50))
    hold.invalidate()
    log.add("outer-end")
    await task.value
  }
}

// MARK: - Lost wake-ups, buffering, creation racing shutdown

@Suite("ReviewRound18: wake-ups, buffering and creation racing shutdown", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound18WakeTests {
  /// Promised: one post from a plain thread always reaches a waiting consumer (no lost wake-up),
  /// whether the consumer runs on the global pool or prefers the loop. Ping-pong, one element at
  /// a time.
  @Test(arguments: [false, true])
  func singlePostsAlwaysWakeTheConsumer(preferLoop: Bool) async throws {
    let rounds = 300
    let outcome = try await withWatchdog(timeout: .seconds(20), "ping-pong") { () async throws -> [Int] in
      let loop = try RunLoopThread(name: "r18-pingpong")
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
      let loop = try RunLoopThread(name: "r18-sigpong")
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
      let loop = try RunLoopThread(name: "r18-buffering")
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
        let loop = try RunLoopThread(name: "r18-make-race")
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
      let loop = try RunLoopThread(name: "r18-ticks")
      let timer = loop.timer(every: .milliseconds(1))
      #expect(await r18Poll { timer.lock.withLock { timer.machine.hasElements } })
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
      let loop = try RunLoopThread(name: "r18-act-end")
      let hold = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(hold, to: r18ModeA)
      let activities = loop.activities([.entry, .exit], modes: [r18ModeA])
      for _ in 0..<3 {
        _ = try loop.performAndWait { loop.run(mode: r18ModeA, for: .milliseconds(1)) }
      }
      await execShutdown(loop)
      var seen: [LoopActivity] = []
      for await event in activities { seen.append(event.activity) }
      return seen
    }
    #expect(outcome == [.entry, .exit, .entry, .exit, .entry, .exit])
  }
}

// MARK: - Nested runs and the executor

@Suite("ReviewRound18: nested runs and the executor", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound18NestedTests {
  /// SPEC §10: a run nested in a performed block does run jobs: an actor call and a `Task.sleep`
  /// under the loop's preference both complete while the block's nested run is in progress.
  @Test func aRunNestedInABlockRunsJobsAndSleeps() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "jobs in a block's nested run") {
      () async throws -> (RunLoopRunResult?, Bool, Bool) in
      let loop = try RunLoopThread(name: "r18-block-nest")
      let hold = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(hold, to: r18ModeA)
      let inNested = AtomicCounter()
      let observer = LoopObserver(activities: [.entry], repeats: true) { _, _ in inNested.increment() }
      loop.add(observer, to: r18ModeA)
      let result = Guarded<RunLoopRunResult?>(nil)
      let nestedDone = AtomicCounter()
      loop.perform {
        let ending = loop.run(mode: r18ModeA, for: .seconds(3600))
        result.withLock { $0 = ending }
        nestedDone.increment()
      }
      #expect(await r18Poll { inNested.current == 1 })
      let actor = R18Logger(loop: loop)
      let answered = await actor.append(1)
      let slept = await Task(executorPreference: loop) { () -> Bool in
        (try? await Task.sleep(for: .milliseconds(2))) != nil
      }.value
      let stillNested = nestedDone.current == 0
      loop.stop()
      #expect(await r18Poll { nestedDone.current == 1 })
      await execShutdown(loop)
      return (result.snapshot, answered && stillNested, slept)
    }
    #expect(outcome?.0 == .stopped)
    #expect(outcome?.1 == true)
    #expect(outcome?.2 == true)
  }

  /// SPEC §10: a `Task.sleep` of an actor on the loop that comes due while another of the actor's
  /// jobs runs the loop nested does not run inside it; it resumes after that job returns.
  @Test func aSleepThatComesDueDuringAJobsNestedRunResumesAfterTheJob() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "sleep during a job's nested run") {
      () async throws -> [String] in
      let loop = try RunLoopThread(name: "r18-sleep-nest")
      let log = EventLog()
      let actor = R18Nester(loop: loop, log: log)
      let sleeper = Task { await actor.sleepThenLog() }
      #expect(await r18Poll { log.count("sleeping") == 1 })
      await actor.nestLong()
      await sleeper.value
      await execShutdown(loop)
      return log.snapshot
    }
    // "woke" may come before the nested run if the sleep ended first; never inside it.
    #expect(
      outcome == ["sleeping", "outer-start", "outer-end", "woke"]
        || outcome == ["sleeping", "woke", "outer-start", "outer-end"])
  }

  /// `runModal` racing the loop's shutdown: the await completes (a result or a documented error),
  /// never hangs.
  @Test func runModalRacingShutdownCompletes() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "runModal at shutdown") { () async throws -> Int in
      var completed = 0
      for _ in 0..<20 {
        let loop = try RunLoopThread(name: "r18-modal-end")
        let hold = LoopTimer(after: .seconds(3600)) { _ in }
        loop.add(hold, to: r18ModeA)
        let modal = Task { () -> Bool in
          do {
            _ = try await loop.runModal(mode: r18ModeA)
            return true
          } catch {
            return true
          }
        }
        await execShutdown(loop)
        if await modal.value { completed += 1 }
      }
      return completed
    }
    #expect(outcome == 20)
  }

  /// After the loop terminated, a task preferring it and a `Task.sleep` under its preference still
  /// run (on the fallback), and `withTaskExecutorPreference` returns.
  @Test func preferenceForATerminatedLoopStillRuns() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "preference after shutdown") {
      () async throws -> (Int, Bool) in
      let loop = try RunLoopThread(name: "r18-dead-pref")
      await execShutdown(loop)
      let value = await Task(executorPreference: loop) { 42 }.value
      let slept = await withTaskExecutorPreference(loop) { () async -> Bool in
        (try? await Task.sleep(for: .milliseconds(2))) != nil
      }
      return (value, slept)
    }
    #expect(outcome?.0 == 42)
    #expect(outcome?.1 == true)
  }
}

extension R18Nester {
  func sleepThenLog() async {
    log.add("sleeping")
    try? await Task.sleep(for: .milliseconds(20))
    log.add("woke")
  }

  func nestLong() {
    log.add("outer-start")
    let hold = LoopTimer(after: .seconds(3600)) { _ in }
    loop.add(hold, to: r18ModeA)
    _ = loop.run(mode: r18ModeA, for: .milliseconds(150))
    hold.invalidate()
    log.add("outer-end")
  }
}

private let r18ModeB: RunLoopMode = "r18-b"

/// Where a run nested inside a job's nested run is started from.
enum R18Callout: Sendable, CustomStringConvertible {
  case source
  case block
  case timer
  case observer

  var description: String {
    switch self {
    case .source: return "source"
    case .block: return "block"
    case .timer: return "timer"
    case .observer: return "observer"
    }
  }
}

extension R18Nester {
  /// Runs the loop nested in mode A; a callout of `kind` there runs it nested again in mode B.
  /// A job for this actor is queued before; it must not run before this method returns.
  func deepNest(_ kind: R18Callout) {
    log.add("outer-start")
    Task { self.inner() }  // its first job queues on this loop now
    let holdB = LoopTimer(after: .seconds(3600)) { _ in }
    loop.add(holdB, to: r18ModeB)
    let loop = loop
    let log = log
    let callout: @Sendable () -> Void = {
      log.add("callout-start")
      _ = loop.run(mode: r18ModeB, for: .milliseconds(60))
      log.add("callout-end")
    }
    var members: [() -> Void] = []
    switch kind {
    case .source:
      let commands = CommandSource<Int> { _ in callout() }
      loop.add(commands.source, to: r18ModeA)
      commands.post(1)
      members.append { commands.source.invalidate() }
    case .block:
      let hold = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(hold, to: r18ModeA)
      loop.perform(inModes: [r18ModeA], callout)
      members.append { hold.invalidate() }
    case .timer:
      let timer = LoopTimer(after: .zero) { _ in callout() }
      loop.add(timer, to: r18ModeA)
      members.append { timer.invalidate() }
    case .observer:
      let hold = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(hold, to: r18ModeA)
      let observer = LoopObserver(activities: [.beforeWaiting], repeats: false) { _, _ in callout() }
      loop.add(observer, to: r18ModeA)
      members.append { hold.invalidate() }
      members.append { observer.invalidate() }
    }
    _ = loop.run(mode: r18ModeA, for: .milliseconds(150))
    members.forEach { $0() }
    holdB.invalidate()
    log.add("outer-end")
  }
}

@Suite("ReviewRound18: deep nesting and current loops", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound18DeepTests {
  /// SPEC §10: inside one of the loop's jobs no other job starts, also in a run nested in a
  /// source handler, block, timer or observer of the job's own nested run.
  @Test(arguments: [R18Callout.source, .block, .timer, .observer])
  func noJobRunsInARunNestedInACalloutOfAJobsNestedRun(kind: R18Callout) async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "deep nest \(kind)") { () async throws -> [String] in
      let loop = try RunLoopThread(name: "r18-deep")
      let log = EventLog()
      let actor = R18Nester(loop: loop, log: log)
      await actor.deepNest(kind)
      #expect(await r18Poll { log.count("inner") == 1 })
      await execShutdown(loop)
      return log.snapshot
    }
    #expect(outcome == ["outer-start", "callout-start", "callout-end", "outer-end", "inner"])
  }

  /// A `RunLoopThread.current` loop of a plain thread serves an actor while the thread runs it;
  /// the thread then stops running it and exits (no `shutdown()`): every call completes once, in
  /// order, on the loop thread or (after the exit) on the fallback.
  @Test func actorOnACurrentLoopSurvivesItsThreadExiting() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "current loop thread exit") {
      () async throws -> (entries: [Int], offLoop: Int, shutDown: Bool) in
      let published = Guarded<RunLoopThread?>(nil)
      let stop = AtomicCounter()
      let thread = startThread {
        let loop = RunLoopThread.current
        published.withLock { $0 = loop }
        while stop.current == 0 { _ = loop.run(mode: .default, for: .milliseconds(2)) }
      }
      #expect(await r18Poll { published.snapshot != nil })
      guard let loop = published.snapshot else { return ([], 0, false) }
      let actor = R18Logger(loop: loop)
      let offLoop = AtomicCounter()
      let caller = Task {
        for value in 0..<2000 {
          if value == 500 { stop.increment() }
          if await !actor.append(value) { offLoop.increment() }
        }
      }
      await execOnNewThread { joinThread(thread) }
      await caller.value
      return (await actor.entries, offLoop.current, loop.isShutDown)
    }
    guard let outcome else { return }
    #expect(outcome.entries == Array(0..<2000))
    #expect(outcome.offLoop == 0)
    #expect(outcome.shutDown)
  }

  /// `LoopClock()` used by a task on a loop that shuts down under the sleep: the sleep goes on
  /// elsewhere and ends without an error (documented).
  @Test func defaultClockSleepOnALoopThatShutsDownCompletes() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "LoopClock() across shutdown") {
      () async throws -> Bool in
      let loop = try RunLoopThread(name: "r18-default-clock")
      let started = AtomicCounter()
      let sleeper = Task(executorPreference: loop) { () -> Bool in
        started.increment()
        do {
          try await LoopClock().sleep(for: .milliseconds(40))
          return true
        } catch { return false }
      }
      #expect(await r18Poll { started.current == 1 })
      await execShutdown(loop)
      return await sleeper.value
    }
    #expect(outcome == true)
  }

  /// `runOnMainAndWait` from a plain thread while the main loop is not running throws
  /// `wouldDeadlock` instead of hanging.
  @Test func runOnMainAndWaitOffMainThrowsWhenTheMainLoopIsNotRunning() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(10), "runOnMainAndWait") { () -> Bool in
      guard !RunLoopThread.isMainLoopRunning else { return true }
      do {
        _ = try runOnMainAndWait { 1 }
        return false
      } catch let error as RunLoopError {
        if case .wouldDeadlock = error { return true }
        return false
      } catch { return false }
    }
    #expect(outcome == true)
  }
}

@Suite("ReviewRound18: ticks, activity drops, cancelled sleeps", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound18TickTests {
  /// Promised (`MissedTickPolicy`): ticks stay on the timer's grid; `.burst` hands out every grid
  /// point in turn (`skipped` 0), `.skip` folds missed ones into `skipped` (the next tick is the
  /// grid point after them), `.delay` restarts the period from a late fire. No tick reaches the
  /// consumer before its instant. The consumer stalls now and then.
  @Test(arguments: [MissedTickPolicy.skip, .burst, .delay])
  func ticksStayOnTheGridAndNeverArriveEarly(policy: MissedTickPolicy) async throws {
    let interval: Int64 = 2_000_000
    let outcome = try await withWatchdog(timeout: .seconds(30), "ticks \(policy)") {
      () async throws -> (ticks: [LoopTick], early: Int, first: Int64) in
      let loop = try RunLoopThread(name: "r18-grid")
      let before = LoopClock.Instant.now.nanoseconds
      let timer = loop.timer(every: .nanoseconds(interval), missedTicks: policy)
      var ticks: [LoopTick] = []
      var early = 0
      for await tick in timer {
        if LoopClock.Instant.now < tick.scheduled { early += 1 }
        ticks.append(tick)
        if ticks.count % 3 == 0 { try await Task.sleep(for: .milliseconds(7)) }
        if ticks.count == 12 { break }
      }
      await execShutdown(loop)
      return (ticks, early, before)
    }
    guard let outcome else { return }
    #expect(outcome.early == 0)
    let ticks = outcome.ticks
    #expect(ticks.count == 12)
    guard let first = ticks.first else { return }
    #expect(first.scheduled.nanoseconds >= outcome.first + interval)
    for (previous, next) in zip(ticks, ticks.dropFirst()) {
      let step = next.scheduled.nanoseconds - previous.scheduled.nanoseconds
      switch policy {
      case .burst:
        #expect(step == interval, "burst step \(step)")
        #expect(previous.skipped == 0)
      case .skip:
        #expect(step == interval * Int64(1 + previous.skipped), "skip step \(step), skipped \(previous.skipped)")
      case .delay:
        #expect(step >= interval, "delay step \(step)")
      }
    }
  }

  /// Promised (`ActivitySequence`): a consumer that falls behind by more than `bufferLimit`
  /// events gets the newest ones; the rest are counted in `droppedCount`.
  @Test func activityBufferKeepsTheNewestAndCountsTheDropped() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "activity drops") {
      () async throws -> ([LoopActivity], Int) in
      let loop = try RunLoopThread(name: "r18-act-drop")
      let hold = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(hold, to: r18ModeA)
      let activities = loop.activities([.entry, .exit], modes: [r18ModeA], bufferLimit: 3)
      for _ in 0..<5 {
        _ = try loop.performAndWait { loop.run(mode: r18ModeA, for: .milliseconds(1)) }
      }
      activities.invalidate()
      var seen: [LoopActivity] = []
      for await event in activities { seen.append(event.activity) }
      let dropped = activities.droppedCount
      await execShutdown(loop)
      return (seen, dropped)
    }
    #expect(outcome?.0 == [.exit, .entry, .exit])
    #expect(outcome?.1 == 7)
  }

  /// A long `Task.sleep` under the loop's preference, or in an actor on the loop, ends with
  /// `CancellationError` when its task is cancelled: no hung await.
  @Test func cancelledLongSleepsOnTheLoopEndPromptly() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "cancelled sleeps") { () async throws -> [Bool] in
      let loop = try RunLoopThread(name: "r18-sleep-cancel")
      let actor = R18Sleeper(loop: loop)
      let preferred = Task(executorPreference: loop) { () -> Bool in
        do {
          try await Task.sleep(for: .seconds(3600))
          return false
        } catch { return error is CancellationError }
      }
      let isolated = Task { await actor.sleepLong() }
      let clock = Task { () -> Bool in
        do {
          try await loop.clock.sleep(for: .seconds(3600))
          return false
        } catch { return error is CancellationError }
      }
      try await Task.sleep(for: .milliseconds(10))
      preferred.cancel()
      isolated.cancel()
      clock.cancel()
      let results = [await preferred.value, await isolated.value, await clock.value]
      await execShutdown(loop)
      return results
    }
    #expect(outcome == [true, true, true])
  }

  /// `LoopGroup` with pinning on a machine with fewer CPUs than loops wraps around the allowed
  /// CPUs and works.
  @Test func pinnedLoopGroupWithMoreLoopsThanCPUsWorks() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "pinned group") { () async throws -> Int in
      let group = try LoopGroup(count: 5, name: "r18-pin", pinToCPUs: true)
      var answered = 0
      for loop in group.loops where (try? loop.performAndWait { loop.isOnLoopThread }) == true {
        answered += 1
      }
      await execOnNewThread { group.shutdownAndWait() }
      return answered
    }
    #expect(outcome == 5)
  }
}

/// An actor on a loop that sleeps for an hour.
private actor R18Sleeper: LoopActor {
  nonisolated let loop: RunLoopThread
  init(loop: RunLoopThread) { self.loop = loop }

}

extension R18Sleeper {
  func sleepLong() async -> Bool {
    do {
      try await Task.sleep(for: .seconds(3600))
      return false
    } catch { return error is CancellationError }
  }
}

@Suite("ReviewRound18: no lost wake-ups without a flush", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound18NoFlushTests {
  /// Promised: everything posted is released without anything else waking the loop (no
  /// `invalidate()` to flush it): many threads post to a source sequence, a command source and a
  /// signal sequence at once; each consumer eventually sees every accepted element.
  @Test func concurrentProducersAreAllDeliveredWithoutAFlush() async throws {
    let producers = 4
    let perProducer = 2000
    let outcome = try await withWatchdog(timeout: .seconds(20), "no flush") { () async throws -> [String] in
      var problems: [String] = []
      for round in 0..<5 {
        let loop = try RunLoopThread(name: "r18-noflush")
        let sequence = loop.sourceSequence(of: Int.self)
        let signals = loop.signalSequence()
        let handled = AtomicCounter()
        let commands = CommandSource<Int> { _ in handled.increment() }
        loop.add(commands.source, to: .common)
        let received = AtomicCounter()
        let signalled = AtomicCounter()
        let consumer = Task {
          for await _ in sequence { received.increment() }
        }
        let signalConsumer = Task(executorPreference: loop) {
          for await count in signals { signalled.value.add(count, ordering: .sequentiallyConsistent) }
        }
        await execOnNewThread {
          race(
            (0..<producers).map { _ in
              {
                for index in 0..<perProducer {
                  _ = sequence.post(index)
                  commands.post(index)
                  signals.signal()
                  if index % 97 == 0 { sched_yield() }
                }
              }
            })
        }
        let total = producers * perProducer
        let all = await r18Poll(timeout: .seconds(5)) {
          received.current == total && handled.current == total && signalled.current == total
        }
        if !all {
          problems.append(
            "round \(round): source \(received.current), command \(handled.current), signal \(signalled.current) of \(total)"
          )
        }
        consumer.cancel()
        signalConsumer.cancel()
        await consumer.value
        await signalConsumer.value
        await execShutdown(loop)
      }
      return problems
    }
    #expect(outcome == [])
  }

  /// One source per descriptor and loop: a second readiness sequence on a descriptor that the loop
  /// already watches (its registration paused by a slow consumer) is refused visibly — a thrown
  /// error, or an `.error` element and the end — and the first keeps working.
  @Test func aSecondReadinessSequenceOnAWatchedDescriptorIsRefusedVisibly() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "second readiness") {
      () async throws -> (refused: Bool, firstStillWorks: Bool) in
      let loop = try RunLoopThread(name: "r18-ready2")
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let first = try loop.readiness(of: pipe.read)
      writeByte(pipe.write)
      // Let the loop see the unread byte a few times: the first one's registration pauses.
      #expect(await r18Poll { first.lock.withLock { first.machine.paused } })
      var refused = false
      do {
        let second = try loop.readiness(of: pipe.read)
        var events: [DescriptorEvents] = []
        for await element in second { events.append(element) }
        refused = events.allSatisfy { $0.contains(.error) } && !events.isEmpty
      } catch {
        refused = true
      }
      var iterator = first.makeAsyncIterator()
      let firstElement = await iterator.next()
      drainDescriptor(pipe.read)
      writeByte(pipe.write)
      let secondElement = await iterator.next()
      first.invalidate()
      await execShutdown(loop)
      return (refused, firstElement?.contains(.readable) == true && secondElement?.contains(.readable) == true)
    }
    #expect(outcome?.refused == true)
    #expect(outcome?.firstStillWorks == true)
  }

  /// `onSchedule` runs once however many modes the source sequence is in, also when a mode joins
  /// the common set later; `onCancel` once at the end.
  @Test func onScheduleRunsOncePerLoopNotPerMode() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "onSchedule once") {
      () async throws -> (Int, Int) in
      let loop = try RunLoopThread(name: "r18-sched")
      let schedules = AtomicCounter()
      let cancels = AtomicCounter()
      let sequence = loop.sourceSequence(
        of: Int.self, modes: [.common, r18ModeA, r18ModeB], onSchedule: { _, _ in schedules.increment() },
        onCancel: { _ in cancels.increment() })
      loop.addModeToCommonModes("r18-c")
      _ = try loop.performAndWait { 0 }
      sequence.invalidate()
      for await _ in sequence {}
      await execShutdown(loop)
      return (schedules.current, cancels.current)
    }
    #expect(outcome?.0 == 1)
    #expect(outcome?.1 == 1)
  }
}

/// Consumes `sequence` on the loop and invalidates it from inside the loop after `after` elements.
private actor R18SelfEnder: LoopActor {
  nonisolated let loop: RunLoopThread
  init(loop: RunLoopThread) { self.loop = loop }

  func consume(
    _ sequence: SourceSequence<Int>, invalidatingAfter after: Int
  ) async -> (seen: [Int], late: SourcePostResult?) {
    var seen: [Int] = []
    var late: SourcePostResult?
    for await value in sequence {
      seen.append(value)
      if seen.count == after {
        sequence.invalidate()
        late = sequence.post(-1)
      }
    }
    return (seen, late)
  }
}

@Suite("ReviewRound18: ending from inside the loop, moving sources", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound18InsideTests {
  /// Promised: `invalidate()` delivers what was accepted, also when the consumer itself calls it
  /// on the loop thread mid-stream; a post after it answers `.terminated`.
  @Test func consumerOnTheLoopInvalidatingMidStreamStillGetsEverything() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "self-invalidate") {
      () async throws -> (seen: [Int], late: SourcePostResult?) in
      let loop = try RunLoopThread(name: "r18-self-end")
      let sequence = loop.sourceSequence(of: Int.self)
      let release = blockLoop(loop)
      for value in 0..<50 { _ = sequence.post(value) }
      release.open()
      let result = await R18SelfEnder(loop: loop).consume(sequence, invalidatingAfter: 10)
      await execShutdown(loop)
      return result
    }
    #expect(outcome?.seen == Array(0..<50))
    #expect(outcome?.late == .terminated)
  }

  /// Promised (`CommandSource`): a handler that invalidates its own source mid-batch: every
  /// command accepted before is still handled, once, in order; posts after it return false.
  @Test func commandHandlerInvalidatingItsSourceMidBatchLosesNothing() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "handler invalidates") {
      () async throws -> (seen: [Int], latePosts: [Bool], cancels: Int) in
      let loop = try RunLoopThread(name: "r18-cmd-self")
      let seen = Guarded<[Int]>([])
      let late = Guarded<[Bool]>([])
      let cancels = AtomicCounter()
      let box = Guarded<CommandSource<Int>?>(nil)
      let commands = CommandSource<Int>(cancel: { _, _ in cancels.increment() }) { value in
        seen.withLock { $0.append(value) }
        if value == 10, let me = box.snapshot {
          me.source.invalidate()
          let accepted = me.post(-1)
          late.withLock { $0.append(accepted) }
        }
      }
      box.withLock { $0 = commands }
      let release = blockLoop(loop)
      loop.add(commands.source, to: .common)
      for value in 0..<50 { commands.post(value) }
      release.open()
      #expect(await r18Poll { cancels.current == 1 })
      await execShutdown(loop)
      box.withLock { $0 = nil }
      return (seen.snapshot, late.snapshot, cancels.current)
    }
    #expect(outcome?.seen == Array(0..<50))
    #expect(outcome?.latePosts == [false])
    #expect(outcome?.cancels == 1)
  }

  /// `onSchedule` may post to its own sequence (on the loop thread, while the loop adds it): the
  /// element is delivered.
  @Test func onSchedulePostingToItsOwnSequenceIsDelivered() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "post from onSchedule") { () async throws -> [Int] in
      let loop = try RunLoopThread(name: "r18-sched-post")
      let box = Guarded<SourceSequence<Int>?>(nil)
      let release = blockLoop(loop)
      let sequence = loop.sourceSequence(of: Int.self, onSchedule: { _, _ in _ = box.snapshot?.post(1) })
      box.withLock { $0 = sequence }
      release.open()
      var iterator = sequence.makeAsyncIterator()
      let first = await iterator.next()
      box.withLock { $0 = nil }
      sequence.invalidate()
      var rest: [Int] = []
      while let value = await iterator.next() { rest.append(value) }
      await execShutdown(loop)
      return [first ?? -1] + rest
    }
    #expect(outcome == [1])
  }

  /// Promised (`CommandSource`): a source moved between loops (removed from its last mode on one,
  /// added to another, from another thread) while threads post keeps every accepted command:
  /// each is handled once, in posting order per thread, on the loop the source was on.
  @Test func commandSourceMovedBetweenLoopsWhilePostingLosesNothing() async throws {
    let producers = 3
    let perProducer = 1500
    let outcome = try await withWatchdog(timeout: .seconds(20), "moving command source") {
      () async throws -> (seen: [Int: [Int]], accepted: [Int: [Int]], offLoop: Int) in
      let loops = [try RunLoopThread(name: "r18-move-a"), try RunLoopThread(name: "r18-move-b")]
      let seen = Guarded<[Int: [Int]]>([:])
      let offLoop = AtomicCounter()
      let commands = CommandSource<R18Item> { item in
        if !loops.contains(where: { $0.isOnLoopThread }) { offLoop.increment() }
        seen.withLock { $0[item.producer, default: []].append(item.index) }
      }
      loops[0].add(commands.source, to: .common)
      let done = AtomicCounter()
      let accepted = Guarded<[Int: [Int]]>([:])
      await execOnNewThread {
        var bodies: [@Sendable () -> Void] = (0..<producers).map { producer in
          {
            var mine: [Int] = []
            for index in 0..<perProducer where commands.post(R18Item(producer: producer, index: index)) {
              mine.append(index)
            }
            accepted.withLock { $0[producer] = mine }
            done.increment()
          }
        }
        bodies.append {
          var on = 0
          while done.current < producers {
            loops[on].remove(commands.source, from: .common)
            on = 1 - on
            loops[on].add(commands.source, to: .common)
            sched_yield()
          }
        }
        race(bodies)
      }
      commands.source.invalidate()
      for loop in loops { await execShutdown(loop) }
      return (seen.snapshot, accepted.snapshot, offLoop.current)
    }
    guard let outcome else { return }
    for producer in 0..<producers {
      #expect((outcome.seen[producer] ?? []) == (outcome.accepted[producer] ?? []), "producer \(producer)")
    }
    #expect(outcome.offLoop == 0)
  }
}

/// A weak reference readable from any thread.
private final class R18Weak: @unchecked Sendable {  // Safety: only a weak reference, set in init
  weak var value: AnyObject?
  init(_ value: AnyObject) { self.value = value }
  var isGone: Bool { value == nil }
}

@Suite("ReviewRound18: dropping policies under load, leaks, busy timers", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound18LoadTests {
  /// Promised: with `.dropOldest` / `.dropNewest` and many producers against a slow consumer,
  /// what is delivered keeps each producer's order, and delivered + `droppedCount` equals the
  /// posts that were answered `.enqueued`, `.enqueuedDroppingOldest` or `.dropped`.
  @Test(arguments: [SourceBuffering.dropOldest(4), .dropNewest(4)])
  func droppingPoliciesAccountForEveryPost(buffering: SourceBuffering) async throws {
    let producers = 4
    let perProducer = 2000
    let outcome = try await withWatchdog(timeout: .seconds(20), "dropping \(buffering)") {
      () async throws -> (seen: [Int: [Int]], dropped: Int, results: [SourcePostResult: Int]) in
      let loop = try RunLoopThread(name: "r18-drop-load")
      let sequence = loop.sourceSequence(of: R18Item.self, buffering: buffering)
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
                let result = sequence.post(R18Item(producer: producer, index: index))
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
      let loop = try RunLoopThread(name: "r18-leak")
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      var weaks: [(String, R18Weak)] = []
      do {
        let source = loop.sourceSequence(of: Int.self)
        let signals = loop.signalSequence()
        let timer = loop.timer(every: .seconds(3600))
        let readiness = try loop.readiness(of: pipe.read)
        let activities = loop.activities([.entry])
        weaks = [
          ("source", R18Weak(source)), ("signal", R18Weak(signals)), ("timer", R18Weak(timer)),
          ("readiness", R18Weak(readiness)), ("activity", R18Weak(activities)),
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
      let allGone = await r18Poll(timeout: .seconds(5)) { watched.allSatisfy { $0.1.isGone } }
      return allGone ? [] : watched.filter { !$0.1.isGone }.map(\.0)
    }
    #expect(outcome == [])
  }

  /// A timer sequence with a tiny interval keeps its loop busy but responsive: blocks and jobs
  /// still run, a consumer on the loop takes its ticks, and the loop shuts down.
  @Test func aTinyIntervalTimerDoesNotStarveTheLoop() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "tiny interval") { () async throws -> (Int, Int) in
      let loop = try RunLoopThread(name: "r18-tiny")
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
      let loop = try RunLoopThread(name: "r18-trap-loop")
      let actor = R18Logger(loop: loop)
      r18AssumeIsolated(actor)
    }
    expectStandardError(of: result, mentions: "r18-trap-loop")
  }
}

/// `assumeIsolated` from synchronous code.
private func r18AssumeIsolated(_ actor: R18Logger) {
  actor.assumeIsolated { _ in }
}

/// An actor on a loop that asks its own loop for a modal run.
private actor R18Modal: LoopActor {
  nonisolated let loop: RunLoopThread
  private(set) var pokes = 0
  init(loop: RunLoopThread) { self.loop = loop }

  func modal(returnAfterSourceHandled: Bool = false) async -> RunLoopRunResult? {
    try? await loop.runModal(mode: r18ModeA, returnAfterSourceHandled: returnAfterSourceHandled)
  }

  func poke(stopping: Bool) {
    pokes += 1
    if stopping { loop.stop() }
  }
}

@Suite("ReviewRound18: modal runs asked for by actors on the loop", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound18ModalTests {
  /// Promised (`runModal`): an actor on the loop asking its own loop for a modal run is not
  /// blocked: its other calls run during the run, and one of them can stop it.
  @Test func anActorsOwnModalRunLetsItsOtherCallsRun() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "actor's own modal run") {
      () async throws -> (RunLoopRunResult?, Int, Int) in
      let loop = try RunLoopThread(name: "r18-own-modal")
      let hold = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(hold, to: r18ModeA)
      let entries = AtomicCounter()
      let observer = LoopObserver(activities: [.entry], repeats: true) { _, _ in entries.increment() }
      loop.add(observer, to: r18ModeA)
      let actor = R18Modal(loop: loop)
      let modal = Task { await actor.modal() }
      #expect(await r18Poll { entries.current == 1 })
      for _ in 0..<10 { await actor.poke(stopping: false) }
      await actor.poke(stopping: true)
      let result = await modal.value
      let pokes = await actor.pokes
      await execShutdown(loop)
      return (result, pokes, entries.current)
    }
    #expect(outcome?.0 == .stopped)
    #expect(outcome?.1 == 11)
    #expect(outcome?.2 == 1)
  }

  /// SPEC §6: a modal run asked to return after one source returns `.handledSource` when a
  /// source sequence in its mode releases a post; a timer firing in it does not end it.
  @Test func modalRunReturnsAfterASourceSequenceFiresButNotAfterATimer() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "modal handled source") {
      () async throws -> (RunLoopRunResult?, Int, [Int]) in
      let loop = try RunLoopThread(name: "r18-modal-src")
      let fired = AtomicCounter()
      let timer = LoopTimer(after: .milliseconds(1), repeatingEvery: .milliseconds(1)) { _ in fired.increment() }
      loop.add(timer, to: r18ModeA)
      let sequence = loop.sourceSequence(of: Int.self, modes: [r18ModeA])
      let actor = R18Modal(loop: loop)
      let modal = Task { await actor.modal(returnAfterSourceHandled: true) }
      #expect(await r18Poll { fired.current >= 3 })
      _ = sequence.post(5)
      let result = await modal.value
      timer.invalidate()
      sequence.invalidate()
      var seen: [Int] = []
      for await value in sequence { seen.append(value) }
      await execShutdown(loop)
      return (result, fired.current, seen)
    }
    #expect(outcome?.0 == .handledSource)
    #expect(outcome?.2 == [5])
  }

  /// Order of one thread's `runOnMain` calls relative to its `DispatchQueue.main.async` blocks,
  /// and an `await runOnMain` after them sees all of them (the main queue drains in the test
  /// process).
  @Test func runOnMainKeepsOneThreadsOrderWithMainQueueBlocks() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "runOnMain order") { () async throws -> [Int] in
      let log = Guarded<[Int]>([])
      await execOnNewThread {
        for value in 0..<200 {
          if value % 2 == 0 {
            runOnMain { log.withLock { $0.append(value) } }
          } else {
            DispatchQueue.main.async { log.withLock { $0.append(value) } }
          }
        }
      }
      let seen = await runOnMain { log.snapshot }
      return seen
    }
    #expect(outcome == Array(0..<200))
  }
}

@Suite("ReviewRound18: extreme deadlines", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound18DeadlineTests {
  /// Deadlines in the past fire at once; deadlines at the end of time never fire and end on
  /// cancellation or invalidation; the loop keeps working meanwhile.
  @Test func pastAndEndOfTimeDeadlinesBehave() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "extreme deadlines") { () async throws -> [String] in
      let loop = try RunLoopThread(name: "r18-extreme")
      var problems: [String] = []
      // Past: one tick at once.
      var pastTicks = 0
      for await _ in loop.timer(after: .seconds(-10)) { pastTicks += 1 }
      if pastTicks != 1 { problems.append("past timer ticks \(pastTicks)") }
      var minTicks = 0
      for await _ in loop.timer(at: LoopClock.Instant(nanoseconds: Int64.min)) { minTicks += 1 }
      if minTicks != 1 { problems.append("Int64.min timer ticks \(minTicks)") }
      let pastSleep = await Task(executorPreference: loop) { () -> Bool in
        (try? await Task.sleep(for: .seconds(-1))) != nil
      }.value
      if !pastSleep { problems.append("negative Task.sleep threw") }
      let pastClock = await Task { () -> Bool in
        (try? await loop.clock.sleep(until: LoopClock.Instant(nanoseconds: Int64.min))) != nil
      }.value
      if !pastClock { problems.append("past clock sleep threw") }
      // End of time: never fires; cancellation ends it.
      let forever = Task(executorPreference: loop) { () -> Bool in
        do {
          try await Task.sleep(for: .seconds(Int64.max))
          return false
        } catch { return error is CancellationError }
      }
      let foreverClock = Task { () -> Bool in
        do {
          try await loop.clock.sleep(until: .distantFuture)
          return false
        } catch { return error is CancellationError }
      }
      let farTimer = loop.timer(at: .distantFuture)
      let farConsumer = Task { () -> Int in
        var n = 0
        for await _ in farTimer { n += 1 }
        return n
      }
      let hugeInterval = loop.timer(every: .seconds(Int64.max))
      let hugeConsumer = Task { () -> Int in
        var n = 0
        for await _ in hugeInterval { n += 1 }
        return n
      }
      try await Task.sleep(for: .milliseconds(10))
      if (try? loop.performAndWait { 7 }) != 7 { problems.append("loop unresponsive") }
      forever.cancel()
      foreverClock.cancel()
      farTimer.invalidate()
      hugeInterval.invalidate()
      if !(await forever.value) { problems.append("forever sleep") }
      if !(await foreverClock.value) { problems.append("forever clock sleep") }
      if await farConsumer.value != 0 { problems.append("far timer ticked") }
      if await hugeConsumer.value != 0 { problems.append("huge interval ticked") }
      await execShutdown(loop)
      return problems
    }
    #expect(outcome == [])
  }
}

@Suite("ReviewRound18: sleeps moved off a shut-down loop", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound18MovedSleepTests {
  /// A long `Task.sleep` under the loop's preference or in an actor on the loop, moved elsewhere
  /// by the loop's shutdown, still ends with `CancellationError` when its task is cancelled.
  @Test func cancellingASleepMovedByShutdownEndsIt() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "moved sleeps cancelled") {
      () async throws -> [Bool] in
      let loop = try RunLoopThread(name: "r18-moved-sleep")
      let actor = R18Sleeper(loop: loop)
      let started = AtomicCounter()
      let preferred = Task(executorPreference: loop) { () -> Bool in
        started.increment()
        do {
          try await Task.sleep(for: .seconds(3600))
          return false
        } catch { return error is CancellationError }
      }
      #expect(await r18Poll { started.current == 1 && loop.scheduledJobCount >= 1 })
      let isolated = Task { await actor.sleepLong() }
      try await Task.sleep(for: .milliseconds(10))
      await execShutdown(loop)
      preferred.cancel()
      isolated.cancel()
      return [await preferred.value, await isolated.value]
    }
    #expect(outcome == [true, true])
  }

  /// Child tasks of a group under the loop's preference all run on the loop thread.
  @Test func taskGroupChildrenUnderPreferenceRunOnTheLoop() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "group children") { () async throws -> Int in
      let loop = try RunLoopThread(name: "r18-group-pref")
      let onLoop = await withTaskExecutorPreference(loop) {
        await withTaskGroup(of: Bool.self) { group in
          for _ in 0..<100 { group.addTask { loop.isOnLoopThread } }
          var count = 0
          for await on in group where on { count += 1 }
          return count
        }
      }
      await execShutdown(loop)
      return onLoop
    }
    #expect(outcome == 100)
  }
}

/// An actor on a loop that sleeps briefly.
private actor R18ShortSleeper: LoopActor {
  nonisolated let loop: RunLoopThread
  init(loop: RunLoopThread) { self.loop = loop }

  func nap() async -> Bool {
    do {
      try await Task.sleep(for: .milliseconds(2))
      return loop.isOnLoopThread
    } catch { return false }
  }
}

@Suite("ReviewRound18: actor sleeps and the loop's timers", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound18ActorSleepTests {
  /// `Task.sleep` in a `LoopActor` method (documented on `LoopSerialExecutor`'s scheduling
  /// conformance): with the Swift 6.3 runtime the standard library's sleep leaves the actor before
  /// it looks for a scheduling executor, so it waits on the global executor's timers; it still
  /// ends, not early, back on the loop. (`LoopClock()` from the same method sleeps on the loop's
  /// own timers: `defaultClockInALoopActorSleepsOnItsLoop`.)
  @Test func taskSleepInALoopActorEndsOnTimeBackOnTheLoop() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "actor sleeps") { () async throws -> Int in
      let loop = try RunLoopThread(name: "r18-actor-nap")
      let actor = R18ShortSleeper(loop: loop)
      var onLoop = 0
      for _ in 0..<3 {
        let start = ContinuousClock.now
        if await actor.nap(), ContinuousClock.now - start >= .milliseconds(2) { onLoop += 1 }
      }
      await execShutdown(loop)
      return onLoop
    }
    #expect(outcome == 3)
  }
}

extension R18ShortSleeper {
  /// Sleeps on `LoopClock()` (the caller's loop while it runs, per its docs).
  func napOnDefaultClock() async -> Bool {
    (try? await LoopClock().sleep(for: .milliseconds(2))) != nil
  }
}

/// How many timer schedulings `loop` has made (read on its thread).
private func r18TimerSchedulings(_ loop: RunLoopThread) -> UInt64 {
  (try? loop.performAndWait { loop.core.timerSequence }) ?? 0
}

extension ReviewRound18ActorSleepTests {
  /// `LoopClock()` "uses the calling thread's loop if it is a loop thread created with
  /// `RunLoopThread(name:)`": under the loop's task-executor preference its sleeps are timers of
  /// that loop.
  @Test func defaultClockUnderThePreferenceSleepsOnThatLoop() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "LoopClock() under preference") {
      () async throws -> UInt64 in
      let loop = try RunLoopThread(name: "r18-default-pref")
      let before = await execOnNewThread { r18TimerSchedulings(loop) }
      await withTaskExecutorPreference(loop) {
        for _ in 0..<3 { try? await LoopClock().sleep(for: .milliseconds(2)) }
      }
      let after = await execOnNewThread { r18TimerSchedulings(loop) }
      await execShutdown(loop)
      return after - before
    }
    #expect((outcome ?? 0) >= 3)
  }

  /// The same from a `LoopActor` method, whose code runs on the loop thread: `LoopClock()`'s
  /// sleep is a nonisolated async function, so it runs on the global pool, finds no current loop
  /// and sleeps on the shared timer loop instead.
  @Test
  func defaultClockInALoopActorSleepsOnItsLoop() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "LoopClock() in an actor") {
      () async throws -> UInt64 in
      let loop = try RunLoopThread(name: "r18-default-actor")
      let actor = R18ShortSleeper(loop: loop)
      let before = await execOnNewThread { r18TimerSchedulings(loop) }
      for _ in 0..<3 { _ = await actor.napOnDefaultClock() }
      let after = await execOnNewThread { r18TimerSchedulings(loop) }
      await execShutdown(loop)
      return after - before
    }
    #expect((outcome ?? 0) >= 3)
  }
}

@Suite("ReviewRound18: waiting senders, unfired ticks", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound18SenderTests {
  /// Promised (`send`): producers that wait for room are admitted oldest first; a waiting sender
  /// whose task is cancelled answers `.full` and its element is not delivered.
  @Test func waitingSendersAreAdmittedOldestFirstAndCancelledOnesLeave() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "sender order") {
      () async throws -> (seen: [Int], cancelled: SourcePostResult?, others: [SourcePostResult]) in
      let loop = try RunLoopThread(name: "r18-senders")
      let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(1))
      _ = sequence.post(0)
      var senders: [Task<SourcePostResult, Never>] = []
      for value in 1...5 {
        senders.append(Task { await sequence.send(value) })
        #expect(await r18Poll { sequence.waitingProducerCount == value })
      }
      senders[2].cancel()  // value 3
      let cancelled = await senders[2].value
      var seen: [Int] = []
      var iterator = sequence.makeAsyncIterator()
      while seen.count < 5, let value = await iterator.next() { seen.append(value) }
      var others: [SourcePostResult] = []
      for (index, sender) in senders.enumerated() where index != 2 { others.append(await sender.value) }
      sequence.invalidate()
      while let value = await iterator.next() { seen.append(value) }
      await execShutdown(loop)
      return (seen, cancelled, others)
    }
    #expect(outcome?.seen == [0, 1, 2, 4, 5])
    #expect(outcome?.cancelled == .full)
    #expect(outcome?.others == Array(repeating: .enqueued, count: 4))
  }

  /// Promised (`TimerSequence`): a tick whose instant passed while the loop was busy, but that
  /// the loop has not fired, is not delivered after `invalidate()`.
  @Test func aTickDueWhileTheLoopIsBusyIsNotDeliveredAfterInvalidate() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "unfired tick") { () async throws -> Int in
      let loop = try RunLoopThread(name: "r18-unfired")
      let release = blockLoop(loop)
      let timer = loop.timer(after: .milliseconds(1))
      usleep(5000)  // the instant passes while the loop is busy
      timer.invalidate()
      release.open()
      var n = 0
      for await _ in timer { n += 1 }
      await execShutdown(loop)
      return n
    }
    #expect(outcome == 0)
  }
}

extension R18Logger {
  /// Shuts this actor's own loop down from inside one of its methods.
  func shutDownOwnLoop() {
    loop.shutdownAndWait()  // on its own thread: only starts the shutdown
    entries.append(-1)
  }

  /// Waits for a block on `other`, from this actor's loop thread.
  func waitFor(_ other: RunLoopThread) -> String {
    do {
      return try other.performAndWait { "ran" }
    } catch {  // a RunLoopError: the block cannot throw
      if case .shutDown = error { return "shutDown" }
      return "\(error)"
    }
  }
}

@Suite("ReviewRound18: shutdown from inside, waits across loops", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound18CrossTests {
  /// An actor that shuts down its own loop from one of its methods: the call returns, calls
  /// already queued behind it and later ones all complete, once, in order. (In the full parallel
  /// suite the 210 hops, most of them through the fallback queue and back to the starved
  /// cooperative pool, took 10–13 s: hence the watchdog.)
  @Test func anActorShuttingDownItsOwnLoopLeavesNoCallHanging() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(40), "own shutdown") { () async throws -> [Int] in
      let loop = try RunLoopThread(name: "r18-own-shutdown")
      let actor = R18Logger(loop: loop)
      let early = Task {
        for value in 0..<200 { _ = await actor.append(value) }
      }
      await actor.shutDownOwnLoop()
      await early.value
      for value in 200..<210 { _ = await actor.append(value) }
      let entries = await actor.entries
      await execShutdown(loop)
      return entries
    }
    guard let outcome else { return }
    #expect(outcome.filter { $0 >= 0 } == Array(0..<210))
    #expect(outcome.filter { $0 < 0 }.count == 1)
  }

  /// An actor on one loop waiting (`performAndWait`) for a block on another loop that shuts down
  /// meanwhile gets the result or `RunLoopError.shutDown`, never hangs.
  @Test func performAndWaitFromAnActorRacingTheOtherLoopsShutdownEnds() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "cross-loop wait at shutdown") {
      () async throws -> [String] in
      let home = try RunLoopThread(name: "r18-home")
      let actor = R18Logger(loop: home)
      var answers: [String] = []
      for _ in 0..<30 {
        let other = try RunLoopThread(name: "r18-other")
        async let answer = actor.waitFor(other)
        await execOnNewThread { other.shutdownAndWait() }
        answers.append(await answer)
      }
      await execShutdown(home)
      return answers.filter { $0 != "ran" && $0 != "shutDown" }
    }
    #expect(outcome == [])
  }

  /// README: `assumeIsolated` of an actor on the loop works in source handlers, timer and observer
  /// callouts, performed blocks and tasks that prefer the loop.
  @Test func assumeIsolatedHoldsInEveryKindOfLoopCallout() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "assumeIsolated everywhere") {
      () async throws -> Int in
      let loop = try RunLoopThread(name: "r18-iso-all")
      let actor = R18Logger(loop: loop)
      let done = AtomicCounter()
      let check: @Sendable () -> Void = {
        actor.assumeIsolated { isolated in _ = isolated.append(0) }
        done.increment()
      }
      let commands = CommandSource<Int> { _ in check() }
      loop.add(commands.source, to: .common)
      commands.post(1)
      let timer = LoopTimer(after: .zero) { _ in check() }
      loop.add(timer, to: .common)
      let observer = LoopObserver(activities: [.beforeWaiting], repeats: false) { _, _ in check() }
      loop.add(observer, to: .common)
      loop.perform(check)
      await Task(executorPreference: loop) { check() }.value
      #expect(await r18Poll { done.current == 5 })
      commands.source.invalidate()
      await execShutdown(loop)
      return await actor.entries.count
    }
    #expect(outcome == 5)
  }
}

@Suite("ReviewRound18: command sources off their loop, dropped sequences", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound18OffLoopTests {
  /// Promised (`CommandSource`): commands posted while the source is on no loop wait for its next
  /// add and come before later ones; invalidated while on no loop, the loop that lets go of it
  /// last delivers them. Each once, in order.
  @Test func commandsPostedOffLoopAreDeliveredByTheNextOrTheLastLoop() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "off-loop commands") {
      () async throws -> (seen: [Int], threads: [String]) in
      let loops = [try RunLoopThread(name: "r18-off-a"), try RunLoopThread(name: "r18-off-b")]
      let seen = Guarded<[Int]>([])
      let threads = Guarded<[String]>([])
      let commands = CommandSource<Int> { value in
        seen.withLock { $0.append(value) }
        let name = loops.first(where: { $0.isOnLoopThread })?.name ?? "elsewhere"
        threads.withLock { if $0.last != name { $0.append(name) } }
      }
      loops[0].add(commands.source, to: .common)
      for value in 0..<5 { commands.post(value) }
      loops[0].remove(commands.source, from: .common)
      for value in 5..<10 { commands.post(value) }
      loops[1].add(commands.source, to: .common)
      for value in 10..<15 { commands.post(value) }
      #expect(await r18Poll { seen.snapshot.count == 15 })
      loops[1].remove(commands.source, from: .common)
      for value in 15..<20 { commands.post(value) }
      commands.source.invalidate()
      #expect(await r18Poll { seen.snapshot.count == 20 })
      for loop in loops { await execShutdown(loop) }
      return (seen.snapshot, threads.snapshot)
    }
    #expect(outcome?.seen == Array(0..<20))
    #expect(outcome?.threads.allSatisfy { $0 != "elsewhere" } == true)
    // Which loop delivers the last five depends on timing: B, or A when A's thread applies its
    // removal after B's (seen once under CI's 3x load). Both are what `CommandSource` promises; the
    // loop that lets go last delivers (`CommandSourceTests` holds A's thread to check that case).
    #expect(outcome.map { ["r18-off-a", "r18-off-b"].contains($0.threads.last) } == true)
  }

  /// Promised: dropping a sequence (and its iterator) invalidates its source: `onCancel` runs
  /// once, for a sequence never iterated and for one whose iterator was dropped.
  @Test func droppingASequenceRunsOnCancelOnce() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "dropped sequences") { () async throws -> [Int] in
      let loop = try RunLoopThread(name: "r18-dropped")
      let cancels = [AtomicCounter(), AtomicCounter(), AtomicCounter()]
      do {
        let never = loop.sourceSequence(of: Int.self, onCancel: { _ in cancels[0].increment() })
        _ = never.post(1)
        let signals = loop.signalSequence(onCancel: { _ in cancels[1].increment() })
        signals.signal()
        let iterated = loop.sourceSequence(of: Int.self, onCancel: { _ in cancels[2].increment() })
        _ = iterated.post(1)
        _ = iterated.post(2)
        var iterator = iterated.makeAsyncIterator()
        _ = await iterator.next()
      }
      #expect(await r18Poll { cancels.allSatisfy { $0.current >= 1 } })
      _ = try? loop.performAndWait { 0 }
      await execShutdown(loop)
      return cancels.map(\.current)
    }
    #expect(outcome == [1, 1, 1])
  }
}

@Suite("ReviewRound18: where code runs after a sleep", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound18AfterSleepTests {
  /// A task that prefers the loop is back on the loop thread after each `Task.sleep`, with any
  /// clock; so is an actor on the loop.
  @Test func codeAfterASleepUnderThePreferenceRunsOnTheLoop() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "after sleep") { () async throws -> [Int] in
      let loop = try RunLoopThread(name: "r18-after-sleep")
      let onLoop = await Task(executorPreference: loop) { () -> [Int] in
        var counts = [0, 0, 0]
        for _ in 0..<5 {
          try? await Task.sleep(for: .milliseconds(1))
          if loop.isOnLoopThread { counts[0] += 1 }
          try? await Task.sleep(for: .milliseconds(1), clock: .suspending)
          if loop.isOnLoopThread { counts[1] += 1 }
          try? await loop.clock.sleep(for: .milliseconds(1))
          if loop.isOnLoopThread { counts[2] += 1 }
        }
        return counts
      }.value
      let actor = R18ShortSleeper(loop: loop)
      var actorOnLoop = 0
      for _ in 0..<5 where await actor.nap() { actorOnLoop += 1 }
      await execShutdown(loop)
      return onLoop + [actorOnLoop]
    }
    #expect(outcome == [5, 5, 5, 5])
  }
}

@Suite("ReviewRound18: invalidation racing a fresh add", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound18FreshAddTests {
  /// Promised (`CommandSource`): an invalidation racing posts right after an `add` (the add may
  /// still be on its way to the loop) still delivers every accepted command once, in order, and
  /// `cancel` runs once after `schedule`.
  @Test func invalidateRacingPostsRightAfterAddLosesNothing() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "fresh add race") { () async throws -> [String] in
      var problems: [String] = []
      let loop = try RunLoopThread(name: "r18-fresh")
      for round in 0..<60 {
        let seen = Guarded<[Int: [Int]]>([:])
        let pairs = PairLog()
        let commands = CommandSource<R18Item>(
          schedule: { _, loop, _ in pairs.schedule(loop) }, cancel: { _, loop in pairs.cancel(loop) }
        ) { item in seen.withLock { $0[item.producer, default: []].append(item.index) } }
        let release = round % 2 == 0 ? blockLoop(loop) : nil
        loop.add(commands.source, to: .common)
        let accepted = Guarded<[Int: [Int]]>([:])
        await execOnNewThread {
          var bodies: [@Sendable () -> Void] = (0..<2).map { producer in
            {
              var mine: [Int] = []
              for index in 0..<200 where commands.post(R18Item(producer: producer, index: index)) {
                mine.append(index)
              }
              accepted.withLock { $0[producer] = mine }
            }
          }
          bodies.append { commands.source.invalidate() }
          race(bodies)
        }
        release?.open()
        _ = await r18Poll(timeout: .seconds(5)) { pairs.counts.snapshot.values.contains { $0.cancel == 1 } }
        _ = try? loop.performAndWait { 0 }
        if seen.snapshot != accepted.snapshot.filter({ !$0.value.isEmpty }) {
          let counts = (seen.snapshot.mapValues(\.count), accepted.snapshot.mapValues(\.count))
          problems.append("round \(round): seen \(counts.0) accepted \(counts.1)")
        }
        problems += pairs.unpaired.map { "round \(round): \($0)" }
      }
      await execShutdown(loop)
      return problems
    }
    #expect(outcome == [])
  }
}

@Suite("ReviewRound18: one consumer", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound18OneConsumerTests {
  /// Promised: a second `makeAsyncIterator()` traps with a message saying a sequence has a single
  /// consumer, also after the first iterator was dropped.
  @Test func aSecondIteratorTrapsWithTheSingleConsumerMessage() async throws {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let loop = try RunLoopThread(name: "r18-second-iterator")
      let sequence = loop.timer(every: .seconds(3600))
      do { _ = sequence.makeAsyncIterator() }
      _ = sequence.makeAsyncIterator()
    }
    expectStandardError(of: result, mentions: "single consumer")
  }
}

extension ReviewRound18OneConsumerTests {
  /// The documented feedback of an activity consumer on the observed loop (`.all`) keeps the
  /// loop busy but not stuck: the consumer gets its events, can stop, and the loop shuts down.
  @Test func anActivityConsumerOnTheObservedLoopCanStop() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "activity feedback") { () async throws -> (Int, Int) in
      let loop = try RunLoopThread(name: "r18-feedback")
      let activities = loop.activities()
      let consumer = Task(executorPreference: loop) { () -> Int in
        var n = 0
        for await _ in activities {
          n += 1
          if n == 1000 { break }
        }
        return n
      }
      let events = await consumer.value
      let answer = (try? loop.performAndWait { 7 }) ?? 0
      await execShutdown(loop)
      return (events, answer)
    }
    #expect(outcome?.0 == 1000)
    #expect(outcome?.1 == 7)
  }
}
