import Glibc
import Testing

@testable import AsyncRunLoop

// MARK: - 3. The shutdown drain's time cap

@Suite("The shutdown drain is capped and still ends everything", .serialized, .timeLimit(.minutes(10)))
struct ShutdownDrainCapTests {
  /// Two threads keep adding and removing custom sources, and two more keep calling an actor on
  /// the loop, while the loop is shut down (the drain runs into its one-second cap). Promised: the
  /// drain ends; every accepted change is applied (each source scheduled here is cancelled here,
  /// once); every actor call completes (jobs left over go to the fallback), and no two jobs of the
  /// actor ever run at once.
  @Test func theCappedDrainLosesNothingAndPairsEverySchedule() async throws {
    let loop = try RunLoopThread(name: "d1")
    let actor = NestedRunActor(loop: loop)
    let pairs = PairLog()
    let stop = Guarded(false)
    let calls = AtomicCounter()
    let returned = AtomicCounter()
    let outcome = try await withWatchdog(timeout: .seconds(60), "capped drain") { () -> Bool in
      let flooders = (0..<2).map { _ in
        startThread {
          while !stop.snapshot {
            let source = InputSource(
              schedule: { _, loop, _ in pairs.schedule(loop) }, cancel: { _, loop in pairs.cancel(loop) },
              perform: { _ in })
            loop.add(source, to: drainModeX)
            loop.addModeToCommonModes(drainModeM)
            loop.remove(source, from: drainModeX)
          }
        }
      }
      let callers = (0..<2).map { _ in
        Task.detached {
          while !stop.snapshot {
            calls.increment()
            await actor.call()
            returned.increment()
          }
        }
      }
      let shutDown = TestGate()
      _ = await execOnNewThread {
        usleep(50_000)
        loop.shutdownAndWait()
        shutDown.open()
      }
      _ = await execOnNewThread { usleep(100_000) }
      stop.withLock { $0 = true }
      for flooder in flooders { await execOnNewThread { joinThread(flooder) } }
      for caller in callers { await caller.value }
      return shutDown.wait(timeout: .zero)
    }
    #expect(outcome == true)
    #expect(pairs.unpaired == [])
    #expect(calls.current == returned.current)
    #expect(actor.overlap.maximum <= 1, "two jobs of the actor ran at once")
  }
}

extension ShutdownDrainCapTests {
  /// Two threads flood the loop with changes (the drain runs into its one-second cap) while a
  /// third creates tasks preferring the loop, numbered in creation order, before and after the
  /// shutdown. Promised: the drain hands the remaining jobs, in order, to the fallback, and later
  /// jobs queue behind them: every task's first job runs, in creation order.
  @Test func theCappedDrainHandsJobsToTheFallbackInOrder() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(60), "ordered capped drain") {
      () throws -> (order: [Int], created: Int) in
      let loop = try RunLoopThread(name: "d2")
      let stop = Guarded(false)
      let log = Guarded<[Int]>([])
      let flooders = (0..<2).map { _ in
        startThread {
          while !stop.snapshot {
            for _ in 0..<64 { loop.addModeToCommonModes(drainModeM) }
          }
        }
      }
      let created = Guarded(0)
      let producer = startThread {
        var next = 0
        while !stop.snapshot {
          let number = next
          _ = Task(executorPreference: loop) { log.withLock { $0.append(number) } }
          next += 1
          if next % 16 == 0 { usleep(1000) }
        }
        created.withLock { $0 = next }
      }
      usleep(50_000)
      loop.shutdownAndWait()
      usleep(100_000)
      stop.withLock { $0 = true }
      joinThread(producer)
      for flooder in flooders { joinThread(flooder) }
      let total = created.snapshot
      _ = waitUntil(timeout: .seconds(20), "every task ran") { log.snapshot.count >= total }
      return (log.snapshot, total)
    }
    guard let outcome else { return }
    #expect(outcome.order.count == outcome.created)
    let firstOut = zip(outcome.order, outcome.order.dropFirst()).first { $0.0 > $0.1 }
    #expect(firstOut == nil, "jobs ran out of order: \(String(describing: firstOut))")
  }
}

