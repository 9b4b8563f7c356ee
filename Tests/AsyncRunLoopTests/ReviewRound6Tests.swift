import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

/// Review round 6: the async sequences (exact counts under concurrent producers, every point of
/// cancellation, ends while a consumer waits or elements are buffered, buffering policies,
/// consumers on the sequence's own loop), `RunLoopThread.current`, and reclamation (weak
/// references to what members, sequences and loops held). Counts and identities only; waits use
/// gates and polls, never timing assertions.
@Suite("ReviewRound6: sequences, current loops, reclamation")
struct ReviewRound6Tests {
  let modeA = RunLoopMode("r6-a")
  let modeB = RunLoopMode("r6-b")

  // MARK: - Exact counts under concurrent producers

  /// Every signal from many threads is counted exactly once: the elements (numbers of signals)
  /// sum to the number of `signal()` calls that answered true, once `invalidate()` has let the
  /// consumer drain.
  @Test(arguments: 0..<5) func signalsFromManyThreadsSumExactly(round: Int) async throws {
    let loop = try RunLoopThread(name: "r6-signals-\(round)")
    defer { loop.shutdownAndWait() }
    let sequence = loop.signalSequence()
    let consumer = Task(executorPreference: round.isMultiple(of: 2) ? loop : nil) { () async -> (Int, Bool) in
      var sum = 0
      var positive = true
      for await count in sequence {
        if count < 1 { positive = false }
        sum += count
      }
      return (sum, positive)
    }
    let perThread = 20_000
    let accepted = AtomicCounter()
    await race(
      (0..<4).map { _ -> @Sendable () -> Void in
        {
          for _ in 0..<perThread where sequence.signal() { accepted.increment() }
        }
      })
    sequence.invalidate()
    let outcome = try await withWatchdog(timeout: .seconds(20), "signal consumer") { await consumer.value }
    #expect(accepted.current == 4 * perThread)
    #expect(outcome?.0 == 4 * perThread)
    #expect(outcome?.1 == true)
    #expect(sequence.signal() == false)
  }

