import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

/// Sequences deliver exactly what was accepted, under every buffering policy.
@Suite(
  "Sequences deliver exactly what was accepted, under every buffering policy", .serialized, .timeLimit(.minutes(10)))
struct SequenceDeliveryTests: SequenceTestModes {
  /// A readiness sequence in `.default` while a timer keeps running a nested other mode (its
  /// registration is silenced there, paused and resumed as the consumer keeps up or not): every
  /// byte written is read, nothing hangs.
  @Test func aReadinessSequenceUnderNestedRunsOfAnotherModeLosesNoReadiness() async throws {
    let loop = try RunLoopThread(name: "seq")
    let ends = makePipe()
    let keepAlive = LoopTimer(after: .seconds(3_600)) { _ in }
    loop.add(keepAlive, to: silencedOtherMode)
    let nesting = LoopTimer(after: .milliseconds(1), repeatingEvery: .milliseconds(1)) { _ in
      loop.run(mode: silencedOtherMode, until: .now.advanced(by: .milliseconds(2)))
    }
    loop.add(nesting, to: .default)
    let sequence = try loop.readiness(of: ends.read, modes: [.default])
    let total = 200
    let writer = startThread {
      for _ in 0..<total {
        writeByte(ends.write)
        usleep(300)
      }
    }
    let read = try await withWatchdog(timeout: .seconds(15), "readiness under nested runs") { () -> Int in
      var read = 0
      for await _ in sequence {
        read += drainDescriptor(ends.read)
        if read >= total { break }
      }
      return read
    }
    joinThread(writer)
    #expect(read == total)
    nesting.invalidate()
    keepAlive.invalidate()
    sequence.invalidate()
    loop.shutdownAndWait()
    Glibc.close(ends.read)
    Glibc.close(ends.write)
  }

  /// Promise (SourceSequence): every accepted element is delivered exactly once and in order per
  /// producer, unless the consumer stops first; `invalidate()` and the shutdown deliver what was
  /// accepted and then end `for await`; `onCancel` runs exactly once. Ending 0: invalidate;
  /// 1: shutdown; 2: the consumer task is cancelled (then delivered ⊆ accepted).
  @Test(arguments: [0, 1, 2])
  func sourceSequenceProducersRacingTheEnd(ending: Int) async throws {
    let failures = try await withWatchdog(timeout: .seconds(60), "sequence producers vs end") { () -> [String] in
      var failures: [String] = []
      for round in 0..<60 {
        let loop = try RunLoopThread(name: "seq")
        let cancels = AtomicCounter()
        let sequence = loop.sourceSequence(
          of: Int.self, modes: [.common, RunLoopMode("seq-x")], onCancel: { _ in cancels.increment() })
        let consumer = Task { () -> [Int] in
          var got: [Int] = []
          for await value in sequence { got.append(value) }
          return got
        }
        let accepted = Guarded<[Int]>([])
        var bodies: [@Sendable () -> Void] = (0..<3).map { producer in
          {
            for index in 0..<40 {
              let value = producer * 1000 + index
              if sequence.post(value) == .enqueued { accepted.withLock { $0.append(value) } }
            }
          }
        }
        switch ending {
        case 0: bodies.append { sequence.invalidate() }
        case 1: bodies.append { loop.shutdownAndWait() }
        default: bodies.append { consumer.cancel() }
        }
        await race(bodies)
        let got = await consumer.value
        let wanted = accepted.snapshot
        if Set(got).count != got.count { failures.append("round \(round): duplicates in \(got.count)") }
        if ending == 2 {
          if !Set(got).isSubset(of: wanted) { failures.append("round \(round): delivered a refused element") }
        } else if got.sorted() != wanted.sorted() {
          failures.append("round \(round): accepted \(wanted.count), delivered \(got.count)")
        }
        for producer in 0..<3 {
          let mine = got.filter { $0 / 1000 == producer }
          if mine != mine.sorted() { failures.append("round \(round): producer \(producer) out of order") }
        }
        if sequence.post(-1) != .terminated { failures.append("round \(round): a post after the end was taken") }
        _ = waitUntil(timeout: .seconds(10), "onCancel") { cancels.current >= 1 }
        loop.shutdownAndWait()
        if cancels.current != 1 { failures.append("round \(round): onCancel ran \(cancels.current) times") }
        if failures.count > 5 { break }
      }
      return failures
    }
    #expect(failures == [])
  }