extension ShutdownDrainCapTests {
  /// Two threads keep adding and removing custom sources (each add runs a schedule routine on the
  /// loop thread, each removal a cancel routine: applying costs more than sending) when the loop
  /// is shut down. Promised (`drainForShutdown`): after `shutdownDrainNanoseconds` (1 s) the drain
  /// refuses what comes later and terminates: `shutdownAndWait()` returns within a few seconds
  /// (here: 10 s times the watchdog scale) while the flood goes on.
  @Test
  func theDrainCapHoldsWhenApplyingCostsMoreThanSending() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(90), "drain under a costly flood") {
      () throws -> (seconds: Double, sent: Int) in
      let loop = try RunLoopThread(name: "d3")
      let stop = Guarded(false)
      let sent = AtomicCounter()
      let work = AtomicCounter()
      let flooders = (0..<2).map { _ in
        startThread {
          while !stop.snapshot {
            let source = InputSource(
              schedule: { _, _, _ in for _ in 0..<200 { _ = work.increment() } },
              cancel: { _, _ in for _ in 0..<200 { _ = work.increment() } }, perform: { _ in })
            loop.add(source, to: drainModeX)
            loop.remove(source, from: drainModeX)
            _ = sent.increment()
          }
        }
      }
      waitUntil("the flood started") { sent.current > 1000 }
      let start = ContinuousClock.now
      let returned = TestGate()
      startThread(detached: true) {
        loop.shutdownAndWait()
        returned.open()
      }
      _ = returned.wait(timeout: .seconds(15 * watchdogScale))
      let elapsed = ContinuousClock.now - start
      stop.withLock { $0 = true }
      for flooder in flooders { joinThread(flooder) }
      let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
      return (seconds, sent.current)
    }
    guard let outcome else { return }
    #expect(
      outcome.seconds < Double(10 * watchdogScale),
      "shutdownAndWait() took \(outcome.seconds) s during a flood of \(outcome.sent) add/remove pairs")
  }
}

@Suite("The drain cap hands leftovers on and ends", .serialized, .timeLimit(.minutes(10)))
struct DrainCapTests {
  /// While the drain detaches a source C (its cancel routine holds the first round), another
  /// thread adds source A (its schedule runs in the next round) and source B, whose schedule
  /// routine, right after A's, holds the loop past the drain's one-second cap. Meanwhile that
  /// thread invalidates A, still valid and on the loop (the detach is refused: the cap has
  /// passed), and adds a fresh source D (refused). Promised (`detachEveryMember`, `LoopInbox`): a
  /// refused invalidate still leaves the member detached with its cancel run once (every schedule
  /// paired); a refused add invalidates the member (D); the drain ends.
  @Test
  func aRefusedInvalidateAfterTheCapStillRunsCancelOnce() async throws {
    let loop = try RunLoopThread(name: "d1")
    let pairs = PairLog()
    let log = EventLog()
    let draining = TestGate()
    let added = TestGate()
    let aScheduled = TestGate()
    let releaseB = TestGate()
    let started = Guarded<ContinuousClock.Instant?>(nil)
    let c = InputSource(
      schedule: { _, _, _ in },
      cancel: { _, _ in
        started.withLock { $0 = ContinuousClock.now }
        draining.open()
        added.wait(timeout: .seconds(20))
      }, perform: { _ in })
    loop.add(c, to: .default)
    let a = InputSource(
      schedule: { _, loop, _ in
        pairs.schedule(loop)
        aScheduled.open()
      }, cancel: { _, loop in pairs.cancel(loop) }, perform: { _ in })
    let b = InputSource(
      schedule: { _, loop, _ in
        pairs.schedule(loop)
        releaseB.wait(timeout: .seconds(20))
      }, cancel: { _, loop in pairs.cancel(loop) }, perform: { _ in })
    let d = InputSource(schedule: { _, _, _ in log.add("d scheduled") }, cancel: { _, _ in }, perform: { _ in })
    let outcome = try await withWatchdog(timeout: .seconds(60), "refused invalidate") { () -> Bool in
      let shutDown = TestGate()
      let shutter = startThread {
        loop.shutdownAndWait()
        shutDown.open()
      }
      let adder = startThread {
        defer {
          added.open()
          releaseB.open()
        }
        guard draining.wait(timeout: .seconds(20)), let start = started.snapshot else {
          log.add("never drained")
          return
        }
        loop.add(a, to: .default)
        loop.add(b, to: .default)
        added.open()
        guard aScheduled.wait(timeout: .seconds(20)) else {
          log.add("a never scheduled")
          return
        }
        while ContinuousClock.now < start.advanced(by: .milliseconds(1300)) { usleep(10_000) }
        if !a.isValid { log.add("a invalidated before the cap") }
        a.invalidate()
        loop.add(d, to: .default)
        log.add(d.isValid ? "d valid" : "d invalid")
      }
      await execOnNewThread { joinThread(adder) }
      await execOnNewThread { joinThread(shutter) }
      return shutDown.wait(timeout: .zero)
    }
    #expect(outcome == true)
    #expect(log.snapshot == ["d invalid"])
    #expect(pairs.unpaired == [], "a refused invalidate lost the cancel of a scheduled source")
  }
}

