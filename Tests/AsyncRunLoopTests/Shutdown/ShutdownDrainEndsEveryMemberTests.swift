import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

/// The shutdown drain applies every accepted change, pairs every routine and releases every block.
@Suite(
  "The shutdown drain applies every accepted change, pairs every routine and releases every block", .serialized,
  .timeLimit(.minutes(10)))
struct ShutdownDrainEndsEveryMemberTests: PassTestModes {
  /// Concurrent `shutdown()`/`shutdownAndWait()` from many threads, from inside a job and from a
  /// block the drain runs: all return, and every accepted job ran.
  @Test func shutdownFromManyThreadsJobsAndDrainedBlocksAllReturn() async throws {
    let loop = try RunLoopThread(name: "shutdown-everywhere")
    let overlap = JobOverlapCounter()
    let worker = SerialCheckingWorker(loop: loop, overlap: overlap)
    let drainedBlockRan = Locked(false)
    loop.perform(inModes: ["never-run"]) {
      loop.shutdownAndWait()  // on the loop thread, during the drain: only (re)starts the shutdown
      drainedBlockRan.withLock { $0 = true }
    }
    let source = InputSource(cancel: { _, _ in loop.shutdownAndWait() }) { _ in }
    loop.add(source)
    let finished = try await withWatchdog(timeout: .seconds(30), "shutdowns everywhere") { () async -> Int in
      async let calls: Void = execConcurrently(tasks: 4, times: 100) { await worker.poke() }
      async let fromJob: Void = withTaskExecutorPreference(loop) { loop.shutdownAndWait() }
      await execOnNewThread {
        race([
          { loop.shutdownAndWait() }, { loop.shutdown() }, { loop.shutdownAndWait() }, { loop.shutdownAndWait() },
        ])
      }
      await fromJob
      await calls
      return await worker.calls
    }
    #expect(finished == 400)
    #expect(drainedBlockRan.withLock { $0 })
    #expect(overlap.maximum == 1)
    #expect(loop.isShutDown)
  }

  /// Shutdown (`shutdown()`, `shutdownAndWait()`, or dropping the last handle) racing posts,
  /// a move (remove from the last mode, add back) and an invalidation: schedule and cancel pair,
  /// every accepted command is delivered at most once and the undelivered ones are still counted
  /// by `pendingCount`, or by `droppedCount` once the source is invalidated (the documented drop:
  /// the loop it was last on terminated), and the source,
  /// its routines and what they capture are freed.
  @Test func shutdownRacingMovesPostsAndInvalidation() async throws {
    final class Sentinel: Sendable {}
    let outcome = try await withWatchdogOnThread(timeout: .seconds(60)) { () -> [String] in
      var problems: [String] = []
      repeatRounds(150) { round in
        let log = PairLog()
        let delivered = Guarded<[Int: Int]>([:])
        let accepted = AtomicCounter()
        weak var weakSentinel: Sentinel?
        weak var weakSource: InputSource?
        var pendingAtEnd = 0
        do {
          guard let loop = try? RunLoopThread(name: "rrec-shut") else { return }
          let sentinel = Sentinel()
          weakSentinel = sentinel
          let commands = CommandSource<Int>(
            schedule: { _, loop, _ in log.schedule(loop) },
            cancel: { _, loop in log.cancel(loop) },
            handler: { value in
              withExtendedLifetime(sentinel) {}
              delivered.withLock { $0[value, default: 0] += 1 }
            })
          weakSource = commands.source
          loop.add(commands.source, to: .common)
          let timer = LoopTimer(after: .zero, repeatingEvery: .milliseconds(1)) { _ in withExtendedLifetime(sentinel) {}
          }
          loop.add(timer, to: .default)
          race([
            { for index in 0..<30 where commands.post(index) { accepted.increment() } },
            {
              loop.remove(commands.source, from: .common)
              loop.add(commands.source, to: .default)
              loop.remove(timer, from: .default)
              loop.add(timer, to: RunLoopMode("rrec-shut-m"))
            },
            {
              switch round % 3 {
              case 0: loop.shutdown()
              case 1: loop.shutdownAndWait()
              default: break  // the handle is dropped below
              }
            },
            { if round % 4 == 0 { commands.source.invalidate() } },
          ])
          if round % 3 == 1 { loop.shutdownAndWait() }
          if round % 3 == 0 { loop.shutdownAndWait() }
          // A terminated loop's members are final now; a dropped handle's loop delivers the rest.
          if round % 3 != 2 { pendingAtEnd = commands.pendingCount + commands.droppedCount }
        }
        // The dropped handle's loop drains on its own thread: wait for the sentinel to go.
        _ = waitUntil(timeout: .seconds(5), "the members are freed") { weakSentinel == nil && weakSource == nil }
        let got = delivered.snapshot
        if !log.unpaired.isEmpty { problems.append("round \(round): \(log.unpaired)") }
        if got.values.contains(where: { $0 != 1 }) { problems.append("round \(round): a command delivered twice") }
        if got.count + pendingAtEnd != accepted.current {
          problems.append(
            "round \(round): accepted \(accepted.current), delivered \(got.count), pending \(pendingAtEnd)")
        }
        if weakSentinel != nil || weakSource != nil { problems.append("round \(round): leaked") }
      }
      return problems
    }
    #expect(outcome == [])
  }

