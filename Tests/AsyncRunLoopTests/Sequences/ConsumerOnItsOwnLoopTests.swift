import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

/// A `SourceSequence` consumer that runs on the source's own loop and finds nothing to take fires
/// the source itself when the loop has nothing else to do before it would fire it, so it takes
/// what was posted while it ran without waiting for a pass — but only then: in a mode the source
/// is in, never ahead of work sent before the element, never inside a run that must see the source
/// fire, and never for so long that the loop's timers and other jobs wait.
@Suite struct ConsumerOnItsOwnLoopTests {
  /// A consumer that posts its own next element: every element arrives once and in order, and each
  /// job of the consumer takes at least two (the one it was resumed for, then one posted while it
  /// ran), so the loop makes at most about one pass for two elements, not one per element.
  @Test func aConsumerTakesWhatWasPostedWhileItRanWithoutAPassPerElement() async throws {
    let loop = try RunLoopThread(name: "early-self")
    defer { loop.shutdownAndWait() }
    // Passes counted by the loop's metrics: an observer told of a pass's steps would itself keep
    // the consumer waiting for the pass (it must be told before the source fires).
    loop.setMetricsEnabled(true)
    let sequence = loop.sourceSequence(of: Int.self)
    let count = 2_000
    try loop.performAndWait {}  // the sequence's source is in
    let before = loop.metrics.passes
    #expect(sequence.post(0) == .enqueued)
    let received = try await withWatchdog(timeout: .seconds(60), "self-posting consumer") {
      await consumeOnLoop(loop) { () async -> [Int] in
        var received: [Int] = []
        for await value in sequence {
          received.append(value)
          if value + 1 == count { break }
          #expect(sequence.post(value + 1) == .enqueued)
        }
        return received
      }
    }
    let used = Int(loop.metrics.passes - before)
    #expect(received == Array(0..<count))
    #expect(used <= count * 3 / 4, "one pass per element means the consumer waited for the loop each time: \(used)")
  }

  /// Posts from other threads and from the consumer itself, early fires and the loop's own fires
  /// interleaved: every accepted element is delivered exactly once, in each producer's order.
  @Test func elementsPostedFromEverywhereArriveOnceInEachProducersOrder() async throws {
    let loop = try RunLoopThread(name: "early-mixed")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: (producer: Int, index: Int).self)
    let perProducer = 5_000
    let selfPosts = 5_000
    let producers = (1...2).map { producer in
      startThread {
        for index in 0..<perProducer { #expect(sequence.post((producer, index)) == .enqueued) }
      }
    }
    let total = 2 * perProducer + selfPosts
    let byProducer = try await withWatchdog(timeout: .seconds(60), "mixed consumer") {
      await consumeOnLoop(loop) { () async -> [Int: [Int]] in
        var byProducer: [Int: [Int]] = [:]
        var selfPosted = 0
        var received = 0
        if selfPosted < selfPosts {
          #expect(sequence.post((0, selfPosted)) == .enqueued)
          selfPosted += 1
        }
        for await (producer, index) in sequence {
          byProducer[producer, default: []].append(index)
          received += 1
          if received == total { break }
          if producer == 0, selfPosted < selfPosts {
            #expect(sequence.post((0, selfPosted)) == .enqueued)
            selfPosted += 1
          }
        }
        return byProducer
      }
    }
    await execOnNewThread { for producer in producers { joinThread(producer) } }
    #expect(byProducer?[0] == Array(0..<selfPosts))
    #expect(byProducer?[1] == Array(0..<perProducer))
    #expect(byProducer?[2] == Array(0..<perProducer))
  }