  /// Every signal from many threads is counted exactly once: the elements (numbers of signals)
  /// sum to the number of `signal()` calls that answered true, once `invalidate()` has let the
  /// consumer drain.
  @Test(arguments: 0..<5) func signalsFromManyThreadsSumExactly(round: Int) async throws {
    let loop = try RunLoopThread(name: "signals-\(round)")
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
    let loop = try RunLoopThread(name: "dropold-\(round)")
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
    let loop = try RunLoopThread(name: "dropnew")
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
    let loop = try RunLoopThread(name: "bounded-\(round)")
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
    let loop = try RunLoopThread(name: "bounded-batch")
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

  /// Elements posted while the loop is busy (not yet released by it) and then `invalidate()` or
  /// the loop's shutdown: everything accepted is still delivered, in order, then nil.
  @Test(arguments: [false, true]) func acceptedButUnreleasedElementsSurviveTheEnd(shutdown: Bool) async throws {
    let loop = try RunLoopThread(name: "unreleased")
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
    let loop = try RunLoopThread(name: "due-tick")
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
    let ticks = try await withWatchdog(timeout: .seconds(20), "ticks after invalidate") { await countElements(timer) }
    if shutdown {
      #expect(ticks.map { $0 <= 1 } == true)
    } else {
      #expect(ticks == 0)
    }
  }

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
    let loop = try RunLoopThread(name: "ticks")
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

  /// A `LoopActor` of the source's loop consumes it and, inside its loop body, runs the loop
  /// nested (in its job: sources fire, no jobs). Elements released during the nested run are
  /// handed to the same consumer afterwards, in order, none twice.
  @Test func aLoopActorConsumerRunsTheLoopNestedAndKeepsEveryElement() async throws {
    let loop = try RunLoopThread(name: "actor-nested")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: Int.self)
    let consumer = NestingConsumerActor(loop: loop)
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
    let loop = try RunLoopThread(name: "same-loop")
    defer { loop.shutdownAndWait() }
    let count = senderPrefersLoop ? 500 : 50
    let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(1))
    let producer = SendingProducerActor(loop: loop)
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
      let before = handOverState(sequence, received: received)
      let ping = await execOnNewThread { (try? loop.performAndWait { 1 }) ?? -1 }
      usleep(200_000)
      let after = handOverState(sequence, received: received)
      Issue.record("stalled: \(before); the loop answered \(ping); then \(after)")
      sender.cancel()
      sequence.invalidate()  // the consumer ends
    }
    let answers = await sender.value
    let values = try await withWatchdog(timeout: .seconds(20), "same-loop consumer") { await consumer.value }
    #expect(answers == count)
    #expect(values == Array(0..<count))
  }

  /// "Producers that wait are admitted oldest first": three async senders that wait for room in
  /// turn are delivered in the order they started waiting.
  @Test func waitingSendersAreAdmittedOldestFirst() async throws {
    let loop = try RunLoopThread(name: "fifo")
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
    let loop = try RunLoopThread(name: "no-spin")
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
    let count = try await withWatchdog(timeout: .seconds(30), "readiness drain") { await countElements(readiness) }
    #expect(count == 1)
  }

  /// A descriptor epoll cannot watch (a regular file), added from another thread: the call throws
  /// `EPERM`, or the failure arrives as an `.error` element and the sequence ends. It never hangs.
  @Test func aDescriptorEpollCannotWatchThrowsOrEndsWithAnError() async throws {
    let loop = try RunLoopThread(name: "eperm")
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
}