  /// `.dropOldest` from many threads: every post is taken (`.enqueued` or
  /// `.enqueuedDroppingOldest`), the drops reported equal `droppedCount`, and what the consumer
  /// receives plus what was dropped is exactly what was posted, each producer's in order.
  @Test(arguments: 0..<3) func dropOldestAccountsForEveryPost(round: Int) async throws {
    let loop = try RunLoopThread(name: "r6-dropold-\(round)")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: Int.self, buffering: .dropOldest(3))
    let consumer = Task { () async -> (Int, Bool) in
      var next = [Int](repeating: 0, count: 4)
      var received = 0
      var ordered = true
      for await value in sequence {
        let producer = value >> 32
        let index = value & 0xFFFF_FFFF
        if index < next[producer] { ordered = false }
        next[producer] = index + 1
        received += 1
      }
      return (received, ordered)
    }
    let perThread = 5000
    let results = Guarded<[SourcePostResult: Int]>([:])
    await race(
      (0..<4).map { producer -> @Sendable () -> Void in
        {
          var local: [SourcePostResult: Int] = [:]
          for index in 0..<perThread { local[sequence.post(producer << 32 | index), default: 0] += 1 }
          results.withLock { $0.merge(local, uniquingKeysWith: +) }
        }
      })
    sequence.invalidate()
    let outcome = try await withWatchdog(timeout: .seconds(20), "dropOldest consumer") { await consumer.value }
    let counts = results.snapshot
    let total = 4 * perThread
    #expect((counts[.enqueued] ?? 0) + (counts[.enqueuedDroppingOldest] ?? 0) == total, "\(counts)")
    #expect(counts[.enqueuedDroppingOldest] ?? 0 == sequence.droppedCount)
    #expect(outcome.map { $0.0 + sequence.droppedCount } == total)
    #expect(outcome?.1 == true)
  }

  /// `.dropNewest` from many threads: the consumer receives exactly the posts answered
  /// `.enqueued`; the `.dropped` answers equal `droppedCount`.
  @Test func dropNewestDeliversExactlyTheEnqueuedPosts() async throws {
    let loop = try RunLoopThread(name: "r6-dropnew")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: Int.self, buffering: .dropNewest(3))
    let consumer = Task { () async -> Set<Int> in
      var received = Set<Int>()
      for await value in sequence { received.insert(value) }
      return received
    }
    let enqueued = Guarded<Set<Int>>([])
    let dropped = AtomicCounter()
    await race(
      (0..<4).map { producer -> @Sendable () -> Void in
        {
          for index in 0..<5000 {
            let value = producer * 1_000_000 + index
            switch sequence.post(value) {
            case .enqueued: enqueued.withLock { _ = $0.insert(value) }
            case .dropped: dropped.increment()
            default: Issue.record("unexpected answer")
            }
          }
        }
      })
    sequence.invalidate()
    let received = try await withWatchdog(timeout: .seconds(20), "dropNewest consumer") { await consumer.value }
    #expect(received == enqueued.snapshot)
    #expect(dropped.current == sequence.droppedCount)
    #expect(enqueued.snapshot.count + dropped.current == 20_000)
  }

  /// `.bounded` with many async senders, some of them cancelled while they wait: exactly the
  /// values whose `send` answered `.enqueued` are delivered, each once; a cancelled sender's
  /// `.full` element is never delivered.
  @Test(arguments: 0..<3) func boundedSendersDeliverExactlyTheEnqueuedValues(round: Int) async throws {
    let loop = try RunLoopThread(name: "r6-bounded-\(round)")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(2))
    let consumer = Task(executorPreference: round.isMultiple(of: 2) ? loop : nil) { () async -> [Int] in
      var received: [Int] = []
      for await value in sequence { received.append(value) }
      return received
    }
    let enqueued = Guarded<Set<Int>>([])
    let refused = Guarded<Set<Int>>([])
    let senders = (0..<8).map { sender in
      Task { () async -> Void in
        for index in 0..<400 {
          let value = sender * 1_000_000 + index
          switch await sequence.send(value) {
          case .enqueued: enqueued.withLock { _ = $0.insert(value) }
          case .full: refused.withLock { _ = $0.insert(value) }
          default: Issue.record("unexpected answer for \(value)")
          }
        }
      }
    }
    await eventually("some sends to be taken") { enqueued.snapshot.count > 200 }
    senders[1].cancel()
    senders[5].cancel()
    for sender in senders { await sender.value }
    sequence.invalidate()
    let received = try await withWatchdog(timeout: .seconds(20), "bounded consumer") { await consumer.value }
    #expect(received?.count == enqueued.snapshot.count)
    #expect(received.map(Set.init) == enqueued.snapshot)
    #expect(Set(received ?? []).isDisjoint(with: refused.snapshot))
    #expect(enqueued.snapshot.count + refused.snapshot.count == 8 * 400)
  }

  /// "The count … no longer counts elements the consumer has taken into its current batch": once
  /// the consumer holds a batch, a `.bounded(2)` buffer takes two more posts, then answers
  /// `.full`.
  @Test func boundedCapacityExcludesTheConsumersBatch() async throws {
    let loop = try RunLoopThread(name: "r6-bounded-batch")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(2))
    let release = blockLoop(loop)
    #expect(sequence.post(1) == .enqueued)
    #expect(sequence.post(2) == .enqueued)
    #expect(sequence.post(3) == .full)
    release.open()
    let tookFirst = TestGate()
    let proceed = TestGate()
    let consumer = Task { () async -> [Int] in
      var received: [Int] = []
      for await value in sequence {
        received.append(value)
        if value == 1 {
          tookFirst.open()
          while !proceed.opened { try? await Task.sleep(for: .milliseconds(1)) }
        }
      }
      return received
    }
    await eventually("the consumer took its first batch") { tookFirst.opened }
    #expect(sequence.bufferedCount == 0)
    #expect(sequence.post(3) == .enqueued)
    #expect(sequence.post(4) == .enqueued)
    #expect(sequence.post(5) == .full)
    proceed.open()
    sequence.invalidate()
    let received = try await withWatchdog(timeout: .seconds(20), "consumer") { await consumer.value }
    #expect(received == [1, 2, 3, 4])
  }

  // MARK: - Cancellation at every point

  /// A task cancelled before its first `next()`: the sequence ends at once, the buffered elements
  /// are released, later posts answer `.terminated`, `onCancel` runs once on the loop thread.
  @Test func cancelledBeforeTheFirstNextEndsAndReleasesTheBuffer() async throws {
    let loop = try RunLoopThread(name: "r6-cancel-first")
    defer { loop.shutdownAndWait() }
    let cancels = SequenceCallLog()
    let sequence = loop.sourceSequence(
      of: R6Object.self, onCancel: { cancelLoop in cancels.record(onLoopThread: cancelLoop.isOnLoopThread) })
    let watchers = (0..<4).map { _ in R6Weak() }
    for watcher in watchers {
      let object = R6Object()
      watcher.object = object
      #expect(sequence.post(object) == .enqueued)
    }
    await loopBarrier(loop)  // released to the consumer side
    let count = try await withWatchdog(timeout: .seconds(30), "pre-cancelled consumer") { () async -> Int in
      await Task { () async -> Int in
        withUnsafeCurrentTask { $0?.cancel() }
        var count = 0
        for await _ in sequence { count += 1 }
        return count
      }.value
    }
    #expect(count == 0)
    #expect(watchers.allSatisfy { $0.object == nil })
    #expect(sequence.post(R6Object()) == .terminated)
    await eventually("cancel routine") { cancels.count == 1 }
    #expect(cancels.allOnLoopThread)
  }

  /// Cancelled between two elements of one batch: `next()` returns nil at once (the rest of the
  /// batch is not handed out), and every element is released once the task ends.
  @Test func cancelledBetweenElementsOfABatchEndsAtOnce() async throws {
    let loop = try RunLoopThread(name: "r6-cancel-mid")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: R6Object.self)
    let watchers = (0..<5).map { _ in R6Weak() }
    let release = blockLoop(loop)
    for watcher in watchers {
      let object = R6Object()
      watcher.object = object
      _ = sequence.post(object)
    }
    release.open()
    await loopBarrier(loop)
    let count = try await withWatchdog(timeout: .seconds(30), "consumer cancelled mid-batch") { () async -> Int in
      await Task { () async -> Int in
        var count = 0
        for await _ in sequence {
          count += 1
          withUnsafeCurrentTask { $0?.cancel() }
        }
        return count
      }.value
    }
    #expect(count == 1)
    #expect(watchers.allSatisfy { $0.object == nil })
    #expect(sequence.post(R6Object()) == .terminated)
  }

  /// Cancelled while suspended, for every kind of sequence, from a task that prefers the
  /// sequence's loop and from one that does not: `next()` returns nil.
  @Test(arguments: [false, true]) func cancelledWhileSuspendedEndsEveryKind(onLoop: Bool) async throws {
    let loop = try RunLoopThread(name: "r6-cancel-wait")
    defer { loop.shutdownAndWait() }
    let pipeEnds = makePipe()
    defer {
      close(pipeEnds.read)
      close(pipeEnds.write)
    }
    let source = loop.sourceSequence(of: Int.self)
    let signal = loop.signalSequence()
    let timer = loop.timer(every: .seconds(3600))
    let readiness = try loop.readiness(of: pipeEnds.read)
    let activity = loop.activities(.entry, modes: [modeA])
    let preference: RunLoopThread? = onLoop ? loop : nil
    let tasks: [Task<Int, Never>] = [
      Task(executorPreference: preference) { await r6Count(source) },
      Task(executorPreference: preference) { await r6Count(signal) },
      Task(executorPreference: preference) { await r6Count(timer) },
      Task(executorPreference: preference) { await r6Count(readiness) },
      Task(executorPreference: preference) { await r6Count(activity) },
    ]
    try await Task.sleep(for: .milliseconds(20))  // let them suspend (not asserted on)
    for task in tasks { task.cancel() }
    let counts = try await withWatchdog(timeout: .seconds(30), "cancelled consumers") { () async -> [Int] in
      var counts: [Int] = []
      for task in tasks { counts.append(await task.value) }
      return counts
    }
    #expect(counts == [0, 0, 0, 0, 0])
    #expect(source.post(1) == .terminated)
    #expect(signal.signal() == false)
  }

  // MARK: - Ends while elements are buffered

  /// Elements posted while the loop is busy (not yet released by it) and then `invalidate()` or
  /// the loop's shutdown: everything accepted is still delivered, in order, then nil.
  @Test(arguments: [false, true]) func acceptedButUnreleasedElementsSurviveTheEnd(shutdown: Bool) async throws {
    let loop = try RunLoopThread(name: "r6-unreleased")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: Int.self)
    let signals = loop.signalSequence()
    await loopBarrier(loop)  // both sources are on the loop
    let release = blockLoop(loop)
    for value in 0..<5 { #expect(sequence.post(value) == .enqueued) }
    for _ in 0..<3 { #expect(signals.signal()) }
    if shutdown {
      loop.shutdown()
    } else {
      sequence.invalidate()
      signals.invalidate()
    }
    // After invalidate() a post is refused at once; after shutdown() the loop has yet to detach
    // the source, so a post may still be taken — then it must be delivered too.
    let late = sequence.post(99)
    if !shutdown { #expect(late == .terminated) }
    release.open()
    let outcome = try await withWatchdog(timeout: .seconds(30), "drain after the end") { () async -> ([Int], Int) in
      var values: [Int] = []
      for await value in sequence { values.append(value) }
      var total = 0
      for await count in signals { total += count }
      return (values, total)
    }
    #expect(outcome?.0 == [0, 1, 2, 3, 4] + (late.isEnqueued ? [99] : []))
    #expect(outcome?.1 == 3)
  }

  /// `TimerSequence.invalidate()` and the loop's shutdown end the sequence after the ticks the loop
  /// has already fired; a one-shot tick whose instant passed while the loop was busy, not fired
  /// yet, is not delivered after `invalidate()` (no fire after the invalidation, as with a
  /// `LoopTimer`). The review found the old doc ("ticks already due are delivered") promised it;
  /// the doc now says what holds. A shutdown may let one pass fire it before the drain: at most
  /// that one tick, and the sequence ends either way.
  @Test(arguments: [false, true])
  func aTickDueButNotFiredWhenTheTimerEndsIsNotDeliveredAfterInvalidate(shutdown: Bool) async throws {
    let loop = try RunLoopThread(name: "r6-due-tick")
    defer { loop.shutdownAndWait() }
    let timer = loop.timer(after: .milliseconds(150))
    // The loop is blocked from a new thread at once (a resumption on a busy pool could outlast
    // the 150 ms, and blocking a pool thread this long starves other tests): the block runs only
    // once the timer's add, sent before it, was applied, so the timer is on the loop.
    _ = await execOnNewThread {
      let release = blockLoop(loop)
      let due = LoopClock.Instant.now.advanced(by: .milliseconds(200))
      while LoopClock.Instant.now < due { usleep(2000) }  // its instant has passed: the tick is due
      if shutdown { loop.shutdown() } else { timer.invalidate() }
      release.open()
      return true
    }
    let ticks = try await withWatchdog(timeout: .seconds(20), "ticks after invalidate") { await r6Count(timer) }
    if shutdown {
      #expect(ticks.map { $0 <= 1 } == true)
    } else {
      #expect(ticks == 0)
    }
  }

  // MARK: - Buffering of the activity sequence and the timer policies

  /// `bufferLimit`: a consumer that falls behind keeps the newest `bufferLimit` events, in order;
  /// the rest are counted in `droppedCount`. Checked on the calling thread's own loop, run by hand.
  @Test func activityBufferKeepsTheNewestEventsAndCountsTheRest() async throws {
    let mode = modeA
    let sequence = try await withWatchdogOnThread { () -> ActivitySequence in
      let loop = RunLoopThread.current
      let keeper = InputSource(perform: { _ in })
      loop.add(keeper, to: mode)
      let sequence = loop.activities([.entry, .exit], modes: [mode], bufferLimit: 4)
      for _ in 0..<10 { loop.run(mode: mode, until: .now) }
      sequence.invalidate()
      keeper.invalidate()
      return sequence
    }
    guard let sequence else { return }
    #expect(sequence.droppedCount == 16)
    let events = try await withWatchdog(timeout: .seconds(30), "activity drain") { () async -> [LoopActivityEvent] in
      var events: [LoopActivityEvent] = []
      for await event in sequence { events.append(event) }
      return events
    }
    #expect(events?.map(\.activity) == [.entry, .exit, .entry, .exit])
    #expect(events.map { zip($0, $0.dropFirst()).allSatisfy { $0.instant <= $1.instant } } == true)
  }

  /// `.burst` hands out every missed tick, one interval apart on the grid, none folded; `.skip`
  /// folds missed ticks into one whose `skipped` counts them, and stays on the grid.
  @Test func missedTickPoliciesKeepTheGridArithmetic() async throws {
    let loop = try RunLoopThread(name: "r6-ticks")
    defer { loop.shutdownAndWait() }
    let interval = Duration.milliseconds(10)
    let burst = loop.timer(every: interval, missedTicks: .burst)
    let skip = loop.timer(every: interval, missedTicks: .skip)
    // About twenty intervals pass while the loop is busy (blocked from a thread of the test's own:
    // a cooperative-pool thread blocked this long starves other tests).
    _ = await execOnNewThread {
      let release = blockLoop(loop)
      usleep(200_000)
      release.open()
      return true
    }
    let outcome = try await withWatchdog(timeout: .seconds(20), "ticks") { () async -> ([LoopTick], [LoopTick]) in
      var burstTicks: [LoopTick] = []
      for await tick in burst {
        burstTicks.append(tick)
        if burstTicks.count == 12 { break }
      }
      var skipTicks: [LoopTick] = []
      for await tick in skip {
        skipTicks.append(tick)
        if skipTicks.count == 3 { break }
      }
      return (burstTicks, skipTicks)
    }
    guard let (burstTicks, skipTicks) = outcome else { return }
    let step = interval.saturatedNanoseconds
    #expect(burstTicks.allSatisfy { $0.skipped == 0 })
    let gaps = zip(burstTicks, burstTicks.dropFirst()).map { $1.scheduled.nanoseconds - $0.scheduled.nanoseconds }
    #expect(gaps.allSatisfy { $0 == step }, "\(gaps)")
    #expect(skipTicks.contains { $0.skipped > 0 }, "no skip tick folded the missed ones: \(skipTicks)")
    for (earlier, later) in zip(skipTicks, skipTicks.dropFirst()) {
      #expect(later.scheduled.nanoseconds - earlier.scheduled.nanoseconds == Int64(earlier.skipped + 1) * step)
    }
  }

  // MARK: - Consumers on the sequence's own loop

  /// A `LoopActor` of the source's loop consumes it and, inside its loop body, runs the loop
  /// nested (in its job: sources fire, no jobs). Elements released during the nested run are
  /// handed to the same consumer afterwards, in order, none twice.
  @Test func aLoopActorConsumerRunsTheLoopNestedAndKeepsEveryElement() async throws {
    let loop = try RunLoopThread(name: "r6-actor-nested")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: Int.self)
    let consumer = R6Consumer(loop: loop)
    _ = sequence.post(0)
    let outcome = try await withWatchdog(timeout: .seconds(20), "actor consumer") {
      await consumer.consume(sequence)
    }
    #expect(outcome?.values == [0, 1, 2, 3])
    #expect(outcome?.nested == .handledSource)
    #expect(outcome?.isolated == true)
  }

  /// An actor of the loop sends into a `.bounded(1)` sequence consumed by a task on the same loop:
  /// the producer suspends and is resumed by the consumer's takes; nothing deadlocks, every value
  /// arrives once, in order.
  ///
  /// The sending task prefers the loop, as `LoopActor`'s doc advises. Without that preference each
  /// resumption of the producer passes through the global pool (the runtime's behaviour with any
  /// custom executor), which a full parallel test run keeps busy: 500 hand-overs then took 20 s or
  /// more and once ran past the watchdog. That form is still checked, for correctness only, with
  /// fewer values.
  @Test(arguments: [true, false])
  func aProducerActorAndAConsumerOnOneLoopHandOverEveryValue(senderPrefersLoop: Bool) async throws {
    let loop = try RunLoopThread(name: "r6-same-loop")
    defer { loop.shutdownAndWait() }
    let count = senderPrefersLoop ? 500 : 50
    let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(1))
    let producer = R6Producer(loop: loop)
    let received = AtomicCounter()
    let consumer = Task(executorPreference: loop) { () async -> [Int] in
      var values: [Int] = []
      for await value in sequence {
        values.append(value)
        received.increment()
      }
      return values
    }
    let sent = TestGate()
    let send: @Sendable () async -> Int = {
      let answers = await producer.send(count, into: sequence)
      sequence.invalidate()
      sent.open()
      return answers
    }
    let sender = senderPrefersLoop ? Task(executorPreference: loop, operation: send) : Task(operation: send)
    let timeout = Duration.seconds(20) * watchdogScale
    if await !execOnNewThread({ sent.wait(timeout: timeout) }) {
      // Stalled: record where everything stands before anything is cancelled, then again after
      // the loop ran a block (a lost wake-up would have been made good by it).
      let before = r6HandOverState(sequence, received: received)
      let ping = await execOnNewThread { (try? loop.performAndWait { 1 }) ?? -1 }
      usleep(200_000)
      let after = r6HandOverState(sequence, received: received)
      Issue.record("stalled: \(before); the loop answered \(ping); then \(after)")
      sender.cancel()
      sequence.invalidate()  // the consumer ends
    }
    let answers = await sender.value
    let values = try await withWatchdog(timeout: .seconds(20), "same-loop consumer") { await consumer.value }
    #expect(answers == count)
    #expect(values == Array(0..<count))
  }

  /// Cancelling the consumer, invalidating the sequence and shutting its loop down, all at once,
  /// while the consumer waits with elements in flight: the consumer ends, no element twice, the
  /// cancel routine runs exactly once, later posts are refused.
  @Test func cancelInvalidateAndShutdownRacingEndOnce() async throws {
    let rounds = 30 * stressFactor
    for round in 0..<rounds {
      let loop = try RunLoopThread(name: "r6-triple")
      let cancels = SequenceCallLog()
      let sequence = loop.sourceSequence(
        of: Int.self, onCancel: { cancelLoop in cancels.record(onLoopThread: cancelLoop.isOnLoopThread) })
      await loopBarrier(loop)  // scheduled
      let consumer = Task(executorPreference: round.isMultiple(of: 2) ? loop : nil) { () async -> [Int] in
        var values: [Int] = []
        for await value in sequence { values.append(value) }
        return values
      }
      for value in 0..<(round % 4) { _ = sequence.post(value) }
      await race([
        { consumer.cancel() },
        { sequence.invalidate() },
        { loop.shutdown() },
        { for value in 100..<200 { _ = sequence.post(value) } },
      ])
      let values = try await withWatchdog(timeout: .seconds(30), "round \(round)") { await consumer.value }
      #expect(values.map { Set($0).count == $0.count } == true, "round \(round): an element twice")
      await execShutdown(loop)
      #expect(cancels.count == 1, "round \(round): cancel ran \(cancels.count) times")
      #expect(cancels.allOnLoopThread)
      #expect(sequence.post(-1) == .terminated)
    }
  }

  // MARK: - RunLoopThread.current

  /// A sequence on a thread's own loop whose thread exits without running it again: the loop
  /// terminates; what was posted is delivered, then the sequence ends; `onCancel` ran once, on
  /// the exiting thread, which was still the loop's thread.
  @Test func aCurrentLoopsSequenceIsDrainedWhenItsThreadExits() async throws {
    let cancels = SequenceCallLog()
    let sequence = try await withWatchdogOnThread { () -> SourceSequence<Int> in
      let loop = RunLoopThread.current
      let sequence = loop.sourceSequence(
        of: Int.self, onCancel: { cancelLoop in cancels.record(onLoopThread: cancelLoop.isOnLoopThread) })
      for value in 0..<3 { _ = sequence.post(value) }
      return sequence
    }
    guard let sequence else { return }
    let values = try await withWatchdog(timeout: .seconds(30), "drained sequence") { () async -> [Int] in
      var values: [Int] = []
      for await value in sequence { values.append(value) }
      return values
    }
    #expect(values == [0, 1, 2])
    #expect(sequence.loop.isShutDown)
    #expect(sequence.post(9) == .terminated)
    await eventually("cancel routine") { cancels.count == 1 }
    #expect(cancels.allOnLoopThread)
  }

  /// `shutdown()` of a current loop from another thread ends its run now; a run started later
  /// ends at once; `shutdownAndWait()` returns at once; `perform` refuses and `performAndWait`
  /// throws afterwards.
  @Test func aCurrentLoopsShutdownEndsItsRunsAndRefusesWork() async throws {
    let loopBox = Guarded<RunLoopThread?>(nil)
    let running = TestGate()
    let outcome = try await withWatchdogOnThread { () -> (Bool, Bool, Bool) in
      let thread = startThread {
        let loop = RunLoopThread.current
        let keeper = InputSource(perform: { _ in })
        loop.add(keeper, to: .default)
        loopBox.withLock { $0 = loop }
        loop.perform { running.open() }
        loop.run(mode: .default)  // until the shutdown
        loop.run(mode: .default)  // after it: ends at once
        keeper.invalidate()
      }
      _ = running.wait(timeout: .seconds(20))
      let loop = loopBox.snapshot!
      loop.shutdownAndWait()  // not the loop's own thread, but it owns none: returns at once
      joinThread(thread)
      let refused = !loop.perform {}
      var threw = false
      do { _ = try loop.performAndWait { 1 } } catch { threw = true }
      return (loop.isShutDown, refused, threw)
    }
    #expect(outcome?.0 == true)
    #expect(outcome?.1 == true)
    #expect(outcome?.2 == true)
  }

  /// "The loop lives as long as its thread": `RunLoopThread.current` answers the same loop on
  /// every call from one thread, after the caller dropped its references, and another loop on
  /// another thread.
  @Test func currentIsOneLoopPerThreadForTheThreadsLife() async throws {
    let outcome = try await withWatchdogOnThread { () -> (Bool, Bool, Bool) in
      let first = R6WeakLoop()
      let identity: ObjectIdentifier = {
        let loop = RunLoopThread.current
        first.loop = loop
        return ObjectIdentifier(loop)
      }()
      let again = ObjectIdentifier(RunLoopThread.current)
      let other = Guarded<ObjectIdentifier?>(nil)
      joinThread(startThread { other.withLock { $0 = ObjectIdentifier(RunLoopThread.current) } })
      return (first.loop != nil, identity == again, other.snapshot != identity)
    }
    #expect(outcome?.0 == true)
    #expect(outcome?.1 == true)
    #expect(outcome?.2 == true)
  }

  /// `performAndWait` on a current loop its thread is not running blocks until the thread runs
  /// it; if the thread exits instead, the drain runs the accepted block and the call returns its
  /// value.
  @Test func performAndWaitOnACurrentLoopReturnsWhenItsThreadExits() async throws {
    let loopBox = Guarded<RunLoopThread?>(nil)
    let made = TestGate()
    let exit = TestGate()
    let result = try await withWatchdogOnThread { () -> (Int, Bool) in
      let thread = startThread {
        loopBox.withLock { $0 = RunLoopThread.current }
        made.open()
        _ = exit.wait(timeout: .seconds(20))
      }
      _ = made.wait(timeout: .seconds(20))
      let loop = loopBox.snapshot!
      loopBox.withLock { $0 = nil }
      let onThread = Guarded(false)
      startThread(detached: true) {
        usleep(100_000)  // let performAndWait queue its block (not asserted on)
        exit.open()
      }
      let value = try loop.performAndWait { () -> Int in
        onThread.withLock { $0 = loop.isOnLoopThread }
        return 42
      }
      joinThread(thread)
      return (value, onThread.snapshot)
    }
    #expect(result?.0 == 42)
    #expect(result?.1 == true)
  }

  // MARK: - Reclamation

  /// A loop dropped without `shutdown()` while sequences of every kind (not iterated) were made on
  /// it and then dropped: the loop is freed, its thread exits, the source sequence's `onCancel`
  /// runs once, and what its closures captured is released.
  @Test func aDroppedLoopWithDroppedSequencesIsReclaimed() async throws {
    let name = "r6-dropped"
    let weakLoop = R6WeakLoop()
    let captured = R6Weak()
    let cancels = SequenceCallLog()
    let pipeEnds = makePipe()
    defer {
      close(pipeEnds.read)
      close(pipeEnds.write)
    }
    try await withWatchdogOnThread {
      let loop = try RunLoopThread(name: name)
      weakLoop.loop = loop
      let object = R6Object()
      captured.object = object
      do {
        let source = loop.sourceSequence(
          of: Int.self,
          onCancel: { cancelLoop in
            withExtendedLifetime(object) {}
            cancels.record(onLoopThread: cancelLoop.isOnLoopThread)
          })
        _ = source.post(1)
        _ = loop.signalSequence()
        _ = loop.timer(every: .milliseconds(1))
        _ = try loop.readiness(of: pipeEnds.read)
        _ = loop.activities()
      }
    }
    waitUntil("the dropped loop to be freed") { weakLoop.loop == nil }
    waitUntil("the dropped loop's thread to exit") { threadCount(named: name) == 0 }
    waitUntil("the cancel routine") { cancels.count == 1 }
    waitUntil("what onCancel captured to be released") { captured.object == nil }
    #expect(cancels.allOnLoopThread)
  }

  /// What a sequence's `onSchedule`/`onCancel` capture is released once the source has left its
  /// loop (`InputSource`: routines are "released once the source is invalidated"), even while the
  /// sequence itself is still held.
  @Test func aSequencesRoutinesAreReleasedAfterInvalidateWhileItIsStillHeld() async throws {
    let loop = try RunLoopThread(name: "r6-routines")
    defer { loop.shutdownAndWait() }
    let captured = R6Weak()
    let cancels = SequenceCallLog()
    let sequence: SourceSequence<Int> = {
      let object = R6Object()
      captured.object = object
      return loop.sourceSequence(
        of: Int.self, onSchedule: { _, _ in withExtendedLifetime(object) {} },
        onCancel: { cancelLoop in
          withExtendedLifetime(object) {}
          cancels.record(onLoopThread: cancelLoop.isOnLoopThread)
        })
    }()
    await loopBarrier(loop)
    #expect(captured.object != nil)
    sequence.invalidate()
    await eventually("cancel") { cancels.count == 1 }
    await loopBarrier(loop)
    await eventually("the routines' captures to be released") { captured.object == nil }
    withExtendedLifetime(sequence) {}
  }

  /// `.dropOldest` keeps "at most `capacity` elements": what it drops does not accumulate while
  /// the consumer takes nothing (the loop runs, releasing each post to the consumer side). The
  /// storage keeps consumed slots until it compacts (64 at a time), so a few dozen dropped
  /// elements may linger; not hundreds.
  @Test func elementsDroppedByDropOldestDoNotAccumulate() async throws {
    let loop = try RunLoopThread(name: "r6-dropped-release")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: R6Object.self, buffering: .dropOldest(2))
    let watchers = (0..<1000).map { _ in R6Weak() }
    for (index, watcher) in watchers.enumerated() {
      let object = R6Object()
      watcher.object = object
      _ = sequence.post(object)
      if index.isMultiple(of: 2) {
        await loopBarrier(loop)  // blocks run before sources in a pass: the source fires in this pass
        await loopBarrier(loop)  // … so after this one, the loop has released it to the consumer side
      } else {
        await loopBarrier(loop)  // here the next post may race the release
      }
    }
    #expect(sequence.droppedCount == 998)
    #expect(sequence.bufferedCount == 2)
    let alive = watchers.filter { $0.object != nil }.count
    #expect(alive <= 2 + 3 * 64, "\(alive) of 1000 posted elements are alive; the buffer holds 2")
    sequence.invalidate()
  }

  /// The same with every post released to the consumer side before the next one (as a loaded
  /// machine ordered them when this test was written): the oldest is then always a released
  /// element, and the released batch, never emptied nor compacted, kept 257 to all 1,000 of them
  /// (depending on how posts and releases interleaved) before it was compacted too.
  @Test func elementsDroppedFromTheReleasedSideDoNotAccumulate() async throws {
    let loop = try RunLoopThread(name: "r6-dropped-released")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: R6Object.self, buffering: .dropOldest(2))
    let watchers = (0..<1000).map { _ in R6Weak() }
    for watcher in watchers {
      let object = R6Object()
      watcher.object = object
      _ = sequence.post(object)
      await loopBarrier(loop)  // blocks run before sources in a pass: the source fires in this pass
      await loopBarrier(loop)  // … so after this one, the loop has released the post
    }
    #expect(sequence.droppedCount == 998)
    #expect(sequence.bufferedCount == 2)
    let alive = watchers.filter { $0.object != nil }.count
    #expect(alive <= 2 + 2 * 64, "\(alive) of 1000 posted elements are alive; the buffer holds 2")
    sequence.invalidate()
  }

  /// "Producers that wait are admitted oldest first": three async senders that wait for room in
  /// turn are delivered in the order they started waiting.
  @Test func waitingSendersAreAdmittedOldestFirst() async throws {
    let loop = try RunLoopThread(name: "r6-fifo")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(1))
    #expect(sequence.post(0) == .enqueued)
    var senders: [Task<SourcePostResult, Never>] = []
    for value in 1...3 {
      senders.append(Task { await sequence.send(value) })
      await eventually("sender \(value) to wait") { sequence.waitingProducerCount == value }
    }
    let values = try await withWatchdog(timeout: .seconds(30), "consumer") { () async -> [Int] in
      var values: [Int] = []
      for await value in sequence {
        values.append(value)
        if values.count == 4 { break }
      }
      return values
    }
    var answers: [SourcePostResult] = []
    for sender in senders { answers.append(await sender.value) }
    #expect(values == [0, 1, 2, 3])
    #expect(answers == [.enqueued, .enqueued, .enqueued])
  }

  /// A readiness sequence whose element waits for a consumer that does not take it pauses the
  /// registration: a descriptor that stays readable does not make the loop spin (a spinning
  /// loop makes thousands of passes in the 100 ms window; a sleeping one a handful).
  @Test func anUntakenReadinessElementDoesNotMakeTheLoopSpin() async throws {
    let loop = try RunLoopThread(name: "r6-no-spin")
    defer { loop.shutdownAndWait() }
    let pipeEnds = makePipe()
    defer {
      close(pipeEnds.read)
      close(pipeEnds.write)
    }
    let readiness = try loop.readiness(of: pipeEnds.read)
    writeByte(pipeEnds.write)  // stays readable: nobody reads it
    await loopBarrier(loop)
    await loopBarrier(loop)
    try await Task.sleep(for: .milliseconds(20))  // the second event pauses the registration (not asserted on)
    let passes = AtomicCounter()
    let observer = LoopObserver(activities: .afterWaiting, repeats: true) { _, _ in passes.increment() }
    loop.add(observer, to: .common)
    try await Task.sleep(for: .milliseconds(100))
    observer.invalidate()
    #expect(passes.current < 50, "the loop woke \(passes.current) times in 100 ms with nothing to do")
    readiness.invalidate()
    let count = try await withWatchdog(timeout: .seconds(30), "readiness drain") { await r6Count(readiness) }
    #expect(count == 1)
  }

  /// A descriptor epoll cannot watch (a regular file), added from another thread: the call throws
  /// `EPERM`, or the failure arrives as an `.error` element and the sequence ends. It never hangs.
  @Test func aDescriptorEpollCannotWatchThrowsOrEndsWithAnError() async throws {
    let loop = try RunLoopThread(name: "r6-eperm")
    defer { loop.shutdownAndWait() }
    let file = open("/proc/self/stat", O_RDONLY | O_CLOEXEC)
    #expect(file >= 0)
    defer { close(file) }
    let sequence: ReadinessSequence
    do {
      sequence = try loop.readiness(of: file)
    } catch {
      #expect(error.errno == EPERM)
      return
    }
    let events = try await withWatchdog(timeout: .seconds(30), "readiness on a file") {
      () async -> [DescriptorEvents] in
      var events: [DescriptorEvents] = []
      for await element in sequence { events.append(element) }
      return events
    }
    #expect(events?.contains { $0.contains(.error) } == true, "\(String(describing: events))")
  }

  /// Breaking out of `for await` in the middle of a batch: the iterator is dropped, the rest of the
  /// batch and the buffer are released, the source leaves its loop.
  @Test func breakingMidBatchReleasesEverything() async throws {
    let loop = try RunLoopThread(name: "r6-break")
    defer { loop.shutdownAndWait() }
    let cancels = SequenceCallLog()
    let sequence = loop.sourceSequence(
      of: R6Object.self, onCancel: { cancelLoop in cancels.record(onLoopThread: cancelLoop.isOnLoopThread) })
    let watchers = (0..<6).map { _ in R6Weak() }
    let release = blockLoop(loop)
    for watcher in watchers.prefix(4) {
      let object = R6Object()
      watcher.object = object
      _ = sequence.post(object)
    }
    release.open()
    await loopBarrier(loop)
    for watcher in watchers.suffix(2) {  // posted, not yet released
      let object = R6Object()
      watcher.object = object
      _ = sequence.post(object)
    }
    let first = try await withWatchdog(timeout: .seconds(30), "break") { () async -> Bool in
      for await object in sequence { return object === watchers[0].object }
      return false
    }
    #expect(first == true)
    await eventually("everything released") { watchers.allSatisfy { $0.object == nil } }
    await eventually("cancel") { cancels.count == 1 }
    #expect(sequence.post(R6Object()) == .terminated)
  }
}

