import Glibc
import Testing

@_spi(Testing) @testable import AsyncRunLoop

// Review round 17: sources signalled while their modes do not run (`deferredSignalled`), executor
// jobs waiting in the inbox in chunks (`ChunkedQueue`), timer reschedule coalescing
// (`LoopTimer.pendingReschedule`), executor-job timers in the internal every-mode, and the shutdown
// drain. Blocking work runs on threads of the tests' own; results are checked after the watchdog
// returns.

private let r17ModeA: RunLoopMode = "r17-a"
private let r17ModeB: RunLoopMode = "r17-b"
private let r17ModeC: RunLoopMode = "r17-c"
private let r17ModeEmpty: RunLoopMode = "r17-empty"
private let r17ModeModal: RunLoopMode = "r17-modal"
private let r17Steps = 1_500

/// One pass of `mode` on the calling loop thread.
private func r17OnePass(_ loop: RunLoopThread, _ mode: RunLoopMode) {
  _ = loop.run(mode: mode, until: .now)
}

/// A small deterministic pseudo-random sequence (a 64-bit LCG), so a failing round repeats.
private struct R17Random {
  var state: UInt64
  mutating func next(_ bound: Int) -> Int {
    state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
    return Int((state >> 33) % UInt64(bound))
  }
}

/// Whether `values` is 0, 1, 2, … (each once, in order).
private func r17IsInOrderOnce(_ values: [Int], count: Int) -> Bool {
  values == Array(0..<count)
}

/// Where the moving source is, as the loop thread left it.
private struct R17Placement {
  var inB = false
  var inC = false
  var inCommon = false
  var onOther = false
  var onHome: Bool { inB || inC || inCommon }
}

