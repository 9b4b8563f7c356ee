import AsyncRunLoop
import CoreFoundation
import Foundation
import Testing

@testable import AsyncRunLoopFoundation

/// Consumes `sequence` on a task of its own; a watchdog invalidates it after 60 s so a lost
/// element fails the test's counts instead of hanging it.
private func collect<S: AsyncSequence & Sendable>(
  _ sequence: S, invalidate: @escaping @Sendable () -> Void, count limit: Int = .max
) -> Task<[S.Element], Never> where S.Element: Sendable, S.Failure == Never {
  let watchdog = Task {
    try? await Task.sleep(for: .seconds(60))
    if !Task.isCancelled { invalidate() }
  }
  return Task {
    defer { watchdog.cancel() }
    var elements: [S.Element] = []
    for await element in sequence {
      elements.append(element)
      if elements.count == limit { break }
    }
    return elements
  }
}

/// Foundation timers and CF sources on a Foundation run-loop thread, consumed as async sequences:
/// exact counts, the end on invalidation, cancellation and the executor's shutdown.
@Suite struct CFRunLoopSequenceTests {
  @Test func everyCountedSignalIsInExactlyOneDeliveredPerformance() async {
    let executor = CFRunLoopExecutor.startThread(name: "cf-source-count")
    defer { executor.shutdown() }
    let sequence = executor.sourceSequence(bufferLimit: 4)
    let consumer = collect(sequence, invalidate: sequence.invalidate)
    let producers = 4
    let perProducer = 20_000
    let refused = await withTaskGroup(of: Int.self) { group in
      for _ in 0..<producers {
        group.addTask { (0..<perProducer).reduce(0) { refused, _ in refused + (sequence.signal() ? 0 : 1) } }
      }
      return await group.reduce(0, +)
    }
    sequence.invalidate()
    #expect(sequence.signal() == false)
    let elements = await consumer.value
    #expect(refused == 0)
    #expect(elements.reduce(0) { $0 + $1.signals } == producers * perProducer)
    #expect(elements.allSatisfy { $0.signals >= 0 && $0.performances >= 0 })
    #expect(elements.count <= producers * perProducer + 1)
  }