// MARK: - Helpers

/// A class instance whose release a weak reference observes.
final class R6Object: Sendable {}

/// A weak reference to an `R6Object`, shared with closures.
final class R6Weak: @unchecked Sendable {
  // Safety: written once by the test before the object is shared, read by polls afterwards;
  // the runtime zeroes weak references atomically.
  weak var object: R6Object?
}

/// A weak reference to a loop.
final class R6WeakLoop: @unchecked Sendable {
  // Safety: as `R6Weak`.
  weak var loop: RunLoopThread?
}

/// Counts the elements of a sequence until it ends.
func r6Count<S: AsyncSequence & Sendable>(_ sequence: S) async -> Int {
  var count = 0
  var iterator = sequence.makeAsyncIterator()
  while (try? await iterator.next()) != nil { count += 1 }
  return count
}

/// Consumes a source sequence of its own loop and runs the loop nested inside its loop body.
actor R6Consumer: LoopActor {
  nonisolated let loop: RunLoopThread
  init(loop: RunLoopThread) { self.loop = loop }

  func consume(_ sequence: SourceSequence<Int>) async -> (values: [Int], nested: RunLoopRunResult?, isolated: Bool) {
    var values: [Int] = []
    var nested: RunLoopRunResult?
    var isolated = true
    for await value in sequence {
      if !loop.isOnLoopThread { isolated = false }
      values.append(value)
      if value == 0 {
        _ = sequence.post(1)
        _ = sequence.post(2)
        nested = loop.run(mode: .default, until: .now.advanced(by: .seconds(10)), returnAfterSourceHandled: true)
        _ = sequence.post(3)
      }
      if value == 3 { break }
    }
    return (values, nested, isolated)
  }
}