  /// A task that yields forever keeps an owned loop's shutdown drain busy while another thread
  /// keeps adding sources: the drain ends (at its cap), the task goes on on the fallback queue,
  /// and every source ends invalidated with its schedule and cancel paired (an add refused by the
  /// cap or after termination invalidates the source visibly), none left valid on the dead loop.
  @Test func aDrainKeptBusyEndsAndRefusesAddsVisibly() async throws {
    let loop = try RunLoopThread(name: "cap")
    let spins = AtomicCounter()
    let spinner = Task(executorPreference: loop) {
      while !Task.isCancelled {
        spins.increment()
        await Task.yield()
      }
    }
    let pairs = PairLog()
    let sources = Guarded<[InputSource]>([])
    let stopAdding = Guarded(false)
    // The adder keeps pace with the loop: it adds the next source once the loop scheduled the
    // last one or refused it (or after 2 ms), so the adds race the drain without piling up a
    // backlog that a slow loop (a sanitizer, a loaded machine) could never work off; the
    // spinner's yields queue behind the changes sent before them.
    let adder = startThread {
      var previous: (source: InputSource, scheduled: AtomicCounter)?
      while !stopAdding.snapshot {
        if let (source, scheduled) = previous {
          var waited = 0
          while scheduled.current == 0 && source.isValid && waited < 40 {
            usleep(50)
            waited += 1
          }
        }
        let scheduled = AtomicCounter()
        let source = InputSource(
          schedule: { _, loop, _ in
            scheduled.increment()
            pairs.schedule(loop)
          }, cancel: { _, loop in pairs.cancel(loop) }, perform: { _ in })
        sources.withLock { $0.append(source) }
        loop.add(source, to: .default)
        source.signal()
        previous = (source, scheduled)
        usleep(50)
      }
    }
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "capped drain") { () -> (Bool, Int) in
      waitUntil(timeout: .seconds(5), "the spinner running") { spins.current > 100 }
      usleep(5_000)
      loop.shutdownAndWait()
      let refusedBlock = (try? loop.performAndWait { 1 }) == nil
      let atShutdown = spins.current
      waitUntil(timeout: .seconds(5), "the spinner on the fallback") { spins.current > atShutdown + 100 }
      usleep(2_000)
      stopAdding.withLock { $0 = true }
      return (refusedBlock, atShutdown)
    }
    joinThread(adder)
    spinner.cancel()
    _ = try await withWatchdog(timeout: .seconds(30), "the spinner ends") { await spinner.value }
    #expect(outcome?.0 == true)
    let stillValid = sources.snapshot.filter(\.isValid).count
    #expect(stillValid == 0, "sources left valid on a terminated loop")
    #expect(pairs.unpaired == [])
  }

  /// A block refused by `perform` (loop shut down) or by `performAndWait` (shut down) is
  /// released, not kept.
  @Test func refusedBlocksAreReleased() async throws {
    let loop = try RunLoopThread(name: "refused")
    await execShutdown(loop)
    let deaths = AtomicCounter()
    let ran = AtomicCounter()
    do {
      let canary = ReleaseCanary(deaths)
      #expect(
        !loop.perform {
          canary.touch()
          ran.increment()
        })
    }
    do {
      let canary = ReleaseCanary(deaths)
      let outcome = await execOnNewThread { () -> Bool in
        do {
          try loop.performAndWait {
            canary.touch()
            ran.increment()
          }
          return false
        } catch {
          return (error as? RunLoopError) == .shutDown(loop: loop.name)
        }
      }
      #expect(outcome)
    }
    #expect(await eventuallyWithin { deaths.current == 2 }, "released \(deaths.current) of 2")
    #expect(ran.current == 0)
  }

  /// A block performed in a mode the loop never runs, then the loop shut down (or dropped): it is
  /// either run or dropped by the drain ("a block performed in no mode would never run, only be
  /// dropped at shutdown"), and in both cases released.
  @Test(arguments: [false, true])
  func aBlockForAModeNeverRunIsReleasedAtShutdown(dropLoop: Bool) async throws {
    var loop: RunLoopThread? = try RunLoopThread(name: "never")
    weak let weakPoller = loop?.shared.poller
    let deaths = AtomicCounter()
    do {
      let canary = ReleaseCanary(deaths)
      #expect(loop?.perform(inModes: [releaseNeverMode]) { canary.touch() } == true)
    }
    _ = try await withWatchdogOnThread(timeout: .seconds(20), "a round trip") { [loop] in
      try loop!.performAndWait {}
    }
    #expect(deaths.current == 0)
    if dropLoop {
      loop = nil
    } else if let loop {
      await execShutdown(loop)
    }
    #expect(await eventuallyWithin { deaths.current == 1 }, "the block of a never-run mode was kept")
    if dropLoop { #expect(await eventuallyWithin { weakPoller == nil }) }
  }

  /// A `performAndWait` for a mode the loop never runs blocks its caller; the loop's shutdown
  /// must release it (with the block's result or `RunLoopError.shutDown`), not leave it hanging.
  @Test func aPerformAndWaitForAModeNeverRunReturnsAtShutdown() async throws {
    let loop = try RunLoopThread(name: "never-wait")
    let deaths = AtomicCounter()
    let started = TestGate()
    let canary = Guarded<ReleaseCanary?>(ReleaseCanary(deaths))
    let waiter = Task {
      try await withWatchdogOnThread(timeout: .seconds(30), "performAndWait in a never-run mode") { () -> String in
        started.open()
        let captured = canary.withLock { value in
          defer { value = nil }
          return value!
        }
        do {
          try loop.performAndWait(inModes: [releaseNeverMode]) { captured.touch() }
          return "ran"
        } catch {
          return "\(error)"
        }
      }
    }
    _ = await execOnNewThread { started.wait(timeout: .seconds(10)) }
    // Make sure the block is in the loop's inbox before the shutdown.
    _ = try await withWatchdogOnThread(timeout: .seconds(20), "a round trip") { try loop.performAndWait {} }
    await execShutdown(loop)
    let outcome = try await waiter.value
    #expect(outcome == "ran" || outcome == "\(RunLoopError.shutDown(loop: loop.name))", "\(outcome ?? "hung")")
    #expect(await eventuallyWithin { deaths.current == 1 })
  }

  /// `shutdown()` sent behind a held burst of 1,000 adds and 300 removals: the drain applies every
  /// accepted change, so each source has exactly one schedule and one cancel, and a block sent
  /// before the shutdown runs once. After the drain an add invalidates its member at once (no
  /// routine runs) and a block is refused.
  @Test func shutdownBehindABurstPairsEveryScheduleWithOneCancel() throws {
    let outcome = try withWatchdogSync(timeout: .seconds(20), "shutdown behind a burst") { () -> [String] in
      let loop = try RunLoopThread(name: "shutdown")
      let sources = (0..<1_000).map { _ in RoutineCountingSource() }
      let blockRuns = AtomicCounter()
      burstBehindHeldLoop(sources.map(\.source), on: loop) {
        for counted in sources[700...] { loop.remove(counted.source) }
        loop.perform { blockRuns.increment() }
        loop.shutdown()
      }
      loop.shutdownAndWait()
      var found = miscounted(sources, schedules: 1, cancels: 1)
      if blockRuns.current != 1 { found.append("block ran \(blockRuns.current) times") }
      let late = RoutineCountingSource()
      loop.add(late.source)
      if late.source.isValid { found.append("a late add left its source valid") }
      if late.schedules.current != 0 || late.cancels.current != 0 { found.append("late source's routines ran") }
      let timer = LoopTimer(after: .zero) { _ in }
      loop.add(timer)
      if timer.isValid { found.append("a late timer add left it valid") }
      if loop.perform({ blockRuns.increment() }) { found.append("a late block was accepted") }
      return found
    }
    #expect(outcome == [])
  }

  /// A schedule routine in the middle of a held burst of 1,000 adds shuts its own loop down: every
  /// add is still applied and detached, exactly one cancel per schedule, and the block sent after
  /// the burst runs once.
  @Test func aScheduleRoutineShuttingTheLoopDownMidBurst() throws {
    let outcome = try withWatchdogSync(timeout: .seconds(20), "shutdown mid-burst") { () -> [String] in
      let loop = try RunLoopThread(name: "shutdown-inside")
      let sources = (0..<1_000).map { index in
        RoutineCountingSource(index: index) { index, loop in if index == 100 { loop.shutdown() } }
      }
      let blockRuns = AtomicCounter()
      burstBehindHeldLoop(sources.map(\.source), on: loop) {
        loop.perform { blockRuns.increment() }
      }
      loop.shutdownAndWait()
      var found = miscounted(sources, schedules: 1, cancels: 1)
      if blockRuns.current != 1 { found.append("block ran \(blockRuns.current) times") }
      return found
    }
    #expect(outcome == [])
  }

  /// A schedule routine in the middle of a held burst of 1,000 adds runs the loop nested without a
  /// time limit; another thread then calls `shutdownAndWait()`: the nested run ends as stopped, the
  /// drain applies the rest of the burst, and each source has exactly one schedule and one cancel.
  @Test func shutdownAndWaitEndsANestedRunInsideAScheduleRoutine() throws {
    let outcome = try withWatchdogSync(timeout: .seconds(20), "shutdown of a nested run") {
      () -> (results: [String], miscounted: [String]) in
      let loop = try RunLoopThread(name: "shutdown-nested")
      let inNested = TestGate()
      let results = Guarded<[String]>([])
      let sources = (0..<1_000).map { index in
        RoutineCountingSource(index: index) { index, loop in
          guard index == 100 else { return }
          let keepAlive = LoopTimer(after: .seconds(3_600)) { _ in }
          loop.add(keepAlive)
          let observer = LoopObserver(activities: .beforeTimers, repeats: false) { _, _ in inNested.open() }
          loop.add(observer)
          let ended = loop.run()
          results.withLock { $0.append("\(ended)") }
          keepAlive.invalidate()
        }
      }
      burstBehindHeldLoop(sources.map(\.source), on: loop) {}
      _ = inNested.wait(timeout: .seconds(10))
      loop.shutdownAndWait()
      return (results.snapshot, miscounted(sources, schedules: 1, cancels: 1))
    }
    #expect(outcome?.results == ["\(RunLoopRunResult.stopped)"])
    #expect(outcome?.miscounted == [])
  }

  /// The shutdown drain detaches 300 sources whose cancel routines run the loop nested one pass and
  /// add a fresh source on the loop thread, while another thread keeps adding 1,000 more (a burst
  /// that arrives during the drain): every source ends with schedule and cancel paired, once each,
  /// or, refused, invalid with neither; nothing hangs.
  @Test func aDrainWhoseCancelRoutinesRunNestedWhileAddsArrive() throws {
    let outcome = try withWatchdogSync(timeout: .seconds(20), "drain churn") { () -> [String] in
      let loop = try RunLoopThread(name: "drain-churn")
      let fresh = (0..<300).map { _ in RoutineCountingSource() }
      let racing = (0..<1_000).map { _ in RoutineCountingSource() }
      let nestedResults = Guarded<[RunLoopRunResult]>([])
      let cancels = AtomicCounter()
      let schedules = AtomicCounter()
      let first = (0..<300).map { index in
        InputSource(
          schedule: { _, _, _ in schedules.increment() },
          cancel: { _, loop in
            cancels.increment()
            let ended = loop.run(mode: .default, until: .now)
            nestedResults.withLock { $0.append(ended) }
            loop.add(fresh[index].source)
          }, perform: { _ in })
      }
      for source in first { loop.add(source) }
      try loop.performAndWait {}
      let started = TestGate()
      let adder = startThread {
        started.open()
        for counted in racing { loop.add(counted.source) }
      }
      _ = started.wait(timeout: .seconds(10))
      loop.shutdownAndWait()
      joinThread(adder)
      var found: [String] = []
      if schedules.current != 300 || cancels.current != 300 {
        found.append("first: schedule \(schedules.current), cancel \(cancels.current)")
      }
      if nestedResults.snapshot.contains(where: { $0 != .stopped }) { found.append("nested \(nestedResults.snapshot)") }
      for (group, sources) in [("fresh", fresh), ("racing", racing)] {
        for (index, counted) in sources.enumerated() {
          let pair = (counted.schedules.current, counted.cancels.current)
          if pair != (0, 0) && pair != (1, 1) { found.append("\(group) \(index): \(pair)") }
          if pair == (0, 0) && counted.source.isValid { found.append("\(group) \(index): valid, never scheduled") }
        }
      }
      return Array(found.prefix(10))
    }
    #expect(outcome == [])
  }

  /// `shutdownAndWait()` from one thread races the release of a loop held with a burst of 1,000
  /// adds and removals waiting, and another thread adding more: nothing hangs, and every source
  /// that was scheduled is cancelled exactly once (a late add is either applied and detached or
  /// invalidated at once, never left half done).
  @Test func shutdownAndWaitRacingTheReleaseOfABurst() async throws {
    let failures = try await failuresOverRounds(10, timeout: .seconds(30), "shutdown races") { round, failures in
      guard let loop = try? RunLoopThread(name: "shutdown-race") else { return failures.append("no loop") }
      let sources = (0..<1_000).map { _ in RoutineCountingSource() }
      let late = (0..<300).map { _ in RoutineCountingSource() }
      let release = blockLoop(loop)
      for counted in sources { loop.add(counted.source) }
      for counted in sources[500...] { loop.remove(counted.source) }
      race([
        { loop.shutdownAndWait() },
        { release.open() },
        { for counted in late { loop.add(counted.source) } },
      ])
      loop.shutdownAndWait()
      let counts = miscounted(sources, schedules: 1, cancels: 1)
      if !counts.isEmpty { failures.append("round \(round): \(counts.prefix(3))") }
      for (index, counted) in late.enumerated() {
        let pair = (counted.schedules.current, counted.cancels.current)
        if pair != (0, 0) && pair != (1, 1) { failures.append("round \(round): late \(index): \(pair)") }
        if pair == (0, 0) && counted.source.isValid { failures.append("round \(round): late \(index) neither") }
      }
    }
    #expect(failures == [])
  }

  /// Promise (Shutdown; RunLoopThread+Members): the shutdown invalidates every member, and adding
  /// anything to a loop that has terminated invalidates it at once. Members added from other
  /// threads while the loop shuts down and drains therefore all end invalid, with cancel exactly
  /// once per schedule; a command posted to one of them is delivered or counted as dropped.
  @Test func membersAddedFromOtherThreadsDuringTheDrainAllEnd() async throws {
    let failures = try await failuresOverRounds(100, budget: .seconds(3), "adds vs drain") { round, failures in
      guard let loop = try? RunLoopThread(name: "drainadd") else { return failures.append("no loop") }
      let schedules = AtomicCounter()
      let cancels = AtomicCounter()
      let ledger = CommandDeliveryLedger()
      let made = Guarded<[CommandSource<Int>]>([])
      let timers = Guarded<[LoopTimer]>([])
      let adder: @Sendable (Int) -> Void = { producer in
        for index in 0..<20 {
          let commands = CommandSource<Int>(
            schedule: { _, _, _ in schedules.increment() }, cancel: { _, _ in cancels.increment() }
          ) { ledger.deliver($0) }
          let command = producer * 1000 + index
          if commands.post(command) { ledger.accept(command) }
          loop.add(commands.source, to: index % 2 == 0 ? .common : RunLoopMode("da"))
          let timer = LoopTimer(after: .seconds(3_600)) { _ in }
          loop.add(timer, to: .common)
          made.withLock { $0.append(commands) }
          timers.withLock { $0.append(timer) }
        }
      }
      race([{ adder(0) }, { adder(1) }, { loop.shutdownAndWait() }])
      loop.shutdownAndWait()
      let sources = made.snapshot
      let stillValid = sources.filter { $0.source.isValid }.count + timers.snapshot.filter { $0.isValid }.count
      let unaccounted = sources.reduce(0) { $0 + $1.pendingCount + $1.droppedCount }
      if stillValid != 0 { failures.append("round \(round): \(stillValid) members still valid") }
      if sources.contains(where: { $0.pendingCount != 0 }) { failures.append("round \(round): commands still pending") }
      // One command per source: no order across sources is promised.
      for problem in ledger.problems(unaccounted: unaccounted, checkOrder: false) {
        failures.append("round \(round): \(problem)")
      }
      if schedules.current != cancels.current {
        failures.append("round \(round): schedules \(schedules.current), cancels \(cancels.current)")
      }
    }
    #expect(failures == [])
  }

  /// The same from the loop's own callouts during the drain: a cancel routine, an observer's exit
  /// callout, and a performed block that only the drain runs each add a fresh source and a timer
  /// sequence; once the shutdown returned, the source is invalid with cancel once per schedule and
  /// the sequence's `for await` has ended.
  @Test(arguments: ["cancel", "exit", "block"])
  func membersAddedFromCalloutsDuringTheDrainAllEnd(kind: String) async throws {
    let failures = try await withWatchdog(timeout: .seconds(60), "adds from drain callouts (\(kind))") {
      () -> [String] in
      var failures: [String] = []
      for round in 0..<40 {
        let loop = try RunLoopThread(name: "drainco")
        let schedules = AtomicCounter()
        let cancels = AtomicCounter()
        let late = Guarded<(InputSource, TimerSequence)?>(nil)
        let addLate: @Sendable () -> Void = {
          guard late.snapshot == nil else { return }
          let source = InputSource(
            schedule: { _, _, _ in schedules.increment() }, cancel: { _, _ in cancels.increment() }
          ) { _ in }
          loop.add(source, to: .common)
          let ticks = loop.timer(every: .milliseconds(1))
          late.withLock { $0 = (source, ticks) }
        }
        var members: [AnyObject] = []
        switch kind {
        case "cancel":
          let trigger = InputSource(cancel: { _, _ in addLate() }) { _ in }
          loop.add(trigger, to: .common)
          members.append(trigger)
        case "exit":
          let observer = LoopObserver(activities: .exit) { _, _ in if loop.isShutDown { addLate() } }
          loop.add(observer, to: .common)
          members.append(observer)
        default:
          loop.perform(inModes: ["never-run"]) { addLate() }
        }
        _ = try? loop.performAndWait {}
        await execOnNewThread { loop.shutdownAndWait() }
        guard let (source, ticks) = late.snapshot else {
          failures.append("round \(round): the \(kind) callout did not run")
          continue
        }
        let consumer = Task { () -> Int in
          var count = 0
          for await _ in ticks { count += 1 }
          return count
        }
        let ended = await execOnNewThread { () -> Bool in
          let gate = TestGate()
          Task {
            _ = await consumer.value
            gate.open()
          }
          return gate.wait(timeout: .seconds(5))
        }
        if !ended {
          failures.append("round \(round): the timer sequence made during the drain never ended")
          consumer.cancel()
        }
        if source.isValid || schedules.current != cancels.current {
          failures.append(
            "round \(round): valid \(source.isValid), schedules \(schedules.current), cancels \(cancels.current)")
        }
        withExtendedLifetime(members) {}
        if failures.count > 3 { break }
      }
      return failures
    }
    #expect(failures == [])
  }

  /// Promise (RunLoopRunResult.stopped): "the loop is shutting down (`shutdown()` ends every run
  /// of the loop this way, at every nesting level)". A run made by a block that the shutdown's
  /// drain runs (performed in a mode the loop never ran, or a `runModal` requested just before
  /// the shutdown), in a mode that held a timer until the shutdown invalidated it, should end
  /// `.stopped` like every other run the shutdown ends.
  @Test
  func aRunEnteredDuringTheShutdownDrainEndsStopped() async throws {
    let results = try await withWatchdogOnThread(timeout: .seconds(20), "run in the drain") {
      () throws -> [RunLoopRunResult] in
      let results = Guarded<[RunLoopRunResult]>([])
      for _ in 0..<20 {
        let loop = try RunLoopThread(name: "drainrun")
        let mode = RunLoopMode("drainrun-mode")
        let keep = LoopTimer(after: .seconds(3_600)) { _ in }
        loop.add(keep, to: mode)
        loop.perform(inModes: ["never-run"]) {
          let result = loop.run(mode: mode, until: .distantFuture)
          results.withLock { $0.append(result) }
        }
        loop.shutdownAndWait()
      }
      return results.snapshot
    }
    guard let results else { return }
    #expect(results == Array(repeating: .stopped, count: 20))
  }

  /// Promise (Shutdown; RunLoopRunResult.stopped): the shutdown ends every run, at every nesting
  /// level. A block that only the drain runs adds a member to a mode (the loop has not terminated
  /// yet) and runs that mode nested with a 3 s limit: the run must end because the loop is
  /// shutting down, not sleep until its limit (`.timedOut`). Meanwhile another thread waits in
  /// `invalidateAndWait()` for a timer whose callout is inside a nested run the shutdown ends.
  @Test(arguments: ["timer", "source", "descriptor"])
  func aRunNestedInTheDrainWithAFreshMemberDoesNotSleep(kind: String) async throws {
    let results = try await withWatchdogOnThread(timeout: .seconds(60), "nested run in the drain (\(kind))") {
      () throws -> [String] in
      var results: [String] = []
      for round in 0..<6 {
        let loop = try RunLoopThread(name: "drainnest")
        let mode = RunLoopMode("dn-\(round)")
        let ends = makePipe()
        defer {
          close(ends.read)
          close(ends.write)
        }
        let result = Guarded<RunLoopRunResult?>(nil)
        let inCallout = TestGate()
        let busy = LoopTimer(after: .zero) { _ in
          inCallout.open()
          loop.run(mode: RunLoopMode("dn-busy"), until: .now.advanced(by: .seconds(3)))
        }
        let busyKeep = LoopTimer(after: .seconds(3_600)) { _ in }
        loop.add(busyKeep, to: RunLoopMode("dn-busy"))
        loop.add(busy, to: .common)
        _ = inCallout.wait(timeout: .seconds(10))
        loop.perform(inModes: ["never-run"]) {
          switch kind {
          case "timer":
            loop.add(LoopTimer(after: .seconds(3_600)) { _ in }, to: mode)
          case "source":
            loop.add(InputSource { _ in }, to: mode)
          default:
            try? loop.add(DescriptorSource(descriptor: ends.read) { _, _ in }, to: mode)
          }
          let nested = loop.run(mode: mode, until: .now.advanced(by: .seconds(3)))
          result.withLock { $0 = nested }
        }
        race([{ loop.shutdownAndWait() }, { try? busy.invalidateAndWait() }])
        results.append(result.snapshot.map { "\($0)" } ?? "not run")
        withExtendedLifetime(busyKeep) {}
      }
      return results
    }
    guard let results else { return }
    #expect(results == Array(repeating: "stopped", count: 6))
  }

  /// Shutdown while thousands of changes wait: every source's schedule and cancel run once, every
  /// block accepted before the shutdown runs.
  @Test func shutdownDrainsManyWaitingChanges() async throws {
    let loop = try RunLoopThread(name: "sdmany")
    let schedules = AtomicCounter()
    let cancels = AtomicCounter()
    let blocks = AtomicCounter()
    let count = 2_000
    let sources = (0..<count).map { _ in
      InputSource(
        schedule: { _, _, _ in schedules.increment() }, cancel: { _, _ in cancels.increment() }, perform: { _ in })
    }
    let release = blockLoop(loop)
    for (index, source) in sources.enumerated() {
      loop.add(source, to: index % 2 == 0 ? .default : RunLoopMode("other"))
      if index % 100 == 0 { #expect(loop.perform { blocks.increment() }) }
    }
    loop.shutdown()
    release.open()
    _ = try await withWatchdogOnThread(timeout: .seconds(20), "shutdown") { loop.shutdownAndWait() }
    #expect(schedules.current == count)
    #expect(cancels.current == count)
    #expect(blocks.current == count / 100)
    #expect(sources.allSatisfy { !$0.isValid })
  }

  /// Blocks performed for a mode that never runs are not lost: the shutdown drain runs each once
  /// (whether the loop had collected it or it still waited in the inbox).
  @Test func blocksForAModeNeverRunRunOnceAtShutdown() async throws {
    let loop = try RunLoopThread(name: "never")
    let ran = Locked([String: Int]())
    let collected = loop.perform(inModes: [modeNever]) { ran.withLock { $0["collected", default: 0] += 1 } }
    _ = await execOnNewThread {
      // A default-mode block after it: once it ran, the loop holds the first block.
      let passed = TestGate()
      loop.perform { passed.open() }
      passed.wait(timeout: .seconds(20))
    }
    let gate = await execOnNewThread { blockLoop(loop) }
    let waiting = loop.perform(inModes: [modeNever]) { ran.withLock { $0["inbox", default: 0] += 1 } }
    gate.open()
    await execShutdown(loop)
    #expect(collected && waiting)
    #expect(ran.withLock { $0 } == ["collected": 1, "inbox": 1])
  }
}