  @Test func shutdownDeliversWhatWasSignalledThenEndsTheSourceSequence() async {
    let executor = CFRunLoopExecutor.startThread(name: "cf-source-shutdown")
    let sequence = executor.sourceSequence()
    for _ in 0..<3 { #expect(sequence.signal()) }
    executor.shutdown()
    let elements = await collect(sequence, invalidate: sequence.invalidate).value
    #expect(elements.reduce(0) { $0 + $1.signals } == 3)
    #expect(sequence.signal() == false)
    #expect(!CFRunLoopSourceIsValid(sequence.source))
    // A sequence made after the executor terminated ends at once.
    let late = executor.sourceSequence()
    #expect(await collect(late, invalidate: late.invalidate).value.isEmpty)
    #expect(late.signal() == false)
  }

  @Test func cancellingTheConsumerEndsTheSourceSequenceAndInvalidatesTheSource() async {
    let executor = CFRunLoopExecutor.startThread(name: "cf-source-cancel")
    defer { executor.shutdown() }
    let sequence = executor.sourceSequence()
    #expect(sequence.signal())
    let consumer = collect(sequence, invalidate: sequence.invalidate)
    // The consumer took the first performance (or will): cancel it while it waits or runs.
    try? await Task.sleep(for: .milliseconds(20))
    consumer.cancel()
    let elements = await consumer.value
    #expect(elements.reduce(0) { $0 + $1.signals } <= 1)
    #expect(!CFRunLoopSourceIsValid(sequence.source))
    #expect(sequence.signal() == false)
  }

  @Test func aOneShotTimerDeliversOneTickThenEnds() async {
    let executor = CFRunLoopExecutor.startThread(name: "cf-timer-once")
    defer { executor.shutdown() }
    let sequence = executor.timer(after: .milliseconds(5))
    let ticks = await collect(sequence, invalidate: sequence.invalidate).value
    #expect(ticks.count == 1)
    #expect(ticks.first?.firings == 1)
    #expect(!CFRunLoopTimerIsValid(sequence.timer))
  }

  @Test func aRepeatingTimerTicksInOrderUntilInvalidated() async {
    let executor = CFRunLoopExecutor.startThread(name: "cf-timer-repeat")
    defer { executor.shutdown() }
    let sequence = executor.timer(every: .milliseconds(2), bufferLimit: 2)
    let consumer = Task {
      var ticks: [CFRunLoopTimerTick] = []
      for await tick in sequence {
        ticks.append(tick)
        if ticks.count == 5 { sequence.invalidate() }
      }
      return ticks
    }
    let ticks = await consumer.value
    // Up to two ticks may have been buffered when it was invalidated; they are still delivered.
    #expect((5...7).contains(ticks.count))
    #expect(ticks.allSatisfy { $0.firings >= 1 })
    #expect(zip(ticks, ticks.dropFirst()).allSatisfy { $0.firedAt < $1.firedAt })
    #expect(!CFRunLoopTimerIsValid(sequence.timer))
  }

  @Test func cancellingTheConsumerInvalidatesTheTimer() async {
    let executor = CFRunLoopExecutor.startThread(name: "cf-timer-cancel")
    defer { executor.shutdown() }
    let sequence = executor.timer(every: .seconds(3600))
    let consumer = collect(sequence, invalidate: sequence.invalidate)
    consumer.cancel()
    #expect(await consumer.value.isEmpty)
    #expect(!CFRunLoopTimerIsValid(sequence.timer))
  }

  @Test func leavingTheLoopWithBreakInvalidatesTheTimerWhileTheSequenceIsStillHeld() async {
    let executor = CFRunLoopExecutor.startThread(name: "cf-timer-break")
    defer { executor.shutdown() }
    let sequence = executor.timer(every: .milliseconds(1))
    var ticks = 0
    for await _ in sequence {
      ticks += 1
      break
    }
    #expect(ticks == 1)
    #expect(!CFRunLoopTimerIsValid(sequence.timer))
  }

  @Test func shutdownEndsATimerSequenceAndLaterOnesEndAtOnce() async {
    let executor = CFRunLoopExecutor.startThread(name: "cf-timer-shutdown")
    let sequence = executor.timer(every: .seconds(3600))
    let consumer = collect(sequence, invalidate: sequence.invalidate)
    executor.shutdown()
    #expect(await consumer.value.isEmpty)
    #expect(!CFRunLoopTimerIsValid(sequence.timer))
    let late = executor.timer(every: .seconds(3600))
    #expect(await collect(late, invalidate: late.invalidate).value.isEmpty)
  }
}

/// The sequences' buffer as a plain value: firings beyond the limit fold into the newest
/// element, so the delivered counts add up exactly.
@Suite struct FiringBufferTests {
  typealias Machine = FiringBuffer<CFRunLoopTimerTick, Int>

  @Test func firingsBeyondTheLimitFoldIntoTheNewestTick() {
    var machine = Machine(limit: 3)
    for index in 1...10 { _ = machine.deliver(CFRunLoopTimerTick(firedAt: Double(index), firings: 1)) }
    #expect(machine.buffered.map(\.firings) == [1, 1, 8])
    #expect(machine.buffered.last?.firedAt == 10)
    #expect(machine.foldedCount == 7)
  }

  @Test func aWaitingConsumerTakesTheFiringDirectly() {
    var machine = Machine(limit: 1)
    guard case .suspended = machine.next(7) else {
      Issue.record("an empty buffer suspends the consumer")
      return
    }
    guard case .resume(let consumer, let tick) = machine.deliver(CFRunLoopTimerTick(firedAt: 1, firings: 1)) else {
      Issue.record("a firing resumes the waiting consumer")
      return
    }
    #expect(consumer == 7)
    #expect(tick.firings == 1)
    #expect(machine.buffered.isEmpty)
  }