/// Sends into a sequence of its own loop.
/// The hand-over's state for a stall report: what the consumer got, what the machine holds.
private func r6HandOverState(_ sequence: SourceSequence<Int>, received: AtomicCounter) -> String {
  let machine = sequence.lock.withLock { sequence.machine }
  return "received \(received.current), posted \(machine.posted.count), released \(machine.released.count), "
    + "waiting producers \(machine.waitingProducers.count), consumer \(machine.lifecycle.state), "
    + "source signalled \(sequence.source.isSignalled), valid \(sequence.source.isValid)"
}

actor R6Producer: LoopActor {
  nonisolated let loop: RunLoopThread
  init(loop: RunLoopThread) { self.loop = loop }

  func send(_ count: Int, into sequence: SourceSequence<Int>) async -> Int {
    var enqueued = 0
    for value in 0..<count where await sequence.send(value) == .enqueued { enqueued += 1 }
    return enqueued
  }
}

/// Round 6 on the real main thread (the `MainLoopFixture` scenarios named `round6-…`; see
/// `MainLoopProcessTests`).
@Suite("ReviewRound6: the main loop in a real process", .serialized)
struct ReviewRound6MainLoopTests {
  /// Sequences on the main loop, consumed from `@MainActor` code and from a task preferring the
  /// main loop, with producers on plain threads: every element once, in per-producer order, on
  /// the main thread.
  @Test func mainLoopSequencesDeliverEveryElementOnTheMainThread() throws {
    try expectScenarioPasses("round6-main-sequences")
  }

  /// `await runOnMain` from a task preferring a worker loop, and from an actor on it, comes back
  /// to the worker loop.
  @Test func awaitRunOnMainComesBackToTheCallersLoop() throws {
    try expectScenarioPasses("round6-run-on-main-returns")
  }

}
