import Glibc
import Testing

@testable import AsyncRunLoop

// Review round 26: one member lifecycle under concurrency, at scale, with `.common` modes.
// Every test states the documented promise it attacks and asserts exact counts.

/// An actor pinned to a loop whose method runs the loop nested (from an executor job).
private actor R26NestingActor: LoopActor {
  nonisolated let loop: RunLoopThread
  let nest: @Sendable () -> Void
  init(loop: RunLoopThread, nest: @escaping @Sendable () -> Void) {
    self.loop = loop
    self.nest = nest
  }
  func nestOnce() { nest() }
}

/// The books of a command source under test: how often each command was delivered.
private final class R26Ledger: Sendable {
  let delivered = Guarded<[Int: Int]>([:])
  let order = Guarded<[Int]>([])
  let accepted = Guarded<Set<Int>>([])

  func deliver(_ command: Int) {
    delivered.withLock { $0[command, default: 0] += 1 }
    order.withLock { $0.append(command) }
  }

  func accept(_ command: Int) { _ = accepted.withLock { $0.insert(command) } }

  /// What went wrong: duplicates, deliveries of refused commands, accepted commands lost
  /// (beyond `unaccounted`, the source's pending and dropped counts), and per-producer order.
  func problems(unaccounted: Int = 0, checkOrder: Bool = true) -> [String] {
    var problems: [String] = []
    let delivered = delivered.snapshot
    let accepted = accepted.snapshot
    let duplicates = delivered.filter { $0.value != 1 }
    if !duplicates.isEmpty { problems.append("delivered more than once: \(duplicates.keys.sorted().prefix(5))") }
    let refused = Set(delivered.keys).subtracting(accepted)
    if !refused.isEmpty { problems.append("delivered but refused: \(refused.sorted().prefix(5))") }
    let lost = accepted.subtracting(delivered.keys)
    if lost.count != unaccounted {
      problems.append("accepted \(accepted.count), delivered \(delivered.count), unaccounted \(unaccounted)")
    }
    // Per producer (command / 1000), commands come in posting order.
    var last: [Int: Int] = [:]
    for command in order.snapshot where checkOrder {
      let producer = command / 1000
      if let previous = last[producer], previous >= command {
        problems.append("producer \(producer): \(command) after \(previous)")
        break
      }
      last[producer] = command
    }
    return problems
  }
}

/// Posts `count` commands of `producer` (numbered `producer * 1000 + index`), noting the accepted.
private func postAll(_ commands: CommandSource<Int>, _ ledger: R26Ledger, producer: Int, count: Int) {
  for index in 0..<count {
    let command = producer * 1000 + index
    if commands.post(command) { ledger.accept(command) }
  }
}

@Suite struct ReviewRound26Tests {
  // MARK: - CommandSource: posts racing invalidate, removal, shutdown

  /// Promise (CommandSource): every command `post` accepted is delivered exactly once, before
  /// `cancel`, also when the invalidation races the shutdown; accepted = delivered + pending +
  /// dropped; cancel exactly once per schedule. The source sits in `.common` and a named mode.
  @Test func postsRacingInvalidateAndShutdownAreDeliveredExactlyOnce() async throws {
    let failures = try await failuresOverRounds(150, budget: .seconds(3), "posts vs invalidate vs shutdown") {
      round, failures in
      guard let loop = try? RunLoopThread(name: "r26-post") else { return failures.append("no loop") }
      let ledger = R26Ledger()
      let schedules = AtomicCounter()
      let cancels = AtomicCounter()
      let commands = CommandSource<Int>(
        schedule: { _, _, _ in schedules.increment() }, cancel: { _, _ in cancels.increment() }
      ) { ledger.deliver($0) }
      loop.add(commands.source, to: .common)
      loop.add(commands.source, to: RunLoopMode("r26-extra"))
      var bodies: [@Sendable () -> Void] = (0..<3).map { producer in
        { postAll(commands, ledger, producer: producer, count: 40) }
      }
      bodies.append { commands.source.invalidate() }
      bodies.append { loop.shutdownAndWait() }
      if round % 2 == 0 { bodies.append { loop.remove(commands.source, from: .common) } }
      race(bodies)
      let unaccounted = commands.pendingCount + commands.droppedCount
      for problem in ledger.problems(unaccounted: unaccounted) { failures.append("round \(round): \(problem)") }
      if commands.post(-1) { failures.append("round \(round): a post after the end was accepted") }
      if cancels.current != schedules.current || cancels.current > 1 {
        failures.append("round \(round): schedules \(schedules.current), cancels \(cancels.current)")
      }
    }
    #expect(failures == [])
  }

  /// Promise (Members: one lifecycle): dropping the last reference to a loop drains it like a
  /// shutdown: commands accepted while the loop was busy are delivered exactly once, then cancel
  /// runs once. Dropping the `CommandSource` itself invalidates it the same way.
  @Test(arguments: [false, true])
  func droppingTheLoopOrTheSourceWithCommandsPendingDeliversThem(dropSource: Bool) async throws {
    let failures = try await failuresOverRounds(60, budget: .seconds(3), "drop with commands pending") {
      round, failures in
      let ledger = R26Ledger()
      let cancels = AtomicCounter()
      guard var loop = try? RunLoopThread(name: "r26-drop") else { return failures.append("no loop") }
      let keeper = Guarded<CommandSource<Int>?>(nil)
      let release: TestGate = {
        let source = CommandSource<Int>(cancel: { _, _ in cancels.increment() }) { ledger.deliver($0) }
        loop.add(source.source, to: .common)
        let release = blockLoop(loop)
        race((0..<2).map { producer in { postAll(source, ledger, producer: producer, count: 50) } })
        if !dropSource { keeper.withLock { $0 = source } }
        return release
      }()
      if !dropSource { loop = (try? RunLoopThread(name: "r26-other")) ?? loop }  // drops the last reference
      release.open()
      waitUntil(timeout: .seconds(10), "cancel after the drop") { cancels.current >= 1 }
      loop.shutdownAndWait()
      keeper.withLock { $0 = nil }
      for problem in ledger.problems() { failures.append("round \(round): \(problem)") }
      if cancels.current != 1 { failures.append("round \(round): cancels \(cancels.current)") }
    }
    #expect(failures == [])
  }

  /// Promise (CommandSource, InputSource): a source removed from its last mode may be added to
  /// any loop at once, from any thread; cancel runs exactly once per schedule, per loop; the
  /// commands are delivered exactly once and in posting order per producer while a mover thread
  /// shuttles the source between two loops' `.common` modes.
  @Test func shuttlingBetweenTwoLoopsKeepsSchedulesPairedAndCommandsExact() async throws {
    let result = try await withWatchdogOnThread(timeout: .seconds(40), "shuttle between loops") {
      () throws -> (problems: [String], unpaired: [String], schedules: Int) in
      let loopA = try RunLoopThread(name: "r26-A")
      let loopB = try RunLoopThread(name: "r26-B")
      let pairs = PairLog()
      let ledger = R26Ledger()
      let commands = CommandSource<Int>(
        schedule: { _, loop, _ in pairs.schedule(loop) }, cancel: { _, loop in pairs.cancel(loop) }
      ) { ledger.deliver($0) }
      loopA.add(commands.source, to: .common)
      let mover: @Sendable () -> Void = {
        for step in 0..<300 {
          let (from, to) = step % 2 == 0 ? (loopA, loopB) : (loopB, loopA)
          from.remove(commands.source, from: .common)
          to.add(commands.source, to: .common)
        }
      }
      let producers: [@Sendable () -> Void] = (0..<2).map { producer in
        { postAll(commands, ledger, producer: producer, count: 300) }
      }
      race([mover] + producers)
      commands.source.invalidate()
      _ = try loopA.performAndWait {}
      _ = try loopB.performAndWait {}
      loopA.shutdownAndWait()
      loopB.shutdownAndWait()
      let schedules = pairs.counts.snapshot.values.reduce(0) { $0 + $1.schedule }
      return (ledger.problems(unaccounted: commands.pendingCount + commands.droppedCount), pairs.unpaired, schedules)
    }
    guard let result else { return }
    #expect(result.problems == [])
    #expect(result.unpaired == [])
    #expect(result.schedules >= 1)
  }