  @Test func theEndDeliversWhatIsBufferedThenNil() {
    var machine = Machine(limit: 4)
    _ = machine.deliver(CFRunLoopTimerTick(firedAt: 1, firings: 1))
    _ = machine.deliver(CFRunLoopTimerTick(firedAt: 2, firings: 1))
    guard case .none = machine.finish() else {
      Issue.record("no consumer waited")
      return
    }
    guard case .none = machine.deliver(CFRunLoopTimerTick(firedAt: 3, firings: 1)) else {
      Issue.record("a firing after the end is ignored")
      return
    }
    var taken: [Double?] = []
    for _ in 0..<3 {
      if case .return(let tick) = machine.next(0) { taken.append(tick?.firedAt) }
    }
    #expect(taken == [1, 2, nil])
  }

  @Test func cancellationDiscardsTheBufferAndResumesTheWaitingConsumer() {
    var machine = Machine(limit: 4)
    _ = machine.next(5)
    let (wasOpen, waiting) = machine.cancel()
    #expect(wasOpen)
    #expect(waiting == 5)
    guard case .return(nil) = machine.next(6) else {
      Issue.record("a cancelled sequence has ended")
      return
    }
    let again = machine.cancel()
    #expect(!again.wasOpen)
  }

  @Test func signalsNoPerformanceTookBecomeTheLastElement() {
    var machine = FiringBuffer<CFRunLoopSourcePerformance, Int>(limit: 2)
    let accepted = (0..<2).map { _ in machine.acceptSignal() }
    _ = machine.deliver(CFRunLoopSourcePerformance(signals: machine.takeSignals(), performances: 1))
    let acceptedLater = machine.acceptSignal()
    let final = CFRunLoopSourcePerformance(signals: machine.takeSignals(), performances: 0)
    _ = machine.finish(final: final)
    let acceptedAfterTheEnd = machine.acceptSignal()
    #expect(accepted == [true, true] && acceptedLater)
    #expect(!acceptedAfterTheEnd)
    #expect(machine.buffered == [.init(signals: 2, performances: 1), .init(signals: 1, performances: 0)])
  }
}

/// An actor pinned to a Foundation run-loop thread.
private actor PinnedToCFRunLoop {
  let executor: CFRunLoopExecutor
  nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }
  init(executor: CFRunLoopExecutor) { self.executor = executor }

  /// Takes `count` ticks, checking after each that it still runs isolated to itself.
  func takeTicks(_ ticks: CFRunLoopTimerSequence, count: Int) async -> Int {
    var taken = 0
    for await _ in ticks {
      preconditionIsolated("a tick resumed the actor outside its isolation")
      taken += 1
      if taken == count { break }
    }
    return taken
  }

  /// Takes performances until `signals` were counted, checking isolation after each.
  func takeSignals(_ performances: CFRunLoopSourceSequence, signals: Int) async -> Int {
    var counted = 0
    for await performance in performances {
      preconditionIsolated("a performance resumed the actor outside its isolation")
      counted += performance.signals
      if counted >= signals { break }
    }
    return counted
  }
}

/// The end of a timer or source sequence (`FiringSequenceStorage.end()`): the member is invalidated
/// before the sequence is marked ended, so a firing CF was already calling out when the member was
/// invalidated, and that reaches the sequence in between, is still delivered before the end.
@Suite struct FiringSequenceEndTests {
  @Test func aFiringThatArrivesBetweenTheInvalidationAndTheEndIsDeliveredBeforeTheEnd() async {
    typealias Storage = FiringSequenceStorage<CFRunLoopSourcePerformance>
    let reference = BridgeLock<Storage?>(nil)
    let invalidations = BridgeLock(0)
    // The invalidation is where the firing comes in: CF was already performing the source.
    let storage = Storage(limit: 4) {
      let first = invalidations.withLock { count -> Bool in
        count += 1
        return count == 1
      }
      guard first, let storage = reference.withLock({ $0 }) else { return }
      storage.deliver { _ in CFRunLoopSourcePerformance(signals: 1, performances: 1) }
    }
    reference.withLock { $0 = storage }
    storage.claimIterator(sequenceName: "FiringSequenceEndTests")
    storage.end()
    let delivered = await storage.next()
    let afterTheEnd = await storage.next()
    #expect(invalidations.withLock { $0 } >= 1)
    #expect(delivered == CFRunLoopSourcePerformance(signals: 1, performances: 1))
    #expect(afterTheEnd == nil)
    reference.withLock { $0 = nil }  // (the storage's closure holds the reference: no cycle left)
  }
}

