import Glibc
import Testing

@testable import AsyncRunLoop

/// Cross-thread registration changes apply in the order they were sent.
@Suite("Cross-thread registration changes apply in the order they were sent", .serialized, .timeLimit(.minutes(10)))
struct ChangeOrderTests: MemberPromiseSettling, ReAddOrderMeasures, ChangeBurstSending {
  /// InputSource: "An add made before an invalidation is still scheduled (and then cancelled)".
  /// Here the add to the old loop waits in its inbox while the source moves on: the new loop
  /// applies its add and the invalidation first, and, being the only loop holding the source at
  /// that moment, releases the routines. The old loop then applies the add it was sent first and
  /// finds no schedule routine (nor a cancel routine): the pairs still match (0 and 0), but that
  /// add was never scheduled.
  @Test
  func anAddStillInTheOldLoopsInboxIsScheduledAfterTheSourceMovedAndWasInvalidated() throws {
    let oldLoop = try RunLoopThread(name: "inbox-old")
    let newLoop = try RunLoopThread(name: "inbox-new")
    defer {
      oldLoop.shutdownAndWait()
      newLoop.shutdownAndWait()
    }
    let log = Log()
    let source = InputSource(
      schedule: { _, loop, _ in log.add("schedule@\(loop.name)") },
      cancel: { _, loop in log.add("cancel@\(loop.name)") }, perform: { _ in })
    let release = blockLoop(oldLoop)
    oldLoop.add(source)  // waits in the old loop's inbox
    oldLoop.remove(source)
    newLoop.add(source)
    source.invalidate()
    try Self.settle(newLoop)
    release.open()
    try Self.settle(oldLoop)
    #expect(log.count("schedule@inbox-new") == 1)
    #expect(log.count("cancel@inbox-new") == 1)
    #expect(log.count("schedule@inbox-old") == 1, "log: \(log.snapshot)")
    #expect(log.count("cancel@inbox-old") == 1, "log: \(log.snapshot)")
  }

  /// A source added to `.common`, then removed from `.default` (its record leaves its last mode,
  /// its binding stays bound), then added to another mode, signalled, invalidated: schedule and
  /// cancel pair, a signal made while in no mode fires once it is in a running mode, and the
  /// source and its routines are freed once dropped. A mode joining the common set afterwards
  /// gets nothing of it.
  @Test func commonMemberRemovedFromDefaultThenReadded() async throws {
    let other = RunLoopMode("rrec-common-m")
    let outcome = try await withWatchdogOnThread { () -> [String] in
      var problems: [String] = []
      repeatRounds(100) { round in
        // A loop per round: a mode added to the common set stays there (and a `.common` member
        // added later joins it, so removing it from `.default` would not empty it).
        guard let loop = try? RunLoopThread(name: "rrec-common") else { return }
        defer { loop.shutdownAndWait() }
        let log = PairLog()
        let performs = AtomicCounter()
        weak var weakSource: InputSource?
        weak var weakTimer: LoopTimer?
        do {
          let source = InputSource(
            schedule: { _, loop, _ in log.schedule(loop) }, cancel: { _, loop in log.cancel(loop) },
            perform: { _ in performs.increment() })
          let timer = LoopTimer(after: .seconds(3600), repeatingEvery: .seconds(3600)) { _ in }
          weakSource = source
          weakTimer = timer
          loop.add(source, to: .common)
          loop.add(timer, to: .common)
          if round % 2 == 0 { _ = try? loop.performAndWait { () } }
          loop.remove(source, from: .default)  // its last mode: the record is detached
          loop.remove(timer, from: .default)
          source.signal()  // kept on the source: it is in no mode
          loop.add(source, to: .default)  // the same record attaches again (the binding is bound)
          loop.add(timer, to: other)
          let fired = waitUntil(timeout: .seconds(5), "perform") { performs.current == 1 }
          if !fired { problems.append("round \(round): the signal made in no mode never fired") }
          let modes = (try? loop.performAndWait { loop.core.modes(of: timer) }) ?? []
          if modes != [other] { problems.append("round \(round): timer modes \(modes)") }
          source.invalidate()
          if round % 2 == 1 { timer.invalidate() }
        }
        loop.addModeToCommonModes(RunLoopMode("rrec-common-late-\(round)"))
        _ = try? loop.performAndWait { () }
        if !log.unpaired.isEmpty { problems.append("round \(round): \(log.unpaired)") }
        if weakSource != nil { problems.append("round \(round): the source leaked") }
        if round % 2 == 1 && weakTimer != nil { problems.append("round \(round): the timer leaked") }
        if performs.current != 1 { problems.append("round \(round): \(performs.current) performs") }
      }
      return problems
    }
    #expect(outcome == [])
  }