  // MARK: - Sequences: producers racing the end

  /// Promise (SourceSequence): every accepted element is delivered exactly once and in order per
  /// producer, unless the consumer stops first; `invalidate()` and the shutdown deliver what was
  /// accepted and then end `for await`; `onCancel` runs exactly once. Ending 0: invalidate;
  /// 1: shutdown; 2: the consumer task is cancelled (then delivered ⊆ accepted).
  @Test(arguments: [0, 1, 2])
  func sourceSequenceProducersRacingTheEnd(ending: Int) async throws {
    let failures = try await withWatchdog(timeout: .seconds(60), "sequence producers vs end") { () -> [String] in
      var failures: [String] = []
      for round in 0..<60 {
        let loop = try RunLoopThread(name: "r26-seq")
        let cancels = AtomicCounter()
        let sequence = loop.sourceSequence(
          of: Int.self, modes: [.common, RunLoopMode("r26-seq-x")], onCancel: { _ in cancels.increment() })
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

  /// Promise (TimerSequence): it ends on `invalidate()` or the loop's shutdown, also when both
  /// race each other and a fast repeating timer: `for await` never hangs.
  @Test func timerSequenceEndsWhenInvalidateRacesShutdown() async throws {
    let ended = try await withWatchdog(timeout: .seconds(60), "timer sequence vs end") { () -> Int in
      var ended = 0
      for round in 0..<80 {
        let loop = try RunLoopThread(name: "r26-tick")
        let ticks = loop.timer(every: .microseconds(200), modes: [.common, RunLoopMode("r26-tick-x")])
        let consumer = Task { () -> Int in
          var count = 0
          for await _ in ticks { count += 1 }
          return count
        }
        var bodies: [@Sendable () -> Void] = [{ loop.shutdownAndWait() }]
        if round % 2 == 0 { bodies.append { ticks.invalidate() } }
        if round % 3 == 0 { bodies.append { loop.addModeToCommonModes(RunLoopMode("r26-tick-y")) } }
        await race(bodies)
        _ = await consumer.value
        ended += 1
      }
      return ended
    }
    #expect(ended == 80)
  }

  // MARK: - Common modes

  /// Promise (RunLoopThread+Members): a member added to `.common` is in every common mode, also
  /// one that joins the common set later; schedule once per join of the loop, cancel exactly once
  /// per schedule. One thread adds modes to the common set while another adds and removes an
  /// input source and an observer in `.common`; afterwards, each common mode runs the source
  /// exactly once per signal and tells the observer exactly once per entry.
  @Test func membersInCommonReachModesAddedToTheSetConcurrently() async throws {
    let failures = try await failuresOverRounds(25, budget: .seconds(4), "common modes vs churn") {
      round, failures in
      guard let loop = try? RunLoopThread(name: "r26-common") else { return failures.append("no loop") }
      defer { loop.shutdownAndWait() }
      let schedules = AtomicCounter()
      let cancels = AtomicCounter()
      let performs = AtomicCounter()
      let entries = AtomicCounter()
      let source = InputSource(
        schedule: { _, _, _ in schedules.increment() }, cancel: { _, _ in cancels.increment() }
      ) { _ in performs.increment() }
      let observer = LoopObserver(activities: .entry) { _, _ in entries.increment() }
      let modes = (0..<16).map { RunLoopMode("r26-c\(round)-\($0)") }
      let addModes: @Sendable () -> Void = { for mode in modes { loop.addModeToCommonModes(mode) } }
      let churn: @Sendable () -> Void = {
        for index in 0..<60 {
          loop.add(source, to: .common)
          loop.add(observer, to: .common)
          if index % 3 == 0 { loop.add(source, to: modes[index % modes.count]) }
          loop.remove(source, from: .common)
          loop.remove(observer, from: .common)
          if index % 3 == 0 { loop.remove(source, from: modes[index % modes.count]) }
        }
        loop.add(source, to: .common)
        loop.add(observer, to: .common)
      }
      race([addModes, churn])
      let perMode: [String]? = try? loop.performAndWait { () -> [String] in
        var wrong: [String] = []
        for mode in modes {
          let (p, e) = (performs.current, entries.current)
          source.signal()
          let result = loop.run(mode: mode, until: .now)
          if performs.current - p != 1 || entries.current - e != 1 {
            wrong.append("\(mode): performs +\(performs.current - p), entries +\(entries.current - e), \(result)")
          }
        }
        if schedules.current != cancels.current + 1 {
          wrong.append("on the loop: schedules \(schedules.current), cancels \(cancels.current)")
        }
        return wrong
      }
      for problem in perMode ?? ["performAndWait refused"] { failures.append("round \(round): \(problem)") }
      source.invalidate()
      observer.invalidate()
      _ = try? loop.performAndWait {}
      if schedules.current != cancels.current {
        failures.append("round \(round): after invalidate schedules \(schedules.current), cancels \(cancels.current)")
      }
    }
    #expect(failures == [])
  }

  /// Promise (InputSource): cancel exactly once per schedule, also when the invalidation races
  /// removals from each of the source's modes (`.common`, two named ones) and a re-add; an
  /// invalidated source is never performed after the loop applied the invalidation.
  @Test func removalsFromEveryModeRacingInvalidateCancelOncePerSchedule() async throws {
    let failures = try await failuresOverRounds(300, budget: .seconds(3), "remove vs invalidate") { round, failures in
      let loop = Self.sharedLoop
      let (modeA, modeB) = (RunLoopMode("r26-ra"), RunLoopMode("r26-rb"))
      let schedules = AtomicCounter()
      let cancels = AtomicCounter()
      let source = InputSource(
        schedule: { _, _, _ in schedules.increment() }, cancel: { _, _ in cancels.increment() }
      ) { _ in }
      loop.add(source, to: .common)
      loop.add(source, to: modeA)
      loop.add(source, to: modeB)
      race([
        { loop.remove(source, from: modeA) },
        { loop.remove(source, from: .common) },
        {
          loop.remove(source, from: modeB)
          loop.add(source, to: modeB)
        },
        { source.invalidate() },
        { source.signal() },
      ])
      _ = try? loop.performAndWait {}
      if schedules.current != cancels.current || cancels.current < 1 {
        failures.append("round \(round): schedules \(schedules.current), cancels \(cancels.current)")
      }
    }
    #expect(failures == [])
  }

  static let sharedLoop: RunLoopThread = RunLoopThread.start(named: "r26-shared")

  // MARK: - Timers

  /// Promise (LoopTimer.invalidateAndWait): after it returns, no callout of the timer runs
  /// anywhere; racing it: removals from its modes, `setFireDate` from another thread, and
  /// adding the mode to the common set. A zero-interval timer fires on every pass.
  @Test func noTimerCalloutAfterInvalidateAndWaitReturnsWhileRescheduledAndRemoved() async throws {
    let failures = try await failuresOverRounds(200, budget: .seconds(3), "invalidateAndWait vs reschedule") {
      round, failures in
      let loop = Self.sharedLoop
      let done = Guarded(false)
      let late = AtomicCounter()
      let fires = AtomicCounter()
      let timer = LoopTimer(after: .zero, repeatingEvery: .zero) { _ in
        fires.increment()
        if done.snapshot { late.increment() }
      }
      let mode = RunLoopMode("r26-tm")
      loop.add(timer, to: .common)
      loop.add(timer, to: mode)
      waitUntil(timeout: .seconds(10), "the first fire") { fires.current > 0 }
      race([
        {
          try? timer.invalidateAndWait()
          done.withLock { $0 = true }
        },
        { for _ in 0..<20 { timer.setFireDate(.now) } },
        { loop.remove(timer, from: mode) },
        { loop.addModeToCommonModes(mode) },
      ])
      _ = try? loop.performAndWait {}
      _ = try? loop.performAndWait {}
      if late.current != 0 { failures.append("round \(round): \(late.current) callouts after invalidateAndWait") }
      if timer.isValid { failures.append("round \(round): still valid") }
    }
    #expect(failures == [])
  }

  /// Promise (RunLoopThread+Members): a change from another thread is applied before the loop
  /// runs any block sent after it. So once a removal from the timer's last running mode and a
  /// `performAndWait` round trip returned, the timer never fires again, even while a third
  /// thread keeps rescheduling it; added back, it fires again.
  @Test func aRemovedTimerStaysSilentAfterARoundTripWhileRescheduled() async throws {
    let failures = try await failuresOverRounds(150, budget: .seconds(3), "remove vs setFireDate") {
      round, failures in
      let loop = Self.sharedLoop
      let fires = AtomicCounter()
      let timer = LoopTimer(after: .zero, repeatingEvery: .zero) { _ in fires.increment() }
      defer { timer.invalidate() }
      let idle = RunLoopMode("r26-idle")  // never run: keeps the timer on the loop
      loop.add(timer, to: .common)
      loop.add(timer, to: idle)
      waitUntil(timeout: .seconds(10), "the first fire") { fires.current > 0 }
      race([
        { loop.remove(timer, from: .common) },
        { for _ in 0..<20 { timer.setFireDate(.now) } },
      ])
      _ = try? loop.performAndWait {}
      let settled = fires.current
      for _ in 0..<5 {
        loop.wakeUp()
        _ = try? loop.performAndWait {}
      }
      if fires.current != settled {
        failures.append("round \(round): fired \(fires.current - settled) times after the removal")
      }
      loop.add(timer, to: .common)
      waitUntil(timeout: .seconds(10), "a fire after the re-add") { fires.current > settled }
    }
    #expect(failures == [])
  }

  // MARK: - Nested runs vs shutdown

  /// Promise (Nested runs, Shutdown): a run nested in any kind of callout ends when another
  /// thread shuts the loop down (`.stopped`: "shutdown() ends every run of the loop ... at every
  /// nesting level"), the shutdown returns, and every source's cancel routine runs exactly once.
  @Test(arguments: ["observer", "timer", "source", "command", "descriptor", "schedule", "block", "actor"])
  func nestedRunInACalloutEndsWhenAnotherThreadShutsDown(kind: String) async throws {
    let failures = try await withWatchdog(timeout: .seconds(60), "nested \(kind) vs shutdown") { () -> [String] in
      var failures: [String] = []
      for round in 0..<25 {
        let loop = try RunLoopThread(name: "r26-nest")
        let nested = RunLoopMode("r26-nested")
        let keep = LoopTimer(after: .seconds(3_600)) { _ in }
        loop.add(keep, to: nested)
        let entered = TestGate()
        let results = Guarded<[RunLoopRunResult]>([])
        let once = Guarded(false)
        let nest: @Sendable () -> Void = {
          let first = once.withLock { value in
            defer { value = true }
            return !value
          }
          guard first else { return }
          entered.open()
          let result = loop.run(mode: nested, until: .distantFuture)
          results.withLock { $0.append(result) }
        }
        let witnessCancels = AtomicCounter()
        let witness = InputSource(cancel: { _, _ in witnessCancels.increment() }) { _ in }
        loop.add(witness, to: .common)
        loop.add(witness, to: nested)
        var keepAlive: [AnyObject] = [keep, witness]
        var pipeEnds: (read: Int32, write: Int32)?
        var actorTask: Task<Void, Never>?
        switch kind {
        case "observer":
          let observer = LoopObserver(activities: [.beforeWaiting, .afterWaiting]) { _, _ in nest() }
          loop.add(observer, to: .common)
          keepAlive.append(observer)
          loop.wakeUp()
        case "timer":
          let timer = LoopTimer(after: .zero) { _ in nest() }
          loop.add(timer, to: .common)
          keepAlive.append(timer)
        case "source":
          let source = InputSource { _ in nest() }
          loop.add(source, to: .common)
          source.signal()
          keepAlive.append(source)
        case "command":
          let commands = CommandSource<Int> { _ in nest() }
          loop.add(commands.source, to: .common)
          commands.post(1)
          commands.post(2)
          keepAlive.append(commands)
        case "descriptor":
          let ends = makePipe()
          pipeEnds = ends
          let source = DescriptorSource(descriptor: ends.read) { _, _ in nest() }
          try loop.add(source, to: .common)
          writeByte(ends.write)
          keepAlive.append(source)
        case "schedule":
          let source = InputSource(schedule: { _, _, _ in nest() }) { _ in }
          loop.add(source, to: .common)
          keepAlive.append(source)
        case "block":
          loop.perform { nest() }
        default:
          let actor = R26NestingActor(loop: loop, nest: nest)
          actorTask = Task(executorPreference: loop) { await actor.nestOnce() }
        }
        let didEnter = await execOnNewThread { entered.wait(timeout: .seconds(10)) }
        if !didEnter {
          failures.append("round \(round): the \(kind) callout never ran")
        }
        await execOnNewThread { loop.shutdownAndWait() }
        await actorTask?.value
        if results.snapshot != [.stopped] {
          failures.append("round \(round): nested runs returned \(results.snapshot)")
        }
        if witnessCancels.current != 1 { failures.append("round \(round): witness cancels \(witnessCancels.current)") }
        withExtendedLifetime(keepAlive) {}
        keepAlive.removeAll()
        if let pipeEnds {
          close(pipeEnds.read)
          close(pipeEnds.write)
        }
        if failures.count > 5 { break }
      }
      return failures
    }
    #expect(failures == [])
  }

  /// Promise (InputSource, Shutdown): a cancel routine runs exactly once, also when it runs the
  /// loop nested (during the shutdown's drain, or during an invalidation that races the
  /// shutdown from another thread); the nested run returns and the shutdown completes.
  @Test(arguments: [false, true])
  func nestedRunInACancelRoutineDuringShutdown(invalidateFirst: Bool) async throws {
    let failures = try await failuresOverRounds(40, budget: .seconds(4), "nested cancel vs shutdown") {
      round, failures in
      guard let loop = try? RunLoopThread(name: "r26-cancel") else { return failures.append("no loop") }
      let nested = RunLoopMode("r26-cn")
      let keep = LoopTimer(after: .seconds(3_600)) { _ in }
      loop.add(keep, to: nested)
      let cancels = AtomicCounter()
      let returned = AtomicCounter()
      let otherCancels = AtomicCounter()
      let other = InputSource(cancel: { _, _ in otherCancels.increment() }) { _ in }
      let source = InputSource(
        cancel: { _, loop in
          cancels.increment()
          loop.run(mode: nested, for: .milliseconds(50))
          returned.increment()
        }
      ) { _ in }
      loop.add(source, to: .common)
      loop.add(other, to: .common)
      loop.add(other, to: nested)
      if invalidateFirst {
        race([{ source.invalidate() }, { loop.shutdownAndWait() }])
      } else {
        loop.shutdownAndWait()
      }
      if cancels.current != 1 || returned.current != 1 {
        failures.append("round \(round): cancels \(cancels.current), returned \(returned.current)")
      }
      if otherCancels.current != 1 { failures.append("round \(round): other cancels \(otherCancels.current)") }
      withExtendedLifetime(keep) {}
    }
    #expect(failures == [])
  }

  // MARK: - Two loops

  /// Promise (Members: one lifecycle): a member is on one loop at a time; once removed from its
  /// last mode it may be added to any loop at once, from any thread. Timers and observers moved
  /// between two loops by two threads at once (each thread moves only after its own removal) end
  /// on exactly one loop: after invalidation, neither loop runs them again.
  @Test func timersAndObserversMovedBetweenLoopsEndSilent() async throws {
    let result = try await withWatchdogOnThread(timeout: .seconds(40), "timers and observers between loops") {
      () throws -> Int in
      let loopA = try RunLoopThread(name: "r26-tA")
      let loopB = try RunLoopThread(name: "r26-tB")
      defer {
        loopA.shutdownAndWait()
        loopB.shutdownAndWait()
      }
      let fires = AtomicCounter()
      let told = AtomicCounter()
      let timer = LoopTimer(after: .zero, repeatingEvery: .microseconds(100)) { _ in fires.increment() }
      let observer = LoopObserver(activities: .all) { _, _ in told.increment() }
      loopA.add(timer, to: .common)
      loopA.add(observer, to: .common)
      let mover: @Sendable (Int) -> Void = { parity in
        for step in 0..<200 {
          let (from, to) = step % 2 == 0 ? (loopA, loopB) : (loopB, loopA)
          if parity == 0 {
            from.remove(timer, from: .common)
            to.add(timer, to: .common)
          } else {
            from.remove(observer, from: .common)
            to.add(observer, to: .common)
          }
        }
      }
      race([{ mover(0) }, { mover(1) }])
      timer.invalidate()
      observer.invalidate()
      _ = try loopA.performAndWait {}
      _ = try loopB.performAndWait {}
      let (f, t) = (fires.current, told.current)
      for _ in 0..<5 {
        loopA.wakeUp()
        loopB.wakeUp()
        _ = try loopA.performAndWait {}
        _ = try loopB.performAndWait {}
      }
      return (fires.current - f) + (told.current - t)
    }
    #expect(result == 0)
  }

  // MARK: - Sharper races

  /// Promise (RunLoopThread+Members, "its last mode"): removing `.common` takes a member out of
  /// every common mode, including one that joins the set at the same moment from another thread
  /// (either order ends with the source in no common mode), while a mode it was added to by name
  /// keeps it; cancel runs once, when the last named mode goes.
  @Test func removingCommonRacingAModeJoiningTheSetLeavesOnlyNamedModes() async throws {
    let failures = try await failuresOverRounds(200, budget: .seconds(3), "remove .common vs join") {
      round, failures in
      let loop = Self.sharedLoop
      let joining = RunLoopMode("r26-join-\(round)")
      let named = RunLoopMode("r26-named-\(round)")
      let schedules = AtomicCounter()
      let cancels = AtomicCounter()
      let performs = AtomicCounter()
      let source = InputSource(
        schedule: { _, _, _ in schedules.increment() }, cancel: { _, _ in cancels.increment() }
      ) { _ in performs.increment() }
      loop.add(source, to: .common)
      loop.add(source, to: named)
      race([{ loop.addModeToCommonModes(joining) }, { loop.remove(source, from: .common) }])
      let seen: (joining: Int, named: Int, cancels: Int)? = try? loop.performAndWait {
        let before = performs.current
        source.signal()
        loop.run(mode: joining, until: .now)
        let inJoining = performs.current - before
        loop.run(mode: named, until: .now)
        return (inJoining, performs.current - before - inJoining, cancels.current)
      }
      if let seen, seen.joining != 0 || seen.named != 1 || seen.cancels != 0 {
        failures.append("round \(round): joining +\(seen.joining), named +\(seen.named), cancels \(seen.cancels)")
      }
      loop.remove(source, from: named)
      _ = try? loop.performAndWait {}
      if schedules.current != 1 || cancels.current != 1 {
        failures.append("round \(round): schedules \(schedules.current), cancels \(cancels.current)")
      }
      source.invalidate()
    }
    #expect(failures == [])
  }

  /// Promise (CommandSource): commands posted before the first `add` wait for it; when that add
  /// races the loop's shutdown, either the loop takes the source (delivers, then cancel once per
  /// schedule) or it has terminated (the add invalidates the source, which drops what it holds and
  /// counts it): accepted = delivered + pendingCount + droppedCount, pendingCount 0.
  @Test func postsBeforeAnAddThatRacesTheShutdownAreAccountedFor() async throws {
    let failures = try await failuresOverRounds(200, budget: .seconds(3), "add vs shutdown") { round, failures in
      guard let loop = try? RunLoopThread(name: "r26-addshut") else { return failures.append("no loop") }
      let ledger = R26Ledger()
      let schedules = AtomicCounter()
      let cancels = AtomicCounter()
      let commands = CommandSource<Int>(
        schedule: { _, _, _ in schedules.increment() }, cancel: { _, _ in cancels.increment() }
      ) { ledger.deliver($0) }
      postAll(commands, ledger, producer: 0, count: 10)
      race([
        { loop.add(commands.source, to: .common) },
        { loop.shutdownAndWait() },
        { postAll(commands, ledger, producer: 1, count: 20) },
      ])
      loop.shutdownAndWait()
      if commands.source.isValid { failures.append("round \(round): still valid after the shutdown") }
      if commands.pendingCount != 0 { failures.append("round \(round): \(commands.pendingCount) still pending") }
      for problem in ledger.problems(unaccounted: commands.droppedCount) {
        failures.append("round \(round): \(problem)")
      }
      if schedules.current != cancels.current {
        failures.append("round \(round): schedules \(schedules.current), cancels \(cancels.current)")
      }
    }
    #expect(failures == [])
  }

  /// Promise (CommandSource): a source removed from its last mode and invalidated is delivered
  /// by the loop that lets go of it last; if that loop terminated first, what it holds is dropped
  /// and counted. Removal, invalidation and the loop's shutdown race; posts race all three.
  @Test func removeThenInvalidateRacingShutdownAccountsForEveryCommand() async throws {
    let failures = try await failuresOverRounds(200, budget: .seconds(3), "remove+invalidate vs shutdown") {
      round, failures in
      guard let loop = try? RunLoopThread(name: "r26-rem") else { return failures.append("no loop") }
      let ledger = R26Ledger()
      let schedules = AtomicCounter()
      let cancels = AtomicCounter()
      let commands = CommandSource<Int>(
        schedule: { _, _, _ in schedules.increment() }, cancel: { _, _ in cancels.increment() }
      ) { ledger.deliver($0) }
      loop.add(commands.source, to: .common)
      let release = blockLoop(loop)
      postAll(commands, ledger, producer: 0, count: 10)
      race([
        {
          loop.remove(commands.source, from: .common)
          commands.source.invalidate()
        },
        {
          release.open()
          loop.shutdownAndWait()
        },
        { postAll(commands, ledger, producer: 1, count: 30) },
      ])
      if commands.pendingCount != 0 { failures.append("round \(round): \(commands.pendingCount) still pending") }
      for problem in ledger.problems(unaccounted: commands.droppedCount) {
        failures.append("round \(round): \(problem)")
      }
      if schedules.current != 1 || cancels.current != 1 {
        failures.append("round \(round): schedules \(schedules.current), cancels \(cancels.current)")
      }
    }
    #expect(failures == [])
  }

  /// Promise (CommandSource.drain): a handler that invalidates its own source gets the rest of
  /// the batch delivered first, exactly once, before `cancel`; posts from other threads racing it
  /// are either refused or delivered. The source is in `.common` and a named mode.
  @Test func aHandlerInvalidatingItsOwnSourceWhilePostsRace() async throws {
    let failures = try await failuresOverRounds(200, budget: .seconds(3), "self-invalidating handler") {
      round, failures in
      let loop = Self.sharedLoop
      let ledger = R26Ledger()
      let cancels = AtomicCounter()
      let afterCancel = AtomicCounter()
      let holder = Guarded<InputSource?>(nil)
      let commands = CommandSource<Int>(cancel: { _, _ in cancels.increment() }) { command in
        if cancels.current > 0 { afterCancel.increment() }
        ledger.deliver(command)
        if command % 1000 == 5 { holder.snapshot?.invalidate() }
      }
      holder.withLock { $0 = commands.source }
      loop.add(commands.source, to: .common)
      loop.add(commands.source, to: RunLoopMode("r26-self"))
      let producers: [@Sendable () -> Void] = (0..<3).map { producer in
        { postAll(commands, ledger, producer: producer, count: 30) }
      }
      race(producers)
      waitUntil(timeout: .seconds(10), "the cancel") { cancels.current >= 1 }
      _ = try? loop.performAndWait {}
      for problem in ledger.problems(unaccounted: commands.pendingCount + commands.droppedCount) {
        failures.append("round \(round): \(problem)")
      }
      if cancels.current != 1 || afterCancel.current != 0 {
        failures.append("round \(round): cancels \(cancels.current), delivered after cancel \(afterCancel.current)")
      }
      holder.withLock { $0 = nil }
    }
    #expect(failures == [])
  }

  /// Promise (SourceSequence): a consumer running on the source's own loop (a task that prefers
  /// the loop) still ends its `for await`, with every accepted element delivered once, when the
  /// loop shuts down while producers post.
  @Test func aConsumerOnTheLoopItselfEndsAtShutdownWithEveryElement() async throws {
    let failures = try await withWatchdog(timeout: .seconds(60), "on-loop consumer vs shutdown") { () -> [String] in
      var failures: [String] = []
      for round in 0..<60 {
        let loop = try RunLoopThread(name: "r26-onloop")
        let sequence = loop.sourceSequence(of: Int.self, modes: [.common])
        let consumer = Task(executorPreference: loop) { () -> [Int] in
          var got: [Int] = []
          for await value in sequence { got.append(value) }
          return got
        }
        let accepted = Guarded<[Int]>([])
        var bodies: [@Sendable () -> Void] = (0..<2).map { producer in
          {
            for index in 0..<50 {
              let value = producer * 1000 + index
              if sequence.post(value) == .enqueued { accepted.withLock { $0.append(value) } }
            }
          }
        }
        bodies.append { loop.shutdownAndWait() }
        await race(bodies)
        let got = await consumer.value
        if got.sorted() != accepted.snapshot.sorted() {
          failures.append("round \(round): accepted \(accepted.snapshot.count), delivered \(got.count)")
        }
        if failures.count > 5 { break }
      }
      return failures
    }
    #expect(failures == [])
  }

  /// Promise (DescriptorSource in `.common`): a readiness source added to `.common` is watched
  /// in every common mode, also modes that join the set while another thread adds and removes
  /// it; after it is removed from `.common` no common mode runs it.
  @Test func aDescriptorSourceInCommonFollowsModesJoiningTheSet() async throws {
    let failures = try await failuresOverRounds(30, budget: .seconds(4), "descriptor in common") {
      round, failures in
      let loop = Self.sharedLoop
      let ends = makePipe()
      defer {
        close(ends.read)
        close(ends.write)
      }
      let fires = AtomicCounter()
      let source = DescriptorSource(descriptor: ends.read) { _, _ in fires.increment() }
      let modes = (0..<8).map { RunLoopMode("r26-d\(round)-\($0)") }
      let churn: @Sendable () -> Void = {
        for _ in 0..<30 {
          try? loop.add(source, to: .common)
          loop.remove(source, from: .common)
        }
        try? loop.add(source, to: .common)
      }
      race([{ for mode in modes { loop.addModeToCommonModes(mode) } }, churn])
      writeByte(ends.write)
      let missing: [String]? = try? loop.performAndWait {
        var missing: [String] = []
        for mode in modes {
          let before = fires.current
          loop.run(mode: mode, until: .now)
          if fires.current == before { missing.append("\(mode)") }
        }
        return missing
      }
      if let missing, !missing.isEmpty { failures.append("round \(round): not fired in \(missing)") }
      source.invalidate()
      _ = try? loop.performAndWait {}
    }
    #expect(failures == [])
  }

  // MARK: - Exact counts across moves

  /// Promise (LoopTimer.setFireDate, one lifecycle): a one-shot timer rescheduled from several
  /// threads while another moves it from one loop's `.common` to another's fires exactly once,
  /// after the last reschedule to "now", on the loop it ended on, and then is invalid.
  @Test func aOneShotTimerRescheduledWhileMovedFiresExactlyOnce() async throws {
    let failures = try await failuresOverRounds(150, budget: .seconds(3), "reschedule vs move") { round, failures in
      let loopA = Self.sharedLoop
      let loopB = Self.secondLoop
      let fires = Guarded<[String]>([])
      let timer = LoopTimer(after: .seconds(3_600)) { _ in
        fires.withLock { $0.append(RunLoopThread.current.name) }
      }
      loopA.add(timer, to: .common)
      loopA.add(timer, to: RunLoopMode("r26-never"))
      race([
        { for _ in 0..<20 { timer.setFireDate(.now.advanced(by: .seconds(3_600))) } },
        {
          loopA.remove(timer, from: .common)
          loopA.remove(timer, from: RunLoopMode("r26-never"))
          loopB.add(timer, to: .common)
        },
      ])
      timer.setFireDate(.now)
      waitUntil(timeout: .seconds(10), "the fire") { !fires.snapshot.isEmpty }
      _ = try? loopA.performAndWait {}
      _ = try? loopB.performAndWait {}
      _ = try? loopB.performAndWait {}
      if fires.snapshot != [loopB.name] || timer.isValid {
        failures.append("round \(round): fired on \(fires.snapshot), valid \(timer.isValid)")
      }
    }
    #expect(failures == [])
  }

  static let secondLoop: RunLoopThread = RunLoopThread.start(named: "r26-second")

  /// Promise (InputSource.signal): many signals before the loop gets to the source coalesce into
  /// one `perform`; signals that arrive while the source is on no loop are kept and fire once it
  /// joins one (a valid source keeps its signal for the loop it joins next). Signals race from
  /// three threads while the loop is blocked; then the source moves to another loop.
  @Test func signalsCoalesceIntoOnePerformAndSurviveAMove() async throws {
    let failures = try await failuresOverRounds(150, budget: .seconds(3), "coalescing signals") { round, failures in
      let loopA = Self.sharedLoop
      let loopB = Self.secondLoop
      let performs = Guarded<[String]>([])
      let source = InputSource { _ in performs.withLock { $0.append(RunLoopThread.current.name) } }
      defer { source.invalidate() }
      loopA.add(source, to: .common)
      loopA.add(source, to: RunLoopMode("r26-sig"))
      _ = try? loopA.performAndWait {}
      let release = blockLoop(loopA)
      race((0..<3).map { _ in { for _ in 0..<30 { source.signal() } } })
      release.open()
      // Blocks run before sources in a pass (and a block sent meanwhile may run in the same
      // work point), so a round trip alone does not prove the pass reached the sources.
      waitUntil(timeout: .seconds(10), "the fire on A") { !performs.snapshot.isEmpty }
      _ = try? loopA.performAndWait {}
      _ = try? loopA.performAndWait {}
      if performs.snapshot != [loopA.name] { failures.append("round \(round): first batch \(performs.snapshot)") }
      // Signalled while on no loop, then added to B.
      loopA.remove(source, from: .common)
      loopA.remove(source, from: RunLoopMode("r26-sig"))
      race((0..<3).map { _ in { for _ in 0..<10 { source.signal() } } })
      loopB.add(source, to: .common)
      waitUntil(timeout: .seconds(10), "the fire on B") { performs.snapshot.count >= 2 }
      _ = try? loopA.performAndWait {}
      _ = try? loopB.performAndWait {}
      if performs.snapshot != [loopA.name, loopB.name] {
        failures.append("round \(round): after the move \(performs.snapshot)")
      }
      loopB.remove(source, from: .common)
    }
    #expect(failures == [])
  }

  /// Promise (LoopObserver): a one-shot observer is told exactly once, also when it is in
  /// `.common` and several named modes and the loop enters many modes of the common set (nested
  /// runs) while another thread adds modes to the set and a third invalidates it.
  @Test func aOneShotObserverInManyModesIsToldAtMostOnce() async throws {
    let failures = try await failuresOverRounds(150, budget: .seconds(3), "one-shot observer") { round, failures in
      let loop = Self.sharedLoop
      let told = AtomicCounter()
      let observer = LoopObserver(activities: .all, repeats: false) { _, _ in told.increment() }
      let modes = (0..<6).map { RunLoopMode("r26-o\(round % 7)-\($0)") }
      loop.add(observer, to: .common)
      for mode in modes.prefix(3) { loop.add(observer, to: mode) }
      race([
        { for mode in modes { loop.addModeToCommonModes(mode) } },
        {
          _ = try? loop.performAndWait {
            for mode in modes { loop.run(mode: mode, until: .now) }
          }
        },
        { if round % 2 == 0 { observer.invalidate() } },
      ])
      _ = try? loop.performAndWait {
        for mode in modes { loop.run(mode: mode, until: .now) }
      }
      let expected = round % 2 == 0 ? 0...1 : 1...1
      if !expected.contains(told.current) || observer.isValid {
        failures.append("round \(round): told \(told.current), valid \(observer.isValid)")
      }
    }
    #expect(failures == [])
  }

  /// Promise (CommandSource): a handler that moves the source to another loop keeps the order:
  /// the first loop finishes its batch, the new loop delivers later commands after it; each
  /// command exactly once; an invalidation from another thread at any moment still delivers every
  /// accepted command before `cancel`, and cancel pairs with schedule per loop.
  @Test func handlersMovingTheirSourceBetweenLoopsWhileInvalidated() async throws {
    let failures = try await failuresOverRounds(80, budget: .seconds(4), "handler moves") { round, failures in
      let loopA = Self.sharedLoop
      let loopB = Self.secondLoop
      let ledger = R26Ledger()
      let pairs = PairLog()
      let holder = Guarded<InputSource?>(nil)
      let commands = CommandSource<Int>(
        schedule: { _, loop, _ in pairs.schedule(loop) }, cancel: { _, loop in pairs.cancel(loop) }
      ) { command in
        ledger.deliver(command)
        guard command % 7 == 0, let source = holder.snapshot else { return }
        let here = RunLoopThread.current
        let there = here === loopA ? loopB : loopA
        here.remove(source, from: .common)
        there.add(source, to: .common)
      }
      holder.withLock { $0 = commands.source }
      loopA.add(commands.source, to: .common)
      let producers: [@Sendable () -> Void] = (0..<2).map { producer in
        { postAll(commands, ledger, producer: producer, count: 120) }
      }
      race(
        producers + [
          {
            for _ in 0..<(round % 50) { sched_yield() }; commands.source.invalidate()
          }
        ])
      _ = waitUntil(timeout: .seconds(10), "every cancel") {
        let counts = pairs.counts.snapshot.values
        return counts.reduce(0) { $0 + $1.schedule } == counts.reduce(0) { $0 + $1.cancel }
      }
      _ = try? loopA.performAndWait {}
      _ = try? loopB.performAndWait {}
      for problem in ledger.problems(unaccounted: commands.pendingCount + commands.droppedCount) {
        failures.append("round \(round): \(problem)")
      }
      if !pairs.unpaired.isEmpty { failures.append("round \(round): \(pairs.unpaired)") }
      holder.withLock { $0 = nil }
    }
    #expect(failures == [])
  }

  // MARK: - Members joining a loop while it drains

  /// Promise (Shutdown; RunLoopThread+Members): the shutdown invalidates every member, and adding
  /// anything to a loop that has terminated invalidates it at once. Members added from other
  /// threads while the loop shuts down and drains therefore all end invalid, with cancel exactly
  /// once per schedule; a command posted to one of them is delivered or counted as dropped.
  @Test func membersAddedFromOtherThreadsDuringTheDrainAllEnd() async throws {
    let failures = try await failuresOverRounds(100, budget: .seconds(3), "adds vs drain") { round, failures in
      guard let loop = try? RunLoopThread(name: "r26-drainadd") else { return failures.append("no loop") }
      let schedules = AtomicCounter()
      let cancels = AtomicCounter()
      let ledger = R26Ledger()
      let made = Guarded<[CommandSource<Int>]>([])
      let timers = Guarded<[LoopTimer]>([])
      let adder: @Sendable (Int) -> Void = { producer in
        for index in 0..<20 {
          let commands = CommandSource<Int>(
            schedule: { _, _, _ in schedules.increment() }, cancel: { _, _ in cancels.increment() }
          ) { ledger.deliver($0) }
          let command = producer * 1000 + index
          if commands.post(command) { ledger.accept(command) }
          loop.add(commands.source, to: index % 2 == 0 ? .common : RunLoopMode("r26-da"))
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
        let loop = try RunLoopThread(name: "r26-drainco")
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
          loop.perform(inModes: ["r26-never-run"]) { addLate() }
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

  // MARK: - Dropping the last reference

  /// Promise (Shutdown, and dropping a loop): releasing the last reference to a loop drains it
  /// and lets its thread exit, also when that last reference is dropped on the loop's own thread
  /// (held only by a performed block, a timer's handler or a command handler, released there).
  @Test(arguments: ["block", "timer", "command"])
  func theLastReferenceDroppedOnTheLoopsOwnThread(kind: String) async throws {
    let leaked = try await withWatchdogOnThread(timeout: .seconds(40), "last reference on its thread (\(kind))") {
      () throws -> Int in
      var leaked = 0
      for round in 0..<40 {
        weak var weakLoop: RunLoopThread?
        let ran = TestGate()
        var keep: AnyObject?
        do {
          let loop = try RunLoopThread(name: "r26-self\(round % 4)")
          weakLoop = loop
          switch kind {
          case "block":
            loop.perform {
              _ = loop.name
              ran.open()
            }
          case "timer":
            // The handler captures the loop; invalidating the timer from its own callout breaks
            // the cycle, so the loop's last reference goes when the handler is released.
            let timer = LoopTimer(after: .zero) { timer in
              _ = loop.name
              timer.invalidate()
              ran.open()
            }
            loop.add(timer, to: .common)
            keep = timer
          default:
            let holder = Guarded<CommandSource<Int>?>(nil)
            let commands = CommandSource<Int> { _ in
              _ = loop.name
              holder.snapshot?.source.invalidate()
              holder.withLock { $0 = nil }
              ran.open()
            }
            holder.withLock { $0 = commands }
            loop.add(commands.source, to: .common)
            commands.post(1)
          }
        }
        _ = ran.wait(timeout: .seconds(10))
        for _ in 0..<5_000 where weakLoop != nil { usleep(1000) }
        if weakLoop != nil { leaked += 1 }
        keep = nil
        _ = keep
      }
      return leaked
    }
    #expect(leaked == 0)
  }

  /// Promise (Shutdown, and dropping a loop): async sequences made from a loop keep it alive;
  /// once the consumer is cancelled and the sequence dropped, nothing holds it: the loop is
  /// released (its thread drains and exits).
  @Test func aLoopIsReleasedOnceItsSequencesEnd() async throws {
    let leaked = try await withWatchdog(timeout: .seconds(40), "sequences keep the loop") { () -> Int in
      var leaked = 0
      for round in 0..<30 {
        weak var weakLoop: RunLoopThread?
        var consumers: [Task<Void, Never>] = []
        do {
          let loop = try RunLoopThread(name: "r26-seqdrop")
          weakLoop = loop
          let ticks = loop.timer(every: .milliseconds(1))
          let events = loop.sourceSequence(of: Int.self, modes: [.common, RunLoopMode("r26-sd")])
          consumers.append(Task { for await _ in ticks {} })
          consumers.append(Task { for await _ in events {} })
          for index in 0..<20 { _ = events.post(index) }
        }
        if round % 2 == 0 { await Task.yield() }
        for consumer in consumers { consumer.cancel() }
        for consumer in consumers { await consumer.value }
        consumers.removeAll()
        for _ in 0..<5_000 where weakLoop != nil { try await Task.sleep(for: .milliseconds(1)) }
        if weakLoop != nil { leaked += 1 }
      }
      return leaked
    }
    #expect(leaked == 0)
  }

  // MARK: - invalidateAndWait cycles

  /// Promise (LoopTimer.invalidateAndWait): it throws `wouldDeadlock` instead of waiting in a
  /// cycle: two loops' timers, each in `.common` and a named mode, whose callouts run at the same
  /// time and invalidate each other with `invalidateAndWait()`. Neither hangs, at least one
  /// throws, and both timers end invalid.
  @Test func twoTimersInvalidatingEachOtherAndWaiting() async throws {
    let overlapped = AtomicCounter()
    let failures = try await failuresOverRounds(100, budget: .seconds(4), "mutual invalidateAndWait") {
      round, failures in
      let loopA = Self.sharedLoop
      let loopB = Self.secondLoop
      let arrived = AtomicCounter()
      let threw = AtomicCounter()
      let finished = AtomicCounter()
      let pair = Guarded<[LoopTimer]>([])
      let make: @Sendable (Int) -> LoopTimer = { index in
        LoopTimer(after: .zero) { _ in
          arrived.increment()
          var spins = 0
          while arrived.current < 2 && spins < 200_000 {
            sched_yield()
            spins += 1
          }
          let other = pair.snapshot[1 - index]
          do { try other.invalidateAndWait() } catch { threw.increment() }
          finished.increment()
        }
      }
      let timers = [make(0), make(1)]
      pair.withLock { $0 = timers }
      loopA.add(timers[0], to: .common)
      loopA.add(timers[0], to: RunLoopMode("r26-iw"))
      loopB.add(timers[1], to: .common)
      waitUntil(timeout: .seconds(10), "both callouts to return") {
        finished.current == 2 || (finished.current == 1 && arrived.current == 1)
      }
      _ = try? loopA.performAndWait {}
      _ = try? loopB.performAndWait {}
      if arrived.current == 2 && threw.current == 0 { failures.append("round \(round): neither threw") }
      if arrived.current == 2 { overlapped.increment() }
      if timers.contains(where: { $0.isValid }) { failures.append("round \(round): a timer is still valid") }
    }
    #expect(failures == [])
    #expect(overlapped.current > 0, "the two callouts never ran at the same time: the test proved nothing")
  }

  // MARK: - Moving while the old loop has not applied the removal

  /// Promise (CommandSource): commands posted while the source moves from loop A (blocked, so it
  /// applies the removal late) to loop B are delivered exactly once; when the source is then
  /// invalidated, the loop that lets go of it last (A, once it applied its removal, or B)
  /// delivers what is left; cancel pairs with schedule on each loop. Variant 0: only A blocked;
  /// 1: both blocked; 2: invalidated before the add to B (the add is ignored: A delivers).
  /// A one-shot timer due on A moves with it and fires exactly once, on B.
  @Test(arguments: [0, 1, 2])
  func movingWhileTheOldLoopIsBlockedKeepsEveryCommand(variant: Int) async throws {
    let failures = try await failuresOverRounds(100, budget: .seconds(3), "move while blocked") { round, failures in
      let loopA = Self.sharedLoop
      let loopB = Self.secondLoop
      let ledger = R26Ledger()
      let pairs = PairLog()
      let fires = Guarded<[String]>([])
      let commands = CommandSource<Int>(
        schedule: { _, loop, _ in pairs.schedule(loop) }, cancel: { _, loop in pairs.cancel(loop) }
      ) { ledger.deliver($0) }
      let timer = LoopTimer(after: .zero) { _ in fires.withLock { $0.append(RunLoopThread.current.name) } }
      loopA.add(commands.source, to: .common)
      loopA.add(commands.source, to: RunLoopMode("r26-mv"))
      _ = try? loopA.performAndWait {}
      let releaseA = blockLoop(loopA)
      loopA.add(timer, to: .common)
      postAll(commands, ledger, producer: 0, count: 10)
      let releaseB = variant == 1 ? blockLoop(loopB) : nil
      race([
        {
          loopA.remove(commands.source, from: .common)
          loopA.remove(commands.source, from: RunLoopMode("r26-mv"))
          loopA.remove(timer, from: .common)
          if variant == 2 { commands.source.invalidate() }
          loopB.add(commands.source, to: .common)
          loopB.add(timer, to: .common)
          if variant != 2 { commands.source.invalidate() }
        },
        { postAll(commands, ledger, producer: 1, count: 30) },
      ])
      releaseB?.open()
      releaseA.open()
      waitUntil(timeout: .seconds(10), "cancels and the fire") {
        pairs.unpaired.isEmpty && !pairs.counts.snapshot.isEmpty && !fires.snapshot.isEmpty
      }
      _ = try? loopA.performAndWait {}
      _ = try? loopB.performAndWait {}
      _ = try? loopA.performAndWait {}
      for problem in ledger.problems(unaccounted: commands.pendingCount + commands.droppedCount) {
        failures.append("round \(round): \(problem)")
      }
      if !pairs.unpaired.isEmpty { failures.append("round \(round): \(pairs.unpaired)") }
      if fires.snapshot != [loopB.name] { failures.append("round \(round): timer fired on \(fires.snapshot)") }
      timer.invalidate()
    }
    #expect(failures == [])
  }

  // MARK: - Common-set bookkeeping, exactly

  /// Promise ("its last mode" counts mode names): on the loop thread, step by step, with exact
  /// counts: a source in `.common` is scheduled once however many modes join the set; removing
  /// `.default` by name takes it out of that mode only (it stays in the other common modes and
  /// in ones that join later); removing `.common` leaves a mode it was added to by name; cancel
  /// runs once, when the last name goes. An observer removed from `.common` is not told in a
  /// mode that joins the set afterwards, and is again once re-added.
  @Test func commonSetBookkeepingIsExact() async throws {
    let report = try await withWatchdogOnThread(timeout: .seconds(20), "common bookkeeping") { () throws -> [String] in
      let loop = try RunLoopThread(name: "r26-book")
      defer { loop.shutdownAndWait() }
      return try loop.performAndWait { () -> [String] in
        var wrong: [String] = []
        let schedules = AtomicCounter()
        let cancels = AtomicCounter()
        let performs = AtomicCounter()
        let told = AtomicCounter()
        let source = InputSource(
          schedule: { _, _, _ in schedules.increment() }, cancel: { _, _ in cancels.increment() }
        ) { _ in performs.increment() }
        let observer = LoopObserver(activities: .entry) { _, _ in told.increment() }
        let keep = LoopTimer(after: .seconds(3_600)) { _ in }
        defer { keep.invalidate() }
        func fired(in mode: RunLoopMode) -> (performs: Int, told: Int) {
          let (p, t) = (performs.current, told.current)
          source.signal()
          loop.add(keep, to: mode)
          loop.run(mode: mode, until: .now)
          return (performs.current - p, told.current - t)
        }
        func expect(_ mode: RunLoopMode, _ wanted: (Int, Int), _ step: String) {
          let got = fired(in: mode)
          if got != wanted { wrong.append("\(step): \(mode) gave \(got), wanted \(wanted)") }
        }
        loop.add(source, to: .common)
        loop.add(observer, to: .common)
        let modes = (0..<5).map { RunLoopMode("r26-book-\($0)") }
        for mode in modes { loop.addModeToCommonModes(mode) }
        if schedules.current != 1 { wrong.append("schedules \(schedules.current) after modes joined") }
        for mode in modes { expect(mode, (1, 1), "joined") }
        loop.remove(source, from: .default)
        expect(.default, (0, 1), "removed .default by name")
        expect(modes[0], (1, 1), "removed .default by name")
        let late = RunLoopMode("r26-book-late")
        loop.addModeToCommonModes(late)
        expect(late, (1, 1), "joined after .default was removed")
        loop.remove(observer, from: .common)
        let later = RunLoopMode("r26-book-later")
        loop.addModeToCommonModes(later)
        expect(later, (1, 0), "observer removed, then a mode joined")
        loop.add(observer, to: .common)
        expect(later, (1, 1), "observer re-added")
        loop.add(source, to: modes[2])
        loop.remove(source, from: .common)
        if cancels.current != 0 { wrong.append("cancelled while still in a named mode") }
        expect(modes[1], (0, 1), "after removing .common")
        expect(modes[2], (1, 1), "the named mode after removing .common")
        loop.remove(source, from: modes[2])
        if schedules.current != 1 || cancels.current != 1 {
          wrong.append("at the end: schedules \(schedules.current), cancels \(cancels.current)")
        }
        observer.invalidate()
        return wrong
      }
    }
    #expect(report == [])
  }

  // MARK: - Lifecycle changes from the routines themselves

  /// Promise (InputSource): cancel exactly once per schedule, per loop, also when the schedule
  /// routine removes or invalidates its own source, and the cancel routine moves the (still
  /// valid) source to another loop, while another thread removes and re-adds it.
  @Test func routinesThatMoveRemoveOrInvalidateTheirOwnSource() async throws {
    let failures = try await failuresOverRounds(200, budget: .seconds(3), "self-changing routines") {
      round, failures in
      let loopA = Self.sharedLoop
      let loopB = Self.secondLoop
      let pairs = PairLog()
      let holder = Guarded<InputSource?>(nil)
      let moved = Guarded(false)
      let source = InputSource(
        schedule: { source, loop, _ in
          pairs.schedule(loop)
          switch round % 3 {
          case 0: loop.remove(source, from: .common)
          case 1: if loop === loopB { source.invalidate() }
          default: break
          }
        },
        cancel: { source, loop in
          pairs.cancel(loop)
          let first = moved.withLock { value in
            defer { value = true }
            return !value
          }
          if first, source.isValid, loop === loopA { loopB.add(source, to: .common) }
        }
      ) { _ in }
      holder.withLock { $0 = source }
      loopA.add(source, to: .common)
      race([
        {
          loopA.remove(source, from: .common)
          source.signal()
        },
        { loopA.wakeUp() },
      ])
      _ = try? loopA.performAndWait {}
      _ = try? loopB.performAndWait {}
      source.invalidate()
      waitUntil(timeout: .seconds(10), "every cancel") { pairs.unpaired.isEmpty }
      _ = try? loopA.performAndWait {}
      _ = try? loopB.performAndWait {}
      if !pairs.unpaired.isEmpty { failures.append("round \(round): \(pairs.unpaired)") }
      holder.withLock { $0 = nil }
    }
    #expect(failures == [])
  }

  /// Promise (runModal): it runs the mode while the caller is suspended, or throws
  /// `RunLoopError.shutDown` when the loop refused the run; a shutdown ends every run. Modal runs
  /// requested from a plain task and from an actor on the loop race the shutdown: each returns
  /// `.stopped` (or another result) or throws `shutDown`, and none hangs.
  @Test func runModalRacingTheShutdownNeverHangs() async throws {
    let outcomes = try await withWatchdog(timeout: .seconds(60), "runModal vs shutdown") { () -> [String: Int] in
      var outcomes: [String: Int] = [:]
      for round in 0..<100 {
        let loop = try RunLoopThread(name: "r26-modal")
        let mode = RunLoopMode("r26-modal-mode")
        let keep = LoopTimer(after: .seconds(3_600)) { _ in }
        loop.add(keep, to: mode)
        let actor = R26NestingActor(loop: loop) {}
        let plain = Task { () -> String in
          do { return "\(try await loop.runModal(mode: mode))" } catch { return "threw" }
        }
        let pinned = Task(executorPreference: loop) { () -> String in
          await actor.nestOnce()
          do { return "\(try await loop.runModal(mode: mode, for: .seconds(30)))" } catch { return "threw" }
        }
        if round % 2 == 0 { await Task.yield() }
        await execOnNewThread { loop.shutdownAndWait() }
        for outcome in [await plain.value, await pinned.value] { outcomes[outcome, default: 0] += 1 }
        keep.invalidate()
      }
      return outcomes
    }
    guard let outcomes else { return }
    // Never a hang, and never "finished": a modal run the drain starts after emptying the mode
    // ends stopped too (`aRunEnteredDuringTheShutdownDrainEndsStopped`).
    #expect(Set(outcomes.keys).isSubset(of: ["stopped", "threw"]), "\(outcomes)")
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
        let loop = try RunLoopThread(name: "r26-drainrun")
        let mode = RunLoopMode("r26-drainrun-mode")
        let keep = LoopTimer(after: .seconds(3_600)) { _ in }
        loop.add(keep, to: mode)
        loop.perform(inModes: ["r26-never-run"]) {
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
        let loop = try RunLoopThread(name: "r26-drainnest")
        let mode = RunLoopMode("r26-dn-\(round)")
        let ends = makePipe()
        defer {
          close(ends.read)
          close(ends.write)
        }
        let result = Guarded<RunLoopRunResult?>(nil)
        let inCallout = TestGate()
        let busy = LoopTimer(after: .zero) { _ in
          inCallout.open()
          loop.run(mode: RunLoopMode("r26-dn-busy"), until: .now.advanced(by: .seconds(3)))
        }
        let busyKeep = LoopTimer(after: .seconds(3_600)) { _ in }
        loop.add(busyKeep, to: RunLoopMode("r26-dn-busy"))
        loop.add(busy, to: .common)
        _ = inCallout.wait(timeout: .seconds(10))
        loop.perform(inModes: ["r26-never-run"]) {
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

  /// Promise (invalidate: no callout starts after it returns; loop-thread changes take effect at
  /// once): ten sources of one order in `.common`, all signalled for the same pass; the first
  /// one's perform invalidates the even ones and removes the odd ones from the mode being run.
  /// Exactly the first one performs in that pass; the removed ones keep their signal and perform
  /// once each in another common mode they are still in (added by name).
  @Test func aPerformThatInvalidatesAndRemovesTheRestOfItsPass() async throws {
    let report = try await withWatchdogOnThread(timeout: .seconds(20), "perform vs its pass") { () throws -> [String] in
      let loop = try RunLoopThread(name: "r26-pass")
      defer { loop.shutdownAndWait() }
      return try loop.performAndWait { () -> [String] in
        let mode = RunLoopMode("r26-pass-run")
        let other = RunLoopMode("r26-pass-other")
        loop.addModeToCommonModes(mode)
        loop.addModeToCommonModes(other)
        let performed = Guarded<[Int]>([])
        let pool = Guarded<[InputSource]>([])
        let sources = (0..<10).map { index in
          InputSource { _ in
            performed.withLock { $0.append(index) }
            guard index == 0 else { return }
            for (other, source) in pool.snapshot.enumerated().dropFirst() {
              if other % 2 == 0 { source.invalidate() } else { loop.remove(source, from: mode) }
            }
          }
        }
        pool.withLock { $0 = sources }
        for source in sources {
          loop.add(source, to: mode)
          loop.add(source, to: other)
        }
        for source in sources { source.signal() }
        loop.run(mode: mode, until: .now)
        var wrong: [String] = []
        if performed.snapshot != [0] { wrong.append("in \(mode): \(performed.snapshot)") }
        performed.withLock { $0.removeAll() }
        loop.run(mode: other, until: .now)
        if performed.snapshot != [1, 3, 5, 7, 9] { wrong.append("in \(other): \(performed.snapshot)") }
        for source in sources { source.invalidate() }
        return wrong
      }
    }
    #expect(report == [])
  }

  /// Promise (CommandSource): a handler's own posts are accepted while the source is valid and
  /// delivered exactly once (in a later turn of the drain or batch); once another thread's
  /// invalidation took effect they are refused; nothing is delivered after `cancel`.
  @Test func handlerPostsChainWhileAnotherThreadInvalidates() async throws {
    let failures = try await failuresOverRounds(200, budget: .seconds(3), "chained posts") { round, failures in
      let loop = Self.sharedLoop
      let ledger = R26Ledger()
      let cancels = AtomicCounter()
      let afterCancel = AtomicCounter()
      let holder = Guarded<CommandSource<Int>?>(nil)
      let commands = CommandSource<Int>(cancel: { _, _ in cancels.increment() }) { command in
        if cancels.current > 0 { afterCancel.increment() }
        ledger.deliver(command)
        if command % 1000 < 999, let me = holder.snapshot, me.post(command + 1) { ledger.accept(command + 1) }
      }
      holder.withLock { $0 = commands }
      loop.add(commands.source, to: .common)
      loop.add(commands.source, to: RunLoopMode("r26-chain"))
      race([
        {
          if commands.post(0) { ledger.accept(0) }
          if commands.post(5000) { ledger.accept(5000) }
        },
        {
          for _ in 0..<(round % 40) { sched_yield() }
          commands.source.invalidate()
        },
      ])
      waitUntil(timeout: .seconds(10), "the cancel") { cancels.current == 1 }
      _ = try? loop.performAndWait {}
      holder.withLock { $0 = nil }
      for problem in ledger.problems(unaccounted: commands.pendingCount + commands.droppedCount) {
        failures.append("round \(round): \(problem)")
      }
      if cancels.current != 1 || afterCancel.current != 0 || commands.post(-1) {
        failures.append("round \(round): cancels \(cancels.current), after cancel \(afterCancel.current)")
      }
    }
    #expect(failures == [])
  }

  /// Promise ("its last mode" counts mode names; a member is on one loop at a time): a source
  /// added to `.common` and then removed from `.default` by name is still on its loop (it stays
  /// until removed from `.common`), so adding it to a second loop traps, naming both loops.
  @Test func removingDefaultByNameDoesNotFreeACommonMemberForAnotherLoop() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let first = try RunLoopThread(name: "r26-trap-first")
      let second = try RunLoopThread(name: "r26-trap-second")
      let source = InputSource { _ in }
      first.add(source, to: .common)
      first.remove(source, from: .default)
      second.add(source, to: .default)
    }
    expectStandardError(of: result, mentions: "r26-trap-first")
    expectStandardError(of: result, mentions: "r26-trap-second")
  }
}