  /// The consumer resumes inside a run of a mode its source is not in (a nested run started by a
  /// performed block, which resumes it; jobs run in every mode) and posts its next element there:
  /// it does not take it until the loop runs one of the source's modes again.
  @Test func aConsumerTakesNothingEarlyInAModeItsSourceIsNotIn() async throws {
    let loop = try RunLoopThread(name: "early-modes")
    defer { loop.shutdownAndWait() }
    let other = RunLoopMode("early-other")
    let sequence = loop.sourceSequence(of: Int.self, modes: [.default])
    // Something to watch in `other`, so that each nested run there sleeps out its time limit.
    let idleTimer = LoopTimer(after: .seconds(3_600)) { _ in }
    loop.add(idleTimer, to: other)
    defer { idleTimer.invalidate() }
    struct State {
      var inOtherMode = false
      var postedInOtherMode = false
      var receivedInOtherMode: [Int] = []
      var received: [Int] = []
    }
    let state = Locked(State())
    #expect(sequence.post(1) == .enqueued)
    try await withWatchdog(timeout: .seconds(30), "consumer in another mode") {
      await consumeOnLoop(loop) {
        for await value in sequence {
          state.withLock {
            $0.received.append(value)
            if $0.inOtherMode { $0.receivedInOtherMode.append(value) }
          }
          if value == 2 { break }
          // Resumed by the block from inside its nested run: the consumer's next job runs there.
          await withCheckedContinuation { (resume: CheckedContinuation<Void, Never>) in
            loop.perform(inModes: [.default]) {
              state.withLock { $0.inOtherMode = true }
              resume.resume()
              // Nested runs of `other` (5 ms each) until the consumer has posted there, then 50 ms more.
              while !state.withLock({ $0.postedInOtherMode }) { loop.run(mode: other, for: .milliseconds(5)) }
              loop.run(mode: other, for: .milliseconds(50))
              state.withLock { $0.inOtherMode = false }
            }
          }
          let inOtherMode = state.withLock { $0.inOtherMode }
          #expect(sequence.post(2) == .enqueued)
          state.withLock { $0.postedInOtherMode = true }
          #expect(inOtherMode, "the consumer should have resumed inside the nested run of the other mode")
        }
      }
    }
    let final = state.withLock { $0 }
    #expect(final.received == [1, 2])
    #expect(final.receivedInOtherMode.isEmpty, "released in a mode the source is not in")
  }

  /// The window for early fires is per job: a consumer that sleeps between elements (each time
  /// resumed in a new job, long after its last early fire) takes the element it posted after each
  /// wake-up in that job, without waiting for a pass.
  @Test func aConsumerResumedFromASleepTakesWhatItPostedWithoutWaitingForAPass() async throws {
    let loop = try RunLoopThread(name: "early-after-sleep")
    defer { loop.shutdownAndWait() }
    loop.setMetricsEnabled(true)
    let sequence = loop.sourceSequence(of: Int.self)
    try loop.performAndWait {}  // the sequence's source is in
    let rounds = 20
    let consumer = SleepingConsumer(loop: loop)
    let withoutAPass = try await withWatchdog(timeout: .seconds(60), "sleeping consumer") {
      await consumer.consume(sequence, rounds: rounds)
    }
    // (Not every round need be: a consumer never fires ahead of another job of its loop, and the
    // sleep's own small task may still wait behind the consumer's job.)
    #expect((withoutAPass ?? 0) >= rounds / 2, "each element waited for a pass: \(String(describing: withoutAPass))")
  }