/// The sequences' iterators run in the caller's isolation: a `for await` in an actor (pinned to
/// the run loop's thread, or on the default executor) gets every element inside that actor.
@Suite struct CFRunLoopSequenceIsolationTests {
  @Test func anActorPinnedToTheRunLoopConsumesTicksInItsIsolation() async {
    let executor = CFRunLoopExecutor.startThread(name: "cf-actor-ticks")
    defer { executor.shutdown() }
    let actor = PinnedToCFRunLoop(executor: executor)
    let ticks = executor.timer(every: .milliseconds(1))
    #expect(await actor.takeTicks(ticks, count: 5) == 5)
  }

  @Test func anActorConsumesSignalsInItsIsolation() async {
    let executor = CFRunLoopExecutor.startThread(name: "cf-actor-signals")
    defer { executor.shutdown() }
    let actor = PinnedToCFRunLoop(executor: executor)
    let performances = executor.sourceSequence()
    let consumer = Task { await actor.takeSignals(performances, signals: 50) }
    for _ in 0..<50 {
      #expect(performances.signal())
      usleep(100)
    }
    #expect(await consumer.value == 50)
  }
}

/// An actor pinned to one of our loops that consumes a Foundation-side sequence, publishing how
/// many elements it took.
private actor BridgedConsumer: LoopActor {
  nonisolated let loop: RunLoopThread
  init(loop: RunLoopThread) { self.loop = loop }

  func consume(_ sequence: CFRunLoopSourceSequence, count: Int, taken: Locked<Int>) async -> Int {
    var received = 0
    for await _ in sequence {
      received += 1
      taken.withLock { $0 = received }
      if received == count { break }
    }
    return received
  }
}

/// A suspended consumer on one of our loops is resumed in as few of that loop's jobs as a core
/// sequence's: two per suspension for a task that prefers the loop (the task executor's, then the
/// actor's), not three.
@Suite struct BridgedSequenceConsumerJobsTests {
  @Test func anActorOnALoopResumesFromACFSourceSequenceInAtMostTwoLoopJobs() async throws {
    let executor = CFRunLoopExecutor.startThread(name: "cf-consumer-jobs")
    defer { executor.shutdown() }
    let loop = try RunLoopThread(name: "cf-consumer-jobs-loop")
    loop.setMetricsEnabled(true)
    try loop.performAndWait {}
    let sequence = executor.sourceSequence()
    let consumer = BridgedConsumer(loop: loop)
    let taken = Locked(0)
    let count = 200
    let before = loop.metrics.jobs
    let task = Task(executorPreference: loop) { await consumer.consume(sequence, count: count, taken: taken) }
    // Each signal waits until the consumer took the element before it (and suspended again).
    let deadline = ContinuousClock.now.advanced(by: .seconds(60) * watchdogScale)
    var stalled = false
    for element in 0..<count where !stalled {
      while taken.withLock({ $0 }) < element, !stalled {
        stalled = ContinuousClock.now >= deadline
        await Task.yield()
      }
      if !stalled { #expect(sequence.signal()) }
    }
    if stalled {
      Issue.record("the consumer took \(taken.withLock { $0 }) of \(count) elements in \(60 * watchdogScale) s")
      sequence.invalidate()  // ends its loop, so that the task below ends
    }
    let received = await task.value
    try loop.performAndWait {}
    let jobs = loop.metrics.jobs - before
    #expect(received == count)
    #expect(jobs <= UInt64(2 * count + 10), "\(jobs) loop jobs for \(count) suspensions")
    loop.shutdownAndWait()
  }
}