@Suite(
  "ReviewRound17: deferred signals, job chunks, reschedules, every-mode timers", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound17Tests {
  // MARK: Deferred signals

  /// A command source is moved at random between modes B and C, `.common`, another loop and back,
  /// while a producer thread posts commands and the loop runs passes in A (outside the source's
  /// modes until A joins the common set halfway), B and C. Afterwards one of its modes runs: every
  /// command accepted is delivered once, in posting order, and nothing is left pending.
  @Test(arguments: [1, 2, 3, 4])
  func aMovingSourceDeliversEveryPostedCommandOnceInOrder(seed: Int) async throws {
    let other = try RunLoopThread(name: "r17-other")
    defer { other.shutdown() }
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "moving source") {
      () -> (delivered: [Int], posted: Int, pending: Int, refused: Bool) in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      let delivered = Guarded<[Int]>([])
      let commands = CommandSource<Int> { value in delivered.withLock { $0.append(value) } }
      let keeps = [r17ModeA, r17ModeB, r17ModeC].map { mode in
        let keep = LoopTimer(after: .seconds(3600)) { _ in }
        loop.add(keep, to: mode)
        return keep
      }
      let posted = AtomicCounter()
      let stop = Guarded(false)
      let producer = startThread {
        var next = 0
        while !stop.snapshot {
          if commands.post(next) {
            next += 1
            _ = posted.increment()
          }
          if next % 8 == 0 { sched_yield() }
        }
      }
      var random = R17Random(state: UInt64(seed))
      var place = R17Placement()
      loop.add(commands.source, to: r17ModeB)
      place.inB = true
      for round in 0..<1_500 {
        if round == 750 { loop.addModeToCommonModes(r17ModeA) }
        switch random.next(9) {
        case 0 where !place.onOther:
          if place.inB { loop.remove(commands.source, from: r17ModeB) } else { loop.add(commands.source, to: r17ModeB) }
          place.inB.toggle()
        case 1 where !place.onOther:
          if place.inC { loop.remove(commands.source, from: r17ModeC) } else { loop.add(commands.source, to: r17ModeC) }
          place.inC.toggle()
        case 2 where !place.onOther:
          if place.inCommon {
            loop.remove(commands.source, from: .common)
          } else {
            loop.add(commands.source, to: .common)
          }
          place.inCommon.toggle()
        case 3:
          if place.onOther {
            other.remove(commands.source, from: .default)
            place.onOther = false
            loop.add(commands.source, to: r17ModeC)
            place.inC = true
          } else {
            if place.inB { loop.remove(commands.source, from: r17ModeB) }
            if place.inC { loop.remove(commands.source, from: r17ModeC) }
            if place.inCommon { loop.remove(commands.source, from: .common) }
            place = R17Placement()
            other.add(commands.source, to: .default)
            place.onOther = true
          }
        case 4: r17OnePass(loop, r17ModeB)
        case 5: r17OnePass(loop, r17ModeC)
        default: r17OnePass(loop, r17ModeA)
        }
      }
      stop.withLock { $0 = true }
      joinThread(producer)
      // Home, in B, and B runs: what waits is delivered.
      if place.onOther { other.remove(commands.source, from: .default) }
      if !place.inB { loop.add(commands.source, to: r17ModeB) }
      waitUntil(timeout: .seconds(5), "the other loop done with the source") {
        _ = other.performAndWaitIfRunning { () }
        return true
      }
      for _ in 0..<5 where commands.pendingCount > 0 || delivered.snapshot.count < posted.current {
        r17OnePass(loop, r17ModeB)
      }
      let pending = commands.pendingCount
      let result = delivered.snapshot
      commands.source.invalidate()
      let refused = !commands.post(-1)
      for keep in keeps { keep.invalidate() }
      return (result, posted.current, pending, refused)
    }
    guard let outcome else { return }
    #expect(outcome.pending == 0)
    #expect(outcome.delivered.count == outcome.posted)
    #expect(r17IsInOrderOnce(outcome.delivered, count: outcome.posted), "commands lost, repeated or out of order")
    #expect(outcome.refused)
  }

  /// On one loop thread, three sources of different orders are added to and removed from B, C and
  /// `.common` at random, signalled at random, and C joins the common set halfway, while passes of
  /// A, B, C and `.default` run, directly or nested in a helper source's handler in A. After each
  /// pass, exactly the sources that were signalled and are in the pass's mode (as the loop says)
  /// fired, once each, in order, and are no longer signalled; the others did not fire.
  @Test(arguments: [7, 8, 9, 10, 11, 12])
  func aPassFiresExactlyTheSignalledSourcesOfItsMode(seed: Int) async throws {
    let problems = try await withWatchdogOnThread(timeout: .seconds(20), "exact firing") { () -> [String] in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      let modes: [RunLoopMode] = [r17ModeA, r17ModeB, r17ModeC, .default]
      let keeps = modes.map { mode in
        let keep = LoopTimer(after: .seconds(3600)) { _ in }
        loop.add(keep, to: mode)
        return keep
      }
      let log = EventLog()
      var sources = (0..<3).map { index in InputSource(order: 2 - index) { _ in log.add("s\(index)") } }
      let problems = Guarded<[String]>([])
      /// Runs one pass of `mode` and checks what fired against what the loop held.
      let checkedPass: @Sendable ([InputSource], RunLoopMode, String) -> Void = { sources, mode, label in
        let due = sources.indices.filter { sources[$0].isSignalled && loop.core.modes(of: sources[$0]).contains(mode) }
          .sorted { sources[$0].order < sources[$1].order }
        let before = log.snapshot.count
        r17OnePass(loop, mode)
        let fired = Array(log.snapshot[before...].filter { $0.hasPrefix("s") })
        let expected = due.map { "s\($0)" }
        if fired != expected {
          problems.withLock { $0.append("\(label) \(mode): fired \(fired), expected \(expected)") }
        }
        for index in due where sources[index].isSignalled {
          problems.withLock { $0.append("\(label) \(mode): s\(index) still signalled") }
        }
      }
      let nested = Guarded<(sources: [InputSource], mode: RunLoopMode, label: String)?>(nil)
      let helper = InputSource(order: 100) { _ in
        guard let job = nested.snapshot else { return }
        checkedPass(job.sources, job.mode, job.label)
      }
      loop.add(helper, to: r17ModeA)
      var random = R17Random(state: UInt64(seed))
      for step in 0..<r17Steps {
        if step == r17Steps / 2 { loop.addModeToCommonModes(r17ModeC) }
        let index = random.next(3)
        let source = sources[index]
        switch random.next(12) {
        case 0: loop.add(source, to: r17ModeB)
        case 1: loop.remove(source, from: r17ModeB)
        case 2: loop.add(source, to: r17ModeC)
        case 3: loop.remove(source, from: r17ModeC)
        case 4: loop.add(source, to: .common)
        case 5: loop.remove(source, from: .common)
        case 6, 7: source.signal()
        case 8:
          // Nested: a pass of B, C or default inside the helper's handler, during a pass of A.
          let mode = [r17ModeB, r17ModeC, RunLoopMode.default][random.next(3)]
          nested.withLock { $0 = (sources, mode, "step \(step) nested") }
          helper.signal()
          r17OnePass(loop, r17ModeA)
          nested.withLock { $0 = nil }
        case 9:
          if random.next(8) == 0 {
            source.invalidate()
            sources[index] = InputSource(order: 2 - index) { _ in log.add("s\(index)") }
          } else {
            checkedPass(sources, modes[random.next(4)], "step \(step)")
          }
        default:
          checkedPass(sources, modes[random.next(4)], "step \(step)")
        }
      }
      for source in sources { source.invalidate() }
      helper.invalidate()
      for keep in keeps { keep.invalidate() }
      return problems.snapshot
    }
    #expect(problems == [])
  }

  /// One signal, while the source waits in B on a loop held in a block: another thread moves the
  /// source to a second loop (running its default mode) and, in some rounds, straight back to B
  /// on the first. Once both loops have run its modes, the source fired exactly once (on one of
  /// them).
  @Test func oneSignalFiresOnceAcrossAMoveBetweenLoops() async throws {
    let first = try RunLoopThread(name: "r17-one")
    let second = try RunLoopThread(name: "r17-two")
    defer {
      first.shutdown()
      second.shutdown()
    }
    let keepB = LoopTimer(after: .seconds(3600)) { _ in }
    first.add(keepB, to: r17ModeB)
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "move between loops") { () -> [String] in
      var problems: [String] = []
      repeatRounds(200, budget: .milliseconds(1000)) { round in
        let fires = Guarded<[String]>([])
        let source = InputSource { _ in fires.withLock { $0.append(RunLoopThread.currentIfExists?.name ?? "?") } }
        first.add(source, to: r17ModeB)
        let release = round % 3 == 0 ? nil : blockLoop(first)
        source.signal()
        if round % 3 == 0 { _ = try? first.performAndWait {} }  // sorted out in default: waits for B
        for _ in 0..<(round % 7) { sched_yield() }
        first.remove(source, from: r17ModeB)
        second.add(source, to: .default)
        let back = round % 2 == 0
        if back {
          for _ in 0..<(round % 5) { sched_yield() }
          second.remove(source, from: .default)
          first.add(source, to: r17ModeB)
        }
        release?.open()
        let fired = waitUntil(timeout: .seconds(5), "the one fire") {
          _ = try? first.performAndWait { first.run(mode: r17ModeB, until: .now) }
          return !fires.snapshot.isEmpty
        }
        for _ in 0..<3 {
          _ = try? first.performAndWait { first.run(mode: r17ModeB, until: .now) }
          _ = try? second.performAndWait {}
        }
        if !fired || fires.snapshot.count != 1 {
          problems.append("round \(round) (back \(back)): fired \(fires.snapshot)")
        }
        source.invalidate()
      }
      return problems
    }
    keepB.invalidate()
    #expect(outcome == [])
  }

  /// A source signalled in B waits while A runs; it is then invalidated and a new source is added
  /// to A and signalled: the new one fires in A at once (the waiting list, holding a detached
  /// record, neither hides it nor fires the old one), and the old one never fires, also when B
  /// runs.
  @Test func anInvalidatedWaitingSourceNeitherFiresNorHidesANewOne() async throws {
    let log = try await withWatchdogOnThread(timeout: .seconds(20), "invalidated waiting source") { () -> [String] in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      let log = EventLog()
      let keepA = LoopTimer(after: .seconds(3600)) { _ in }
      let keepB = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepA, to: r17ModeA)
      loop.add(keepB, to: r17ModeB)
      let old = InputSource(cancel: { _, _ in log.add("old cancel") }) { _ in log.add("old") }
      loop.add(old, to: r17ModeB)
      old.signal()
      r17OnePass(loop, r17ModeA)
      r17OnePass(loop, r17ModeA)
      old.invalidate()
      let fresh = InputSource { _ in log.add("fresh") }
      loop.add(fresh, to: r17ModeA)
      fresh.signal()
      r17OnePass(loop, r17ModeA)
      log.add("A ran")
      r17OnePass(loop, r17ModeB)
      fresh.invalidate()
      keepA.invalidate()
      keepB.invalidate()
      return log.snapshot
    }
    #expect(log == ["old cancel", "fresh", "A ran"])
  }

  /// A signalled source waiting for B is removed from B by another thread and added to A there,
  /// while the loop thread runs A pass after pass: it fires in A once, never twice, whatever the
  /// moment of the move.
  @Test func aWaitingSourceMovedByAnotherThreadFiresOnceInItsNewMode() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "moved waiting source") { () -> [Int] in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      let keepA = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepA, to: r17ModeA)
      var bad: [Int] = []
      repeatRounds(300, budget: .milliseconds(800)) { round in
        let fires = AtomicCounter()
        let source = InputSource { _ in fires.increment() }
        loop.add(source, to: r17ModeB)
        source.signal()
        r17OnePass(loop, r17ModeA)  // sorted out: waits for B
        let moved = TestGate()
        let mover = startThread {
          for _ in 0..<(round % 32) { sched_yield() }
          loop.remove(source, from: r17ModeB)
          loop.add(source, to: r17ModeA)
          moved.open()
        }
        var passes = 0
        while !moved.opened || passes < 3 {
          r17OnePass(loop, r17ModeA)
          if moved.opened { passes += 1 }
        }
        joinThread(mover)
        r17OnePass(loop, r17ModeA)
        if fires.current != 1 { bad.append(round) }
        source.invalidate()
      }
      keepA.invalidate()
      return bad
    }
    #expect(outcome == [], "rounds where the moved source did not fire exactly once")
  }

  // MARK: Jobs in chunks

  /// A current loop runs short timed runs (some nested in a performed block, in another mode)
  /// while another thread starts bursts of tasks that prefer the loop, each of which starts a
  /// follow-up task from inside its job: the first jobs run in the order they were enqueued, and
  /// every job, first and follow-up, runs exactly once, on the loop's thread.
  @Test func burstsIntoACurrentLoopsShortRunsRunInOrderOnce() async throws {
    let total = 6_000
    let order = Guarded<[Int]>([])
    let followUps = Guarded<[Int]>([])
    let offThread = AtomicCounter()
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "bursts into short runs") { () -> Bool in
      let loop = RunLoopThread.current
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      let keepModal = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: .default)
      loop.add(keepModal, to: r17ModeModal)
      let producerDone = TestGate()
      let producer = startThread {
        var index = 0
        while index < total {
          let burst = min(total - index, 1_500)
          for offset in 0..<burst {
            let value = index + offset
            Task(executorPreference: loop) {
              if !loop.isOnLoopThread { offThread.increment() }
              order.withLock { $0.append(value) }
              Task(executorPreference: loop) {
                if !loop.isOnLoopThread { offThread.increment() }
                followUps.withLock { $0.append(value) }
              }
            }
          }
          index += burst
          usleep(500)
        }
        producerDone.open()
      }
      var round = 0
      let deadline = ContinuousClock.now.advanced(by: .seconds(20))
      while (order.snapshot.count < total || followUps.snapshot.count < total) && ContinuousClock.now < deadline {
        if round % 3 == 0 {
          _ = loop.perform(inModes: [.default]) {
            _ = loop.run(mode: r17ModeModal, until: .now.advanced(by: .microseconds(300)))
          }
        }
        _ = loop.run(mode: .default, until: .now.advanced(by: .microseconds(500)))
        round += 1
      }
      joinThread(producer)
      keep.invalidate()
      keepModal.invalidate()
      loop.shutdown()
      return producerDone.opened
    }
    #expect(outcome == true)
    #expect(order.snapshot == Array(0..<total), "first jobs lost, repeated or out of order")
    #expect(followUps.snapshot.sorted() == Array(0..<total), "follow-up jobs lost or repeated")
    #expect(offThread.current == 0)
  }

  /// Another thread interleaves registration changes (a flood of timer adds and removals, so that
  /// bounded passes leave changes waiting and jobs wait behind them) with starting loop-preferring
  /// tasks, while a current loop runs short runs that end with jobs taken and not run: every job
  /// runs once, in the order started.
  @Test func jobsBehindWaitingChangesAcrossShortRunsRunInOrderOnce() async throws {
    let total = 2_000
    let order = Guarded<[Int]>([])
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "jobs behind changes") { () -> Bool in
      let loop = RunLoopThread.current
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep)
      let producer = startThread {
        let timer = LoopTimer(after: .seconds(3600)) { _ in }
        for index in 0..<total {
          for _ in 0..<(index % 5 == 0 ? 200 : 2) {
            loop.add(timer, to: r17ModeB)
            loop.remove(timer, from: r17ModeB)
          }
          Task(executorPreference: loop) { order.withLock { $0.append(index) } }
        }
        timer.invalidate()
      }
      let deadline = ContinuousClock.now.advanced(by: .seconds(20))
      var round = 0
      while order.snapshot.count < total && ContinuousClock.now < deadline {
        _ = loop.run(until: .now.advanced(by: .microseconds(round % 2 == 0 ? 50 : 400)))
        round += 1
      }
      joinThread(producer)
      keep.invalidate()
      loop.shutdown()
      return order.snapshot.count == total
    }
    #expect(outcome == true)
    #expect(order.snapshot == Array(0..<total), "jobs lost, repeated or out of order")
  }

  /// Tasks that prefer an owned loop are started in bursts while the loop shuts down: each runs
  /// exactly once (on the loop, or on the fallback queue after termination) and in the order they
  /// were started.
  @Test func tasksStartedAcrossAShutdownRunOnceInOrder() async throws {
    var failures: [String] = []
    for attempt in 0..<4 {
      let loop = try RunLoopThread(name: "r17-drain")
      let total = 4_000
      let order = Guarded<[Int]>([])
      let tasks = Guarded<[Task<Void, Never>]>([])
      await execOnNewThread {
        for index in 0..<total {
          let task = Task(executorPreference: loop) { order.withLock { $0.append(index) } }
          tasks.withLock { $0.append(task) }
          if index == 1_000 + attempt * 700 { loop.shutdown() }
        }
      }
      let all = tasks.snapshot
      let done: Void? = try await withWatchdog(timeout: .seconds(20), "every task across a shutdown") {
        for task in all { await task.value }
      }
      if done == nil { failures.append("attempt \(attempt): hung") }
      if order.snapshot != Array(0..<total) {
        let got = order.snapshot
        failures.append(
          "attempt \(attempt): \(got.count) ran, first misplaced \(got.indices.first { got[$0] != $0 } ?? -1)")
      }
      await execShutdown(loop)
    }
    #expect(failures == [])
  }

  /// An actor-style job on an owned loop runs the loop nested (in another mode) while another
  /// thread starts a burst of loop-preferring tasks and a loop-preferring task's sleep falls due:
  /// none of them runs inside the nested run (the serial contract), and once the job returns they
  /// all run, the burst in the order started.
  @Test func jobsAndSleepsDueDuringARunNestedInAJobWaitForIt() async throws {
    let loop = try RunLoopThread(name: "r17-nested-job")
    let keep = LoopTimer(after: .seconds(3600)) { _ in }
    loop.add(keep, to: r17ModeModal)
    let inNested = Guarded(false)
    let ranInside = AtomicCounter()
    let order = Guarded<[Int]>([])
    let total = 2_500
    let entered = TestGate()
    let outer = Task(executorPreference: loop) {
      inNested.withLock { $0 = true }
      entered.open()
      _ = loop.run(mode: r17ModeModal, until: .now.advanced(by: .milliseconds(150)))
      inNested.withLock { $0 = false }
    }
    let sleeper = Task(executorPreference: loop) {
      try? await Task.sleep(for: .milliseconds(30))
      if inNested.snapshot { ranInside.increment() }
    }
    let tasks = await execOnNewThread { () -> [Task<Void, Never>] in
      _ = entered.wait(timeout: .seconds(5))
      return (0..<total).map { index in
        Task(executorPreference: loop) {
          if inNested.snapshot { ranInside.increment() }
          order.withLock { $0.append(index) }
        }
      }
    }
    let done: Void? = try await withWatchdog(timeout: .seconds(20), "jobs after the nested run") {
      await outer.value
      await sleeper.value
      for task in tasks { await task.value }
    }
    keep.invalidate()
    await execShutdown(loop)
    #expect(done != nil)
    #expect(ranInside.current == 0, "a job ran inside a run nested in a job")
    #expect(order.snapshot == Array(0..<total))
  }

  /// A current loop is shut down by another thread while its thread is in a run and tasks keep
  /// arriving; the thread runs a few more short runs, then ends its runs. Every task runs exactly
  /// once, in the order started, and never two at once (on the loop's thread, then the fallback).
  @Test func aCurrentLoopShutDownMidRunKeepsItsJobsInOrderOnce() async throws {
    let total = 5_000
    let order = Guarded<[Int]>([])
    let running = AtomicCounter()
    let overlaps = AtomicCounter()
    let tasks = Guarded<[Task<Void, Never>]>([])
    let finished = try await withWatchdogOnThread(timeout: .seconds(20), "current loop shutdown") { () -> Bool in
      let loop = RunLoopThread.current
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep)
      let producer = startThread {
        for index in 0..<total {
          let task = Task(executorPreference: loop) {
            if running.increment() != 1 { overlaps.increment() }
            order.withLock { $0.append(index) }
            running.value.subtract(1, ordering: .sequentiallyConsistent)
          }
          tasks.withLock { $0.append(task) }
          if index == total / 2 { loop.shutdown() }
          if index % 500 == 0 { usleep(200) }
        }
      }
      for _ in 0..<40 { _ = loop.run(until: .now.advanced(by: .microseconds(300))) }
      joinThread(producer)
      for _ in 0..<5 { _ = loop.run(until: .now.advanced(by: .microseconds(300))) }
      keep.invalidate()
      return true
    }
    let all = tasks.snapshot
    let done: Void? = try await withWatchdog(timeout: .seconds(20), "every task") {
      for task in all { await task.value }
    }
    #expect(finished == true)
    #expect(done != nil)
    #expect(overlaps.current == 0, "two of the loop's jobs ran at once")
    #expect(order.snapshot == Array(0..<total), "jobs lost, repeated or out of order")
  }

  /// A task that yields forever keeps an owned loop's shutdown drain busy while another thread
  /// keeps adding sources: the drain ends (at its cap), the task goes on on the fallback queue,
  /// and every source ends invalidated with its schedule and cancel paired (an add refused by the
  /// cap or after termination invalidates the source visibly), none left valid on the dead loop.
  @Test func aDrainKeptBusyEndsAndRefusesAddsVisibly() async throws {
    let loop = try RunLoopThread(name: "r17-cap")
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
    let adder = startThread {
      while !stopAdding.snapshot {
        let source = InputSource(
          schedule: { _, loop, _ in pairs.schedule(loop) }, cancel: { _, loop in pairs.cancel(loop) },
          perform: { _ in })
        sources.withLock { $0.append(source) }
        loop.add(source, to: .default)
        source.signal()
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

  /// Two threads post to a command source on an owned loop and flood it with timer adds and
  /// removals while the loop shuts down (a yielding task keeps the drain busy): the shutdown
  /// ends, every post that was accepted is delivered exactly once (by the time `shutdownAndWait`
  /// returns), and every later post is refused.
  @Test(arguments: [0, 2])
  func postsRacingACappedShutdownAreDeliveredOnceOrRefused(variant: Int) async throws {
    let loop = try RunLoopThread(name: "r17-posts")
    let delivered = Guarded<[Int]>([])
    let commands = CommandSource<Int> { value in delivered.withLock { $0.append(value) } }
    loop.add(commands.source)
    let spinner = Task(executorPreference: loop) {
      while !Task.isCancelled && variant != 0 { await Task.yield() }
    }
    let accepted = Guarded<[Int]>([])
    let refusedAfterAccept = AtomicCounter()
    let go = AtomicCounter()
    let producers = (0..<2).map { producer in
      startThread {
        while go.current == 0 { sched_yield() }
        var value = producer
        var refused = false
        let timer = LoopTimer(after: .seconds(3600)) { _ in }
        while !refused {
          if commands.post(value) {
            accepted.withLock { $0.append(value) }
            if refused { refusedAfterAccept.increment() }
          } else {
            refused = true
          }
          value += 2
          if variant == 2 {
            loop.add(timer, to: r17ModeB)
            loop.remove(timer, from: r17ModeB)
          }
        }
        timer.invalidate()
      }
    }
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "capped shutdown with posts") {
      () -> (atReturn: Int, later: Int) in
      _ = go.increment()
      usleep(3_000)
      loop.shutdownAndWait()
      let atReturn = delivered.snapshot.count
      for producer in producers { joinThread(producer) }
      usleep(5_000)
      return (atReturn, delivered.snapshot.count)
    }
    spinner.cancel()
    _ = try await withWatchdog(timeout: .seconds(30), "the spinner ends") { await spinner.value }
    guard let outcome else { return }
    let got = delivered.snapshot
    let sent = accepted.snapshot
    #expect(got.count == sent.count, "delivered \(got.count) of \(sent.count) accepted")
    #expect(Set(got).count == got.count, "a command was delivered twice")
    #expect(Set(got) == Set(sent))
    #expect(outcome.later == outcome.atReturn, "deliveries after shutdownAndWait returned")
    #expect(refusedAfterAccept.current == 0)
  }

  // MARK: Timer reschedules

  /// While the loop is held in a block, another thread moves a timer to a near date many times,
  /// then far away: released, the loop applies the last date only, and the timer never fires.
  /// Then many far dates and a near one last: it fires once, not before that date.
  @Test func theLastSetFireDateFromAnotherThreadWins() async throws {
    let loop = try RunLoopThread(name: "r17-resched")
    defer { loop.shutdown() }
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "last date wins") { () -> [String] in
      var problems: [String] = []
      for round in 0..<20 {
        let fires = AtomicCounter()
        let early = AtomicCounter()
        let target = Guarded<Int64>(Int64.max)
        let timer = LoopTimer(after: .seconds(3600)) { timer in
          fires.increment()
          if LoopClock.monotonicNanoseconds() < target.snapshot { early.increment() }
        }
        loop.add(timer)
        let release = blockLoop(loop)
        for _ in 0..<(50 + round) { timer.setFireDate(.now.advanced(by: .microseconds(100))) }
        target.withLock { $0 = LoopClock.Instant.now.advanced(by: .seconds(3600)).nanoseconds }
        timer.setFireDate(.now.advanced(by: .seconds(3600)))
        usleep(300)
        release.open()
        _ = try? loop.performAndWait {}
        usleep(2_000)
        _ = try? loop.performAndWait {}
        if fires.current != 0 { problems.append("round \(round): fired at a stale date") }
        let release2 = blockLoop(loop)
        for _ in 0..<(50 + round) { timer.setFireDate(.now.advanced(by: .seconds(3600))) }
        let near = LoopClock.Instant.now.advanced(by: .milliseconds(1))
        target.withLock { $0 = near.nanoseconds }
        timer.setFireDate(near)
        release2.open()
        if !waitUntil(timeout: .seconds(5), "the near date", { fires.current == 1 }) {
          problems.append("round \(round): never fired")
        }
        usleep(1_000)
        if fires.current != 1 || early.current != 0 {
          problems.append("round \(round): fires \(fires.current), early \(early.current)")
        }
        timer.invalidate()
      }
      return problems
    }
    #expect(outcome == [])
  }

  /// A repeating timer fires every 200 µs; another thread moves it an hour away at a varying
  /// moment, from time to time while the loop is applying other changes: after `setFireDate`
  /// returns, at most the fire already under way completes, and none follows at the old grid.
  @Test func aRepeatingTimerMovedAwayFromAnotherThreadStopsFiring() async throws {
    let loop = try RunLoopThread(name: "r17-grid")
    defer { loop.shutdown() }
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "moved repeating timer") { () -> [String] in
      var problems: [String] = []
      repeatRounds(40, budget: .milliseconds(800)) { round in
        let moved = Guarded(false)
        let afterMove = AtomicCounter()
        let fires = AtomicCounter()
        let timer = LoopTimer(after: .microseconds(200), repeatingEvery: .microseconds(200)) { _ in
          fires.increment()
          if moved.snapshot { afterMove.increment() }
        }
        loop.add(timer)
        waitUntil(timeout: .seconds(5), "the timer firing") { fires.current >= 2 + round % 5 }
        if round % 2 == 1 {
          let other = LoopTimer(after: .seconds(3600)) { _ in }
          for _ in 0..<200 {
            loop.add(other, to: r17ModeB)
            loop.remove(other, from: r17ModeB)
          }
          other.invalidate()
        }
        timer.setFireDate(.now.advanced(by: .seconds(3600)))
        moved.withLock { $0 = true }
        usleep(3_000)
        _ = try? loop.performAndWait {}
        if afterMove.current > 1 { problems.append("round \(round): \(afterMove.current) fires after the move") }
        timer.invalidate()
      }
      return problems
    }
    #expect(outcome == [])
  }

  /// A timer moved to a near date on a held loop, then moved to another loop and far away there:
  /// the first loop's late reschedule (for a record it no longer holds) fires nothing, the other
  /// loop fires nothing, and a new near date set afterwards fires it once on the other loop.
  @Test func aRescheduleLeftOnTheOldLoopFiresNothingAndLaterOnesStillApply() async throws {
    let first = try RunLoopThread(name: "r17-old")
    let second = try RunLoopThread(name: "r17-new")
    defer {
      first.shutdown()
      second.shutdown()
    }
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "moved timer") { () -> [String] in
      var problems: [String] = []
      for round in 0..<20 {
        let fires = Guarded<[String]>([])
        let phase = Guarded(0)  // 1 from the far date on: a fire then is at a stale date
        let timer = LoopTimer(after: .seconds(3600)) { _ in
          let name = RunLoopThread.currentIfExists?.name ?? "?"
          fires.withLock { $0.append(phase.snapshot == 1 ? "stale on \(name)" : name) }
        }
        first.add(timer)
        let release = blockLoop(first)
        timer.setFireDate(.now.advanced(by: .milliseconds(2)))
        first.remove(timer)
        second.add(timer)
        timer.setFireDate(.now.advanced(by: .seconds(3600)))
        phase.withLock { $0 = 1 }
        release.open()
        _ = try? first.performAndWait {}
        _ = try? second.performAndWait {}
        usleep(3_000)
        phase.withLock { $0 = 2 }
        if fires.snapshot.contains(where: { $0.hasPrefix("stale") }) {
          problems.append("round \(round): fired \(fires.snapshot) at a stale date")
        }
        guard fires.snapshot.isEmpty else {  // fired at the near date before it was moved away: legitimate
          timer.invalidate()
          continue
        }
        // Back and forth once more: the pending mark left by the old loop must not swallow this.
        second.remove(timer)
        first.add(timer)
        timer.setFireDate(.now.advanced(by: .milliseconds(1)))
        if !waitUntil(timeout: .seconds(5), "the new date", { fires.snapshot.count == 1 }) {
          problems.append("round \(round): never fired after the move back")
        }
        usleep(1_000)
        if fires.snapshot != ["r17-old"] { problems.append("round \(round): fires \(fires.snapshot)") }
        timer.invalidate()
      }
      return problems
    }
    #expect(outcome == [])
  }

  // MARK: Every-mode timers

  /// A loop-preferring task sleeping (an every-mode timer) is not visible to clients: a run of a
  /// mode that holds nothing still returns finished at once (SPEC §6), instead of waiting until
  /// its limit for the sleeper.
  @Test
  func anEmptyModeRunFinishesAtOnceWhileATaskSleeps() async throws {
    let loop = try RunLoopThread(name: "r17-empty")
    let before = loop.scheduledJobCount
    let sleeper = Task(executorPreference: loop) { try? await Task.sleep(for: .seconds(30)) }
    let result = try await withWatchdogOnThread(timeout: .seconds(10), "empty run") { () -> RunLoopRunResult? in
      waitUntil(timeout: .seconds(5), "the sleep scheduled") { loop.scheduledJobCount > before }
      return try loop.performAndWait { loop.run(mode: r17ModeEmpty, until: .now.advanced(by: .milliseconds(300))) }
    }
    sleeper.cancel()
    await execShutdown(loop)
    #expect(result == .finished)
  }

  /// A current loop's thread runs a task that sleeps, then the task is cancelled and ends. The
  /// runtime keeps the sleep's wake-up scheduled on the loop until its deadline (as on every
  /// executor: it does not withdraw it), so the thread's outermost run of an empty mode finishes
  /// only once that wake-up has fired (documented in the DocC article, step 9), not at once and
  /// not never. A run nested in it finishes at once all along.
  @Test func aCancelledSleepKeepsACurrentLoopsOutermostRunOnlyUntilItsDeadline() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "cancelled sleep") {
      () -> (ended: Bool, nested: RunLoopRunResult?, result: RunLoopRunResult, timers: Int) in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep)
      let ended = TestGate()
      let before = loop.scheduledJobCount
      let sleeper = Task(executorPreference: loop) {
        try? await Task.sleep(for: .seconds(1))
        ended.open()
      }
      let deadline = ContinuousClock.now.advanced(by: .seconds(5))
      while loop.scheduledJobCount == before && ContinuousClock.now < deadline {
        _ = loop.run(until: .now.advanced(by: .milliseconds(1)))
      }
      sleeper.cancel()
      while !ended.opened && ContinuousClock.now < deadline {
        _ = loop.run(until: .now.advanced(by: .milliseconds(1)))
      }
      keep.invalidate()
      let nested = Locked<RunLoopRunResult?>(nil)
      loop.perform {
        nested.withLock { $0 = loop.run(mode: r17ModeEmpty, until: .now.advanced(by: .seconds(10))) }
      }
      // Runs until the wake-up (due a second after the sleep began) fires, then finishes.
      let result = loop.run(until: .now.advanced(by: .seconds(10)))
      return (ended.opened, nested.withLock { $0 }, result, loop.core.modeTable.everyModeContents?.timerCount ?? 0)
    }
    #expect(outcome?.ended == true)
    #expect(outcome?.nested == .finished)
    #expect(outcome?.result == .finished, "every-mode timers left: \(outcome?.timers ?? -1)")
  }

  @Test func sleepsOnACurrentLoopThatStopsRunningEndAfterItsShutdown() async throws {
    let early = AtomicCounter()
    let slept = AtomicCounter()
    let cancelled = AtomicCounter()
    let started = AtomicCounter()
    let release = TestGate()
    let loopBox = Guarded<RunLoopThread?>(nil)
    var tasks: [Task<Void, Never>] = []
    let thread = startThread(detached: true) {
      let loop = RunLoopThread.current
      loopBox.withLock { $0 = loop }
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep)
      let deadline = ContinuousClock.now.advanced(by: .seconds(5))
      while started.current < 20 && ContinuousClock.now < deadline {
        _ = loop.run(until: .now.advanced(by: .milliseconds(1)))
      }
      _ = release.wait(timeout: .seconds(20))  // out of any run from now on
      keep.invalidate()
    }
    _ = thread
    let loop = await execOnNewThread { () -> RunLoopThread in
      while loopBox.snapshot == nil { usleep(200) }
      return loopBox.snapshot!
    }
    for index in 0..<20 {
      tasks.append(
        Task(executorPreference: loop) {
          started.increment()
          let start = ContinuousClock.now
          let delay = Duration.milliseconds(30 + index)
          if index % 2 == 0 {
            do {
              try await Task.sleep(for: delay)
              if ContinuousClock.now - start < delay { early.increment() }
              slept.increment()
            } catch {}
          } else {
            do { try await loop.clock.sleep(for: .seconds(30)) } catch is CancellationError {
              cancelled.increment()
            } catch {}
          }
        })
    }
    _ = await execOnNewThread {
      waitUntil(timeout: .seconds(5), "the tasks started") { started.current == 20 }
      usleep(2_000)
      loop.shutdown()
    }
    let all = tasks
    let done: Void? = try await withWatchdog(timeout: .seconds(20), "sleepers of a shut-down current loop") {
      for task in all { await task.value }
    }
    release.open()
    #expect(done != nil)
    #expect(slept.current == 10)
    #expect(cancelled.current == 10)
    #expect(early.current == 0)
  }

  /// A loop shut down and released with a cancelled hour-long `Task.sleep` pending on it gives its
  /// descriptors back, as one without does (checked first), instead of keeping the whole loop
  /// alive until the hour is over. The descriptors are its poller's, closed in the poller's
  /// `deinit`: the test watches the poller (the process's descriptor count also moves with the
  /// tests running alongside).
  @Test
  func aShutDownLoopWithAPendingSleepReleasesItsDescriptors() async throws {
    func pollerReleased(sleeping: Bool) async throws -> Bool {
      weak var weakPoller: EpollPoller?
      do {
        let loop = try RunLoopThread(name: "r17-fds")
        weakPoller = loop.shared.poller
        if sleeping {
          let before = loop.scheduledJobCount
          let sleeper = Task(executorPreference: loop) { try? await Task.sleep(for: .seconds(3600)) }
          _ = await execOnNewThread {
            waitUntil(timeout: .seconds(5), "the sleep scheduled") { loop.scheduledJobCount > before }
          }
          sleeper.cancel()
          await sleeper.value
        }
        await execShutdown(loop)
      }
      let poller = UncheckedSendableBox({ weakPoller == nil })
      return await execOnNewThread {
        let deadline = ContinuousClock.now.advanced(by: .seconds(2 * watchdogScale))
        while !poller.value() && ContinuousClock.now < deadline { usleep(1_000) }
        return poller.value()
      }
    }
    let withoutSleep = try await pollerReleased(sleeping: false)
    let withSleep = try await pollerReleased(sleeping: true)
    #expect(withoutSleep, "control: a plain loop kept its poller")
    #expect(withSleep, "a loop with a cancelled pending sleep kept its poller (and descriptors)")
  }

  /// A loop-preferring task's sleep ends during a modal run of another mode (the every-mode timer
  /// fires there): its `stop()` ends the modal run, long before the modal run's limit.
  @Test func aSleepEndsDuringAModalRunAndStopsIt() async throws {
    let loop = try RunLoopThread(name: "r17-modal")
    let keep = LoopTimer(after: .seconds(3600)) { _ in }
    loop.add(keep, to: r17ModeModal)
    let result = try await withWatchdog(timeout: .seconds(20), "modal run") { () -> RunLoopRunResult in
      let sleeper = Task(executorPreference: loop) {
        try? await Task.sleep(for: .milliseconds(20))
        loop.stop()
      }
      let result = try await loop.runModal(mode: r17ModeModal, for: .seconds(10))
      await sleeper.value
      return result
    }
    keep.invalidate()
    await execShutdown(loop)
    #expect(result == .stopped)
  }

  /// Sleeps pending on a loop that shuts down: none hangs and none ends early (they wait for their
  /// deadline elsewhere); a `LoopClock` sleep on the loop ends with a visible `CancellationError`.
  @Test func sleepsPendingAtShutdownEndNeitherHungNorEarly() async throws {
    let loop = try RunLoopThread(name: "r17-sleeps")
    let early = AtomicCounter()
    let finished = AtomicCounter()
    let clockErrors = AtomicCounter()
    var tasks: [Task<Void, Never>] = []
    for index in 0..<40 {
      tasks.append(
        Task(executorPreference: loop) {
          let start = ContinuousClock.now
          let delay = Duration.milliseconds(5 + index % 20)
          do {
            try await Task.sleep(for: delay)
            if ContinuousClock.now - start < delay { early.increment() }
          } catch {}
          finished.increment()
        })
    }
    let clockSleeper = Task {
      do { try await loop.clock.sleep(for: .seconds(30)) } catch is CancellationError { clockErrors.increment() } catch
      {}
    }
    _ = await execOnNewThread { usleep(2_000) }
    await execShutdown(loop)
    let all = tasks
    let done: Void? = try await withWatchdog(timeout: .seconds(20), "sleepers after shutdown") {
      for task in all { await task.value }
      await clockSleeper.value
    }
    #expect(done != nil)
    #expect(finished.current == 40)
    #expect(early.current == 0)
    #expect(clockErrors.current == 1)
  }
}

extension RunLoopThread {
  /// Runs an empty block on the loop and waits for it, unless the loop has shut down.
  fileprivate func performAndWaitIfRunning(_ body: @escaping @Sendable () -> Void) -> Bool {
    (try? performAndWait(body)) != nil
  }
}