extension DrainCapTests {
  /// A command source with three commands posted, added to a loop after the drain's cap (the add
  /// is refused), and the same on a terminated loop. Promised ("Adding anything to a loop that
  /// has terminated invalidates it at once"; a refused add invalidates the member): the source is
  /// invalidated, and its accepted commands are delivered as they are on a terminated loop.
  @Test func aCommandSourceAddedAfterTheCapIsInvalidatedLikeOnATerminatedLoop() async throws {
    let afterCap = Guarded(0)
    let terminated = Guarded(0)
    let valid = Guarded<[Bool]>([])
    let outcome = try await withWatchdog(timeout: .seconds(60), "command source after the cap") { () -> Bool in
      let loop = try RunLoopThread(name: "d2")
      let ended = await execOnNewThread {
        withDrainPastTheCap(loop) {
          let commands = CommandSource<Int> { _ in afterCap.withLock { $0 += 1 } }
          for command in 0..<3 { _ = commands.post(command) }
          loop.add(commands.source, to: .default)
          valid.withLock { $0.append(commands.source.isValid) }
        }
      }
      let commands = CommandSource<Int> { _ in terminated.withLock { $0 += 1 } }
      for command in 0..<3 { _ = commands.post(command) }
      loop.add(commands.source, to: .default)
      valid.withLock { $0.append(commands.source.isValid) }
      return ended
    }
    #expect(outcome == true)
    #expect(valid.snapshot == [false, false])
    #expect(afterCap.snapshot == terminated.snapshot)
  }

  /// A signal sequence and a source sequence made on a loop after the drain's cap (their adds are
  /// refused). Promised: each sequence ends (its consumer does not hang); what the source sequence
  /// accepted is delivered before it ends or the post is refused.
  @Test func sequencesMadeAfterTheCapEnd() async throws {
    let loop = try RunLoopThread(name: "d3")
    let made = Guarded<(SignalSequence, SourceSequence<Int>, SourcePostResult)?>(nil)
    let ended = try await withWatchdog(timeout: .seconds(60), "sequences after the cap") { () -> Bool in
      await execOnNewThread {
        withDrainPastTheCap(loop) {
          let signals = loop.signalSequence()
          _ = signals.signal()
          let elements = loop.sourceSequence(of: Int.self)
          let posted = elements.post(7)
          made.withLock { $0 = (signals, elements, posted) }
        }
      }
    }
    #expect(ended == true)
    guard let (signals, elements, posted) = made.snapshot else {
      Issue.record("the drain never passed its cap")
      return
    }
    let counts = try await withWatchdog(timeout: .seconds(20), "consumers") { () -> (Int, [Int]) in
      var signalled = 0
      for await _ in signals { signalled += 1 }
      var received: [Int] = []
      for await element in elements { received.append(element) }
      return (signalled, received)
    }
    guard let counts else { return }
    #expect(counts.0 <= 1)
    if posted == .enqueued { #expect(counts.1 == [7]) } else { #expect(counts.1 == []) }
  }
}