  /// "Signals that arrive before the source is added to a loop are kept and fire once it is",
  /// and a valid, signalled source in a running mode fires. A signal made while the removal from
  /// the last mode is queued (and the re-add behind it) is carried by the old record: the loop
  /// skips it, and the new record must pick it up. The loop is held while the changes queue.
  @Test func signalMadeWhileRemovalIsQueuedFiresAfterReadd() async throws {
    let loopA = try RunLoopThread(name: "rrec-sig-a")
    let loopB = try RunLoopThread(name: "rrec-sig-b")
    defer {
      loopA.shutdownAndWait()
      loopB.shutdownAndWait()
    }
    let outcome = try await withWatchdogOnThread(timeout: .seconds(60)) { () -> [String] in
      var problems: [String] = []
      repeatRounds(300) { round in
        let performs = Guarded<[String]>([])
        let source = InputSource(perform: { _ in
          performs.withLock { $0.append(RunLoopThread.currentIfExists?.name ?? "?") }
        })
        loopA.add(source, to: .default)
        _ = try? loopA.performAndWait { () }
        let release = round % 2 == 0 ? blockLoop(loopA) : nil
        let target = round % 3 == 0 ? loopB : loopA
        race([
          {
            loopA.remove(source, from: .default)
            target.add(source, to: .default)
          },
          { source.signal() },
        ])
        release?.open()
        let fired = waitUntil(timeout: .seconds(5), "perform") { performs.snapshot.count >= 1 }
        _ = try? loopA.performAndWait { () }
        _ = try? loopB.performAndWait { () }
        let got = performs.snapshot
        if !fired || got.count != 1 { problems.append("round \(round): performs \(got)") }
        source.invalidate()
      }
      return problems
    }
    #expect(outcome == [])
  }