  /// A nested run that returns after a handled source, with the source's consumer running inside
  /// it: the consumer does not fire the source itself, so the run sees the fire and returns
  /// `.handledSource` (instead of running on to its time limit).
  @Test func aRunThatReturnsAfterASourceStillSeesItFireWhenTheConsumerRunsInside() async throws {
    let loop = try RunLoopThread(name: "early-handled")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: Int.self)
    let result = Locked<RunLoopRunResult?>(nil)
    let inNestedRun = Atomic<Bool>(false)
    #expect(sequence.post(1) == .enqueued)
    let received = try await withWatchdog(timeout: .seconds(30), "consumer in a handled-source run") {
      await consumeOnLoop(loop) { () async -> [Int] in
        var received: [Int] = []
        for await value in sequence {
          received.append(value)
          if value == 2 { break }
          // Resumed by the block from inside its nested run: the consumer's next job runs there.
          await withCheckedContinuation { (resume: CheckedContinuation<Void, Never>) in
            loop.perform(inModes: [.default]) {
              inNestedRun.store(true, ordering: .relaxed)
              resume.resume()
              let ended = loop.run(mode: .default, for: .seconds(10), returnAfterSourceHandled: true)
              inNestedRun.store(false, ordering: .relaxed)
              result.withLock { $0 = ended }
            }
          }
          let resumedInside = inNestedRun.load(ordering: .relaxed)
          #expect(resumedInside, "the consumer should have resumed inside the nested run")
          #expect(sequence.post(2) == .enqueued)
        }
        return received
      }
    }
    #expect(received == [1, 2])
    await eventually("the nested run ended") { result.withLock { $0 } != nil }
    #expect(result.withLock { $0 } == .handledSource)
  }

  /// A consumer that keeps finding elements posted while it ran (it posts them itself) still lets
  /// the loop fire its timers and run its other tasks' jobs. (A job or a due timer waiting keeps
  /// the consumer from firing early at all; the readiness test below covers the time limit.)
  @Test func aConsumerFedFromItsOwnLoopLeavesTheLoopToItsTimersAndOtherTasks() async throws {
    let loop = try RunLoopThread(name: "early-fair")
    defer { loop.shutdownAndWait() }
    let timerFires = Atomic<Int>(0)
    let timer = LoopTimer(after: .milliseconds(1), repeatingEvery: .milliseconds(1)) { _ in
      timerFires.wrappingAdd(1, ordering: .relaxed)
    }
    loop.add(timer, to: .common)
    defer { timer.invalidate() }
    let otherTaskTurns = Atomic<Int>(0)
    let stop = Atomic<Bool>(false)
    let other = Task(executorPreference: loop) {
      while !stop.load(ordering: .relaxed) {
        otherTaskTurns.wrappingAdd(1, ordering: .relaxed)
        await Task.yield()
      }
    }
    let sequence = loop.sourceSequence(of: Int.self)
    #expect(sequence.post(0) == .enqueued)
    let enough = 5
    let outcome = try await withWatchdog(timeout: .seconds(60), "self-fed consumer") {
      await consumeOnLoop(loop) { () async -> (timerFires: Int, otherTurns: Int) in
        let firesBefore = timerFires.load(ordering: .relaxed)
        let turnsBefore = otherTaskTurns.load(ordering: .relaxed)
        let giveUp = ContinuousClock.now.advanced(by: .seconds(20))
        var outcome = (timerFires: 0, otherTurns: 0)
        for await value in sequence {
          outcome = (
            timerFires.load(ordering: .relaxed) - firesBefore, otherTaskTurns.load(ordering: .relaxed) - turnsBefore
          )
          // Only this consumer's own posts keep it busy: the loop gets a pass only when it waits.
          if (outcome.timerFires >= enough && outcome.otherTurns >= enough) || ContinuousClock.now > giveUp { break }
          #expect(sequence.post(value + 1) == .enqueued)
        }
        return outcome
      }
    }
    stop.store(true, ordering: .relaxed)
    await other.value
    #expect((outcome?.timerFires ?? 0) >= enough, "the timer did not get its turn: \(String(describing: outcome))")
    #expect((outcome?.otherTurns ?? 0) >= enough, "the other task did not get its turn: \(String(describing: outcome))")
  }

  /// A consumer that keeps finding elements posted while it ran (it posts them itself) on a loop
  /// that has nothing else waiting: a descriptor that becomes ready meanwhile, which only a pass's
  /// wait sees, still gets its handler called soon, because each job fires early only for a
  /// while before the consumer waits for a pass again.
  @Test func aConsumerFedFromItsOwnLoopLeavesTheLoopToADescriptorThatBecameReady() async throws {
    let loop = try RunLoopThread(name: "early-readiness")
    defer { loop.shutdownAndWait() }
    let pipe = makePipe()
    defer {
      close(pipe.read)
      close(pipe.write)
    }
    let handled = Atomic<Bool>(false)
    let source = DescriptorSource(descriptor: pipe.read) { _, _ in
      drainDescriptor(pipe.read)
      handled.store(true, ordering: .releasing)
    }
    try loop.add(source, to: .default)
    defer { source.invalidate() }
    let sequence = loop.sourceSequence(of: Int.self)
    #expect(sequence.post(0) == .enqueued)
    let handledInTime = try await withWatchdog(timeout: .seconds(60), "self-fed consumer") {
      await consumeOnLoop(loop) { () async -> Bool in
        let giveUp = ContinuousClock.now.advanced(by: .seconds(20))
        for await value in sequence {
          if value == 100 { writeByte(pipe.write) }  // ready from now on; only a pass's wait can see it
          if handled.load(ordering: .acquiring) { return true }
          if ContinuousClock.now > giveUp { return false }
          #expect(sequence.post(value + 1) == .enqueued)
        }
        return false
      }
    }
    #expect(handledInTime == true, "the descriptor's handler never ran while the consumer fed itself")
  }

  /// What was sent to the loop before an element — a block for the mode, another source's signal,
  /// an executor job, a registration change — takes effect before the consumer gets the element,
  /// even though the consumer is running on the loop when the element arrives (as in a pass: work
  /// point A and step 2 come before step 4, and a lower order fires first).
  @Test(arguments: EarlierWork.allCases)
  func workSentBeforeAnElementComesBeforeTheConsumerGetsIt(_ earlier: EarlierWork) async throws {
    let loop = try RunLoopThread(name: "early-order")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: Int.self, order: 0)
    let log = Locked<[String]>([])
    let other = InputSource(order: -1) { _ in log.withLock { $0.append("earlier") } }
    loop.add(other, to: .default)
    defer { other.invalidate() }
    let added = InputSource(schedule: { _, _, _ in log.withLock { $0.append("earlier") } }) { _ in }
    defer { added.invalidate() }
    let inBody = TestGate()
    let proceed = TestGate()
    let rounds = 20
    #expect(sequence.post(0) == .enqueued)
    let consumer = Task(executorPreference: loop) {
      for await value in sequence {
        log.withLock { $0.append("element \(value)") }
        if value == rounds { break }
        if value == 1 {
          // Busy on the loop while another thread sends work, then the next element.
          inBody.open()
          _ = proceed.wait(timeout: .seconds(30))
        } else {
          #expect(sequence.post(value + 1) == .enqueued)  // keeps the consumer running early
        }
      }
    }
    _ = await execOnNewThread { inBody.wait(timeout: .seconds(30)) }
    switch earlier {
    case .block: #expect(loop.perform(inModes: [.default]) { log.withLock { $0.append("earlier") } })
    case .lowerOrderSource: other.signal()
    case .job: Task(executorPreference: loop) { log.withLock { $0.append("earlier") } }
    case .registrationChange: loop.add(added, to: .default)
    }
    #expect(sequence.post(2) == .enqueued)
    proceed.open()
    _ = try await withWatchdog(timeout: .seconds(30), "consumer") { await consumer.value }
    let entries = log.withLock { $0 }
    let earlierAt = entries.firstIndex(of: "earlier")
    let elementAt = entries.firstIndex(of: "element 2")
    #expect(earlierAt != nil && elementAt != nil && earlierAt! < elementAt!, "\(entries.prefix(6))")
  }
}

/// A consumer on its loop's thread that sleeps before each element it posts itself.
private actor SleepingConsumer: LoopActor {
  let loop: RunLoopThread
  init(loop: RunLoopThread) { self.loop = loop }

  /// Sleeps, posts, takes the element; `rounds` times. Returns in how many rounds the element came
  /// without a pass of the loop in between.
  func consume(_ sequence: SourceSequence<Int>, rounds: Int) async -> Int {
    var iterator = sequence.makeAsyncIterator()
    var withoutAPass = 0
    for index in 0..<rounds {
      try? await Task.sleep(for: .milliseconds(2))  // resumed in a new job of the loop
      let passesBefore = loop.metrics.passes
      #expect(sequence.post(index) == .enqueued)
      let value = await iterator.next()
      #expect(value == index)
      if loop.metrics.passes == passesBefore { withoutAPass += 1 }
    }
    return withoutAPass
  }
}

/// Work another thread sends to the loop before posting an element.
enum EarlierWork: String, CaseIterable, Sendable {
  case block
  case lowerOrderSource
  case job
  case registrationChange
}