  /// A source removed from its last mode by a change applied before a later signal must not
  /// fire: the loop applied the removal, so the old record it carried is skipped, and the
  /// binding (unbound) keeps the signal for the next add.
  @Test func signalAfterAppliedRemovalDoesNotFire() async throws {
    let loop = try RunLoopThread(name: "rrec-sig-removed")
    defer { loop.shutdownAndWait() }
    let outcome = try await withWatchdogOnThread { () -> [String] in
      var problems: [String] = []
      repeatRounds(300) { round in
        let performs = AtomicCounter()
        let source = InputSource(perform: { _ in performs.increment() })
        loop.add(source, to: .default)
        loop.remove(source, from: .default)
        _ = try? loop.performAndWait { () }  // the removal is applied
        source.signal()
        _ = try? loop.performAndWait { () }
        _ = try? loop.performAndWait { () }
        if performs.current != 0 { problems.append("round \(round): fired \(performs.current) after removal") }
        loop.add(source, to: RunLoopMode("rrec-other"))  // kept for the next add: fires once it runs there
        let fired =
          (try? loop.performAndWait { () -> Int in
            loop.run(mode: RunLoopMode("rrec-other"), until: .now)
            return performs.current
          }) ?? -1
        if fired != 1 { problems.append("round \(round): \(fired) performs after the re-add") }
        source.invalidate()
      }
      return problems
    }
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
      loop.add(keepA, to: orderModeA)
      loop.add(keepB, to: orderModeB)
      let old = InputSource(cancel: { _, _ in log.add("old cancel") }) { _ in log.add("old") }
      loop.add(old, to: orderModeB)
      old.signal()
      runOnePass(loop, orderModeA)
      runOnePass(loop, orderModeA)
      old.invalidate()
      let fresh = InputSource { _ in log.add("fresh") }
      loop.add(fresh, to: orderModeA)
      fresh.signal()
      runOnePass(loop, orderModeA)
      log.add("A ran")
      runOnePass(loop, orderModeB)
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
      loop.add(keepA, to: orderModeA)
      var bad: [Int] = []
      repeatRounds(300, budget: .milliseconds(800)) { round in
        let fires = AtomicCounter()
        let source = InputSource { _ in fires.increment() }
        loop.add(source, to: orderModeB)
        source.signal()
        runOnePass(loop, orderModeA)  // sorted out: waits for B
        let moved = TestGate()
        let mover = startThread {
          for _ in 0..<(round % 32) { sched_yield() }
          loop.remove(source, from: orderModeB)
          loop.add(source, to: orderModeA)
          moved.open()
        }
        var passes = 0
        while !moved.opened || passes < 3 {
          runOnePass(loop, orderModeA)
          if moved.opened { passes += 1 }
        }
        joinThread(mover)
        runOnePass(loop, orderModeA)
        if fires.current != 1 { bad.append(round) }
        source.invalidate()
      }
      keepA.invalidate()
      return bad
    }
    #expect(outcome == [], "rounds where the moved source did not fire exactly once")
  }

  /// Signals and the budget: a signal sent before a held burst of 1,000 adds fires in the burst's
  /// first pass (at most one budget applied); a signal sent after a removal of its source from the
  /// default mode (and an add to another mode), 600 changes into the burst, does not fire in the
  /// default mode, and fires exactly once when the other mode runs.
  @Test func signalsWaitOnlyForTheChangesSentBeforeThem() throws {
    let other: RunLoopMode = "signal-other"
    let outcome = try withWatchdogSync(timeout: .seconds(20), "signals") {
      () -> (early: [Int], late: (before: Int, after: Int)) in
      let loop = try RunLoopThread(name: "signals")
      defer { loop.shutdownAndWait() }
      let scheduled = AtomicCounter()
      let sources = (0..<1_000).map { index in RoutineCountingSource(index: index) { _, _ in scheduled.increment() } }
      let early = Guarded<[Int]>([])
      let earlySource = InputSource { _ in
        let now = scheduled.current
        early.withLock { $0.append(now) }
      }
      let late = RoutineCountingSource()
      loop.add(earlySource)
      loop.add(late.source)
      try loop.performAndWait {}
      let release = blockLoop(loop)
      earlySource.signal()
      for counted in sources[..<600] { loop.add(counted.source) }
      loop.remove(late.source)
      loop.add(late.source, to: other)
      late.source.signal()
      for counted in sources[600...] { loop.add(counted.source) }
      release.open()
      waitUntil(timeout: .seconds(10), "the burst") { scheduled.current == 1_000 }
      try loop.performAndWait {}
      try loop.performAndWait {}
      let before = late.performs.current
      try loop.performAndWait { _ = loop.run(mode: other, until: .now) }
      let after = late.performs.current
      earlySource.invalidate()
      late.source.invalidate()
      for counted in sources { counted.source.invalidate() }
      return (early.snapshot, (before, after))
    }
    #expect(outcome?.early.count == 1)
    #expect((outcome?.early.first ?? Int.max) <= LoopChangeQueue.perPass, "\(outcome?.early ?? [])")
    #expect(outcome?.late.before == 0)
    #expect(outcome?.late.after == 1)
  }

  /// A removal burst of 600 sources (held) whose first cancel routine invalidates the last 300
  /// (their removals wait past the budget) and whose second re-adds the third source on the loop
  /// thread (its own removal, waiting, is applied first): each cancel routine runs exactly once
  /// per stay, none is lost or doubled.
  @Test func cancelRoutinesChangingMembersWhoseRemovalsWait() throws {
    let outcome = try withWatchdogSync(timeout: .seconds(20), "cancel churn") { () -> [String] in
      let loop = try RunLoopThread(name: "cancel-churn")
      defer { loop.shutdownAndWait() }
      let pool = Guarded<[InputSource]>([])
      let cancelled = Guarded<[Int]>([])
      let hooks = (0..<600).map { index in
        InputSource(
          cancel: { _, loop in
            cancelled.withLock { $0.append(index) }
            if index == 0 { for source in pool.snapshot[300...] { source.invalidate() } }
            if index == 1 { loop.add(pool.snapshot[2]) }
          }, perform: { _ in })
      }
      pool.withLock { $0 = hooks }
      for source in hooks { loop.add(source) }
      try loop.performAndWait {}
      let release = blockLoop(loop)
      for source in hooks { loop.remove(source) }
      release.open()
      try loop.performAndWait {}
      var found: [String] = []
      let afterRemovals = cancelled.snapshot
      var counts = [Int](repeating: 0, count: 600)
      for index in afterRemovals { counts[index] += 1 }
      let bad = counts.enumerated().filter { $0.element != 1 }.map { "\($0.offset): \($0.element)" }
      if !bad.isEmpty { found.append("cancels after the removals: \(bad.prefix(5))") }
      let modes = try loop.performAndWait { hooks.map { loop.core.modeCount(of: $0) } }
      if modes != [0, 0, 1] + Array(repeating: 0, count: 597) { found.append("modes: \(modes.prefix(5))") }
      for source in hooks { source.invalidate() }
      try loop.performAndWait {}
      let final = cancelled.snapshot
      if final.count != 601 || final.filter({ $0 == 2 }).count != 2 { found.append("final cancels \(final.count)") }
      return found
    }
    #expect(outcome == [])
  }

  /// A member removed from loop A (waiting in A's inbox), then added to loop B and removed from
  /// it, is added to A again on A's loop thread from a schedule routine that A runs before the
  /// removal: A must apply the member's own removal first (its last sent change went to B, so the
  /// per-loop number says nothing waits on A). Order of the member's routines on A: schedule,
  /// cancel, schedule.
  @Test
  func aMemberSentToAnotherLoopKeepsItsWaitingRemovalFirstOnTheFirstLoop() throws {
    let order = try Self.reAddOrder(viaOtherLoop: true)
    #expect(order == ["schedule order-a", "cancel order-a", "schedule order-a"])
  }

  /// Control: without the detour through loop B the waiting removal is applied first.
  @Test func aMemberReaddedInAScheduleRoutineKeepsItsWaitingRemovalFirst() throws {
    let order = try Self.reAddOrder(viaOtherLoop: false)
    #expect(order == ["schedule order-a", "cancel order-a", "schedule order-a"])
  }

  /// The same with a readiness source: its removal from A waits while A's loop thread adds it
  /// again (the descriptor is still registered by the waiting record). The add must succeed and
  /// the source must be told once of a byte written afterwards.
  @Test
  func aDescriptorSentToAnotherLoopIsReaddedAfterItsWaitingRemoval() throws {
    let outcome = try Self.descriptorReAdd(viaOtherLoop: true)
    #expect(outcome == ["none", "1", "true"], "[add failure, told, valid]")
  }

  /// Control: without the detour through loop B the re-add succeeds.
  @Test func aDescriptorReaddedInAScheduleRoutineAfterItsWaitingRemovalIsTold() throws {
    let outcome = try Self.descriptorReAdd(viaOtherLoop: false)
    #expect(outcome == ["none", "1", "true"], "[add failure, told, valid]")
  }

  /// A signal sent after a removal of its source (held behind a burst) waits for the removal: the
  /// source never fires on this loop; a signal sent before the removal may fire (once at most).
  @Test
  func aSignalAfterARemovalWaitsForIt() throws {
    let outcome = try withWatchdogSync(timeout: .seconds(20), "after removal") { () -> [Int] in
      let loop = try RunLoopThread(name: "after-removal")
      defer { loop.shutdownAndWait() }
      let performed = AtomicCounter()
      let source = InputSource { _ in _ = performed.increment() }
      loop.add(source)
      try loop.performAndWait {}
      let fillers = fillerSources(600)
      let release = blockLoop(loop)
      for filler in fillers[..<300] { loop.add(filler) }
      loop.remove(source)
      source.signal()
      for filler in fillers[300...] { loop.add(filler) }
      release.open()
      for _ in 0..<4 { try loop.performAndWait {} }
      try loop.performAndWait { _ = loop.run(mode: .default, until: .now) }
      let result = [performed.current]
      source.invalidate()
      for filler in fillers { filler.invalidate() }
      try loop.performAndWait {}
      return result
    }
    #expect(outcome == [0], "[fired after its removal]")
  }

  /// A source bounces between three held loops (added to and removed from each twice, behind
  /// fillers there); then on each loop a trigger's schedule routine (queued before the source's
  /// changes there) adds and removes it on that loop's thread. Each loop must apply the source's
  /// own waiting changes first: per loop its routines are exactly schedule, cancel, three times.
  @Test
  func aSourceBouncingBetweenHeldLoopsKeepsItsRoutinesInOrder() throws {
    let outcome = try withWatchdogSync(timeout: .seconds(30), "bounce") { () -> [String] in
      let loops = try (0..<3).map { try RunLoopThread(name: "bounce-\($0)") }
      defer { for loop in loops { loop.shutdownAndWait() } }
      let events = Guarded<[String: String]>([:])
      let member = InputSource(
        schedule: { _, loop, _ in events.withLock { $0[loop.name, default: ""].append("s") } },
        cancel: { _, loop in events.withLock { $0[loop.name, default: ""].append("c") } },
        perform: { _ in })
      let serial = Guarded<Int>(0)
      let triggers = loops.map { _ in
        InputSource(
          schedule: { _, loop, _ in
            serial.withLock { count in
              count += 1
              loop.add(member)
              loop.remove(member)
            }
          }, perform: { _ in })
      }
      let fillers = loops.map { _ in fillerSources(300) }
      let releases = loops.map { blockLoop($0) }
      for round in 0..<2 {
        for (index, loop) in loops.enumerated() {
          for filler in fillers[index][(round * 150)..<(round * 150 + 150)] { loop.add(filler) }
          if round == 0 { loop.add(triggers[index]) }
          loop.add(member)
          loop.remove(member)
        }
      }
      for release in releases { release.open() }
      for loop in loops { for _ in 0..<4 { try loop.performAndWait {} } }
      let snapshot = events.snapshot
      member.invalidate()
      for trigger in triggers { trigger.invalidate() }
      for group in fillers { for filler in group { filler.invalidate() } }
      for loop in loops { try loop.performAndWait {} }
      return loops.map { "\($0.name): \(snapshot[$0.name] ?? "")" } + ["triggers \(serial.snapshot)"]
    }
    #expect(
      outcome == [
        "bounce-0: scscsc", "bounce-1: scscsc", "bounce-2: scscsc", "triggers 3",
      ])
  }

  /// A loop-thread add made inside a change (a schedule routine) must come after a cross-thread
  /// removal that happened before it. The inline `applyControls()` at depth 2 stops at the end of
  /// the collected batch and never looks at the inbox, so the later inline add overtakes the
  /// earlier removal: the source ends up bound but detached (its signals never fire).
  @Test func inlineAddInsideScheduleRoutineDoesNotOvertakeEarlierRemoval() async throws {
    let loop = try RunLoopThread(name: "overtake")
    defer { loop.shutdownAndWait() }
    let log = Log()
    let target = InputSource(
      schedule: { _, _, _ in log.add("schedule") }, cancel: { _, _ in log.add("cancel") },
      perform: { _ in log.add("perform") })
    loop.add(target, to: .default)
    _ = try loop.performAndWait { () }
    #expect(log.snapshot == ["schedule"])

    let inSchedule = TestGate()
    let removalSent = TestGate()
    let trigger = InputSource(
      schedule: { _, runLoop, _ in
        inSchedule.open()
        _ = removalSent.wait(timeout: .seconds(10))
        runLoop.add(target, to: .default)  // after the removal (it happened before removalSent)
        log.add("inline-add")
      }, perform: { _ in })
    let follower = InputSource(perform: { _ in })
    let release = blockLoop(loop)
    loop.add(trigger, to: .default)
    loop.add(follower, to: .default)  // a change that still waits behind the trigger
    release.open()
    _ = try await withWatchdogOnThread(timeout: .seconds(20), "schedule routine") {
      _ = inSchedule.wait(timeout: .seconds(10))
      loop.remove(target, from: .default)
      removalSent.open()
    }
    _ = try loop.performAndWait { () }
    let modes = try loop.performAndWait { loop.core.modeCount(of: target) }
    target.signal()
    let fired = waitUntil(timeout: .seconds(3), "perform of the re-added source") { log.count("perform") == 1 }
    #expect(modes == 1, "target must be in default (remove, then add); log: \(log.snapshot)")
    #expect(fired)
    #expect(log.snapshot.prefix(4) == ["schedule", "cancel", "schedule", "inline-add"])
    trigger.invalidate()
    follower.invalidate()
    target.invalidate()
  }

  /// The same with the inline call made from a cancel routine that a cross-thread removal runs.
  @Test func inlineAddInsideCancelRoutineDoesNotOvertakeEarlierRemoval() async throws {
    let loop = try RunLoopThread(name: "overtake-c")
    defer { loop.shutdownAndWait() }
    let log = Log()
    let timer = LoopTimer(after: .seconds(3600)) { _ in }
    loop.add(timer, to: .default)
    let inCancel = TestGate()
    let removalSent = TestGate()
    let trigger = InputSource(
      cancel: { _, runLoop in
        inCancel.open()
        _ = removalSent.wait(timeout: .seconds(10))
        runLoop.add(timer, to: .default)
        log.add("inline-add")
      }, perform: { _ in })
    loop.add(trigger, to: .default)
    let follower = InputSource(perform: { _ in })
    _ = try loop.performAndWait { () }
    let release = blockLoop(loop)
    loop.remove(trigger, from: .default)  // its cancel routine runs as a change
    loop.add(follower, to: .default)
    release.open()
    _ = try await withWatchdogOnThread(timeout: .seconds(20), "cancel routine") {
      _ = inCancel.wait(timeout: .seconds(10))
      loop.remove(timer, from: .default)
      removalSent.open()
    }
    _ = try loop.performAndWait { () }
    let modes = try loop.performAndWait { loop.core.modeCount(of: timer) }
    #expect(log.snapshot == ["inline-add"])
    #expect(modes == 1, "the timer was removed, then added again on the loop thread")
    follower.invalidate()
    timer.invalidate()
  }

  /// A signal sent after a removal and re-add must not fire the source before the removal is
  /// applied: with more than a pass's worth of changes waiting in front, the signal is collected
  /// (signals are always taken) and step 4 fires the old registration.
  @Test func signalDoesNotOvertakeWaitingRemoval() async throws {
    let loop = try RunLoopThread(name: "sigorder")
    defer { loop.shutdownAndWait() }
    let log = Log()
    let source = InputSource(
      schedule: { _, _, _ in log.add("schedule") }, cancel: { _, _ in log.add("cancel") },
      perform: { _ in log.add("perform") })
    loop.add(source, to: .default)
    _ = try loop.performAndWait { () }
    let release = blockLoop(loop)
    let observer = Self.sendChanges(loop, count: 4 * LoopChangeQueue.perPass + 1)
    loop.remove(source, from: .default)
    loop.add(source, to: .default)
    source.signal()
    release.open()
    let fired = waitUntil(timeout: .seconds(10), "perform") { log.count("perform") == 1 }
    #expect(fired)
    _ = try loop.performAndWait { () }
    #expect(log.snapshot == ["schedule", "cancel", "schedule", "perform"])
    source.invalidate()
    observer.invalidate()
  }

  /// A signal for a source whose add still waits (behind many changes) is kept and fires once the
  /// add is applied; blocks and jobs sent after the changes see them applied.
  @Test func signalForWaitingAddAndWorkAfterManyChanges() async throws {
    let loop = try RunLoopThread(name: "waitadd")
    defer { loop.shutdownAndWait() }
    let log = Log()
    let source = InputSource(perform: { _ in log.add("perform") })
    let other = InputSource(perform: { _ in log.add("other") })
    loop.add(other, to: RunLoopMode("a"))
    _ = try loop.performAndWait { () }
    let timers = (0..<(3 * LoopChangeQueue.perPass + 7)).map { _ in LoopTimer(after: .seconds(3600)) { _ in } }
    let release = blockLoop(loop)
    for timer in timers { loop.add(timer, to: .default) }
    loop.add(source, to: .default)
    loop.add(other, to: .default)  // already on the loop in another mode
    source.signal()
    other.signal()
    let blockSaw = Guarded<(Int, Int)?>(nil)
    loop.perform { blockSaw.withLock { $0 = (loop.core.modeCount(of: timers.last!), loop.core.modeCount(of: source)) } }
    let jobSaw = Guarded<Int?>(nil)
    let jobRan = TestGate()
    Task(executorPreference: loop) {
      jobSaw.withLock { $0 = loop.core.modeCount(of: source) }
      jobRan.open()
    }
    release.open()
    let fired = waitUntil(timeout: .seconds(10), "both performs") {
      log.count("perform") == 1 && log.count("other") == 1
    }
    #expect(fired)
    _ = jobRan.wait(timeout: .seconds(10))
    _ = try loop.performAndWait { () }
    #expect(blockSaw.snapshot.map { [$0.0, $0.1] } == [1, 1])
    #expect(jobSaw.snapshot == 1)
    for timer in timers { timer.invalidate() }
    source.invalidate()
    other.invalidate()
  }

  /// Changes that a nested run (started by a change's schedule routine) applies keep their order,
  /// and a block sent after all of them sees them all.
  @Test func nestedRunInsideScheduleRoutineKeepsChangeOrder() async throws {
    let loop = try RunLoopThread(name: "nestorder")
    defer { loop.shutdownAndWait() }
    let log = Guarded<[Int]>([])
    let nestedResults = Guarded<[RunLoopRunResult]>([])
    let count = 3 * LoopChangeQueue.perPass + 5
    let sources = (0..<count).map { index in
      InputSource(
        schedule: { _, runLoop, _ in
          log.withLock { $0.append(index) }
          if index == 0 || index == 300 {
            // Runs the loop nested in an empty mode: it must apply the waiting changes first and
            // report finished only then (or time out).
            let result = runLoop.run(mode: RunLoopMode("empty"), for: .seconds(5))
            nestedResults.withLock { $0.append(result) }
          }
        }, perform: { _ in })
    }
    let release = blockLoop(loop)
    for source in sources { loop.add(source, to: .default) }
    let seenByBlock = Guarded<Int>(-1)
    loop.perform { seenByBlock.withLock { $0 = log.snapshot.count } }
    release.open()
    _ = try await withWatchdogOnThread(timeout: .seconds(20), "changes applied") {
      waitUntil(timeout: .seconds(15)) { seenByBlock.snapshot >= 0 }
    }
    #expect(log.snapshot == Array(0..<count))
    #expect(seenByBlock.snapshot == count)
    #expect(nestedResults.snapshot == [.finished, .finished])
    for source in sources { source.invalidate() }
  }

  /// 300 adds sent as one batch; the first one's schedule routine runs the loop nested (which
  /// continues the same queue, bounded); a block sent after them runs after every schedule.
  @Test
  func nestedRunInScheduleKeepsChangeAndBlockOrder() async throws {
    let loop = try RunLoopThread(name: "batch")
    defer { loop.shutdownAndWait() }
    let result = try await withWatchdogOnThread { () -> (ordered: Bool, count: Int, blockLast: Bool) in
      let log = EventLog()
      let release = blockLoop(loop)
      var sources: [InputSource] = []
      for index in 0..<300 {
        let source = InputSource(
          schedule: { _, loop, _ in
            log.add("\(index)")
            if index == 0 || index == 150 { loop.run(mode: .default, until: .now) }
          }, perform: { _ in })
        sources.append(source)
        loop.add(source, to: .default)
      }
      loop.perform { log.add("block") }
      release.open()
      try loop.performAndWait {}
      let entries = log.snapshot
      for source in sources { source.invalidate() }
      let numbers = entries.compactMap(Int.init)
      return (numbers == Array(0..<300), numbers.count, entries.last == "block")
    }
    #expect(result?.ordered == true)
    #expect(result?.count == 300)
    #expect(result?.blockLast == true)
  }

  /// A signal that waits behind a flood of changes (more than one bounded pass applies), then
  /// the source is removed and moved to another loop: it fires exactly once, on the new loop.
  @Test
  func waitingSignalFollowsTheSourceToItsNextLoop() async throws {
    let first = try RunLoopThread(name: "sig-1")
    let second = try RunLoopThread(name: "sig-2")
    defer {
      first.shutdownAndWait()
      second.shutdownAndWait()
    }
    let result = try await withWatchdogOnThread { () -> (performs: [String], unpaired: [String], rounds: Int) in
      let pairs = PairLog()
      let performs = Guarded<[String]>([])
      var rounds = 0
      rounds = repeatRounds(20, budget: .milliseconds(400)) { round in
        let source = InputSource(
          schedule: { _, loop, _ in pairs.schedule(loop) }, cancel: { _, loop in pairs.cancel(loop) },
          perform: { _ in performs.withLock { $0.append(RunLoopThread.current.name) } })
        first.add(source, to: .default)
        try? first.performAndWait {}
        let release = blockLoop(first)
        let filler = LoopObserver(activities: .entry) { _, _ in }
        for _ in 0..<200 {
          first.add(filler, to: .default)
          first.remove(filler, from: .default)
        }
        source.signal()
        first.remove(source, from: .default)
        second.add(source, to: .default)
        release.open()
        try? first.performAndWait {}
        // Waited for, not taken from barriers on `second`: a pass runs the blocks sent before it
        // (step 3) before it fires the sources signalled before it (step 4), so a source that
        // joined late in one pass fires after the block of the next (invalidated, it would not).
        waitUntil("the perform on sig-2") { performs.snapshot.count > round }
        try? second.performAndWait {}
        source.invalidate()
        filler.invalidate()
      }
      try? first.performAndWait {}
      try? second.performAndWait {}
      return (performs.snapshot, pairs.unpaired, rounds)
    }
    #expect(result?.performs.allSatisfy { $0 == "sig-2" } == true, "\(result?.performs ?? [])")
    #expect(result.map { $0.performs.count == $0.rounds } == true, "one signal, not exactly one perform")
    #expect(result?.unpaired.isEmpty == true, "\(result?.unpaired ?? [])")
  }

  /// "Equal orders fire in signalling order", also for a source signalled while the loop ran a
  /// mode it is not in (kept aside) and a source signalled after it.
  @Test func aSourceKeptAsideFiresBeforeOneSignalledLater() throws {
    let loop = try RunLoopThread(name: "signal-order")
    defer { loop.shutdownAndWait() }
    let log = EventLog()
    let first = InputSource { _ in log.add("first") }
    let second = InputSource { _ in log.add("second") }
    let other: RunLoopMode = "order-other"
    try loop.performAndWait {
      loop.add(first)
      loop.add(second)
      loop.add(LoopTimer(after: .seconds(3600)) { _ in }, to: other)
      first.signal()
      loop.run(mode: other, for: .milliseconds(5))  // `first` is not in it: kept aside
      second.signal()
      loop.run(mode: .default, for: .milliseconds(5))
    }
    #expect(log.snapshot == ["first", "second"])
  }
}
