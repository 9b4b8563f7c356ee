import Glibc
import Testing

@testable import AsyncRunLoop

// Review round 28: the mode check of 41c75bb (`MemberBinding.keeps` asks the loop's common set),
// the per-loop last sent numbers (`SentSequences`), and step 2 stopping at the oldest collected
// signal (65f8f2a).

/// Custom sources that do nothing: fillers for a burst of changes.
private func r28Fillers(_ count: Int) -> [InputSource] { (0..<count).map { _ in InputSource(perform: { _ in }) } }

@Suite struct ReviewRound28Tests {
  /// A due timer in mode M by name (M not in the common set) is added to `.common` and removed
  /// from M by name, behind a burst; `addModeToCommonModes(M)` is sent in the same burst.
  /// Removing a mode by name takes the member out of that mode, also while it is in `.common`
  /// (README, "Members: one lifecycle"): once the burst is applied the timer is in `.default`
  /// (through `.common`) and not in M. It must not fire in M (the removal was made before the
  /// passes that held it there), and fires exactly once when `.default` runs.
  @Test
  func aTimerWhoseModeJoinsTheCommonSetBehindTheBudgetStillFires() throws {
    let mode: RunLoopMode = "r28-joins-common"
    let outcome = try withWatchdogSync(timeout: .seconds(20), "joins common") { () -> [Int] in
      let loop = try RunLoopThread(name: "r28-joins-common")
      defer { loop.shutdownAndWait() }
      let fired = AtomicCounter()
      let timer = LoopTimer(after: .seconds(3_600)) { _ in fired.increment() }
      loop.add(timer, to: mode)
      try loop.performAndWait {}
      let keeper = LoopTimer(after: .seconds(3_600)) { _ in }  // keeps M's run going
      loop.add(keeper, to: mode)
      try loop.performAndWait {}
      let runEnded = TestGate()
      loop.perform {
        _ = loop.run(mode: mode, until: .now.advanced(by: .seconds(10)))
        runEnded.open()
      }
      let started = TestGate()
      let release = TestGate()
      loop.perform(inModes: [mode]) {
        started.open()
        _ = release.wait(timeout: .seconds(20))
      }
      _ = started.wait(timeout: .seconds(20))
      let fillers = r28Fillers(300)
      timer.setFireDate(.now)
      for filler in fillers { loop.add(filler) }
      loop.addModeToCommonModes(mode)
      loop.add(timer, to: .common)
      loop.remove(timer, from: mode)
      release.open()
      for _ in 0..<3 { try loop.performAndWait(inModes: [mode]) {} }
      let inMode = fired.current
      loop.perform(inModes: [mode]) { loop.stop() }
      _ = runEnded.wait(timeout: .seconds(20))
      // Blocks run at work points before step 9, so two of them can both run before the pass
      // that fires the timer in `.default` reaches it: wait for the fire (a timer lost for good
      // fails here, after the wait's limit).
      waitUntil(timeout: .seconds(10), "the fire in .default") { fired.current >= 1 }
      try loop.performAndWait {}
      let result = [inMode, fired.current, timer.isValid ? 1 : 0]
      timer.invalidate()
      keeper.invalidate()
      for filler in fillers { filler.invalidate() }
      try loop.performAndWait {}
      return result
    }
    #expect(outcome == [0, 1, 0], "[fired in M, fired in all, still valid]")
  }

  /// The same with M in the common set from the start: the timer is in M by name and through
  /// `.common`, then removed from M by name behind a burst. The removal takes it out of M: it must
  /// not fire there, and fires once in `.default`. The callout check cannot see this removal (the
  /// binding keeps mode names; a mode removed by name while `.common` covers it leaves no trace
  /// there), so the timer still fires in M while the removal waits.
  @Test(
    .disabled(
      "bug: a member in .common removed by name from a common mode behind the budget still fires there until the removal is applied"
    ))
  func aTimerInACommonModeRemovedByNameBehindTheBudgetDoesNotFireThere() throws {
    let mode: RunLoopMode = "r28-common-from-start"
    let outcome = try withWatchdogSync(timeout: .seconds(20), "named and common") { () -> [Int] in
      let loop = try RunLoopThread(name: "r28-common-start")
      defer { loop.shutdownAndWait() }
      let fired = AtomicCounter()
      let timer = LoopTimer(after: .seconds(3_600)) { _ in fired.increment() }
      loop.addModeToCommonModes(mode)
      loop.add(timer, to: mode)
      loop.add(timer, to: .common)
      try loop.performAndWait {}
      let keeper = LoopTimer(after: .seconds(3_600)) { _ in }  // keeps M's run going
      loop.add(keeper, to: mode)
      try loop.performAndWait {}
      let runEnded = TestGate()
      loop.perform {
        _ = loop.run(mode: mode, until: .now.advanced(by: .seconds(10)))
        runEnded.open()
      }
      let started = TestGate()
      let release = TestGate()
      loop.perform(inModes: [mode]) {
        started.open()
        _ = release.wait(timeout: .seconds(20))
      }
      _ = started.wait(timeout: .seconds(20))
      let fillers = r28Fillers(300)
      timer.setFireDate(.now)
      for filler in fillers { loop.add(filler) }
      loop.remove(timer, from: mode)
      release.open()
      for _ in 0..<3 { try loop.performAndWait(inModes: [mode]) {} }
      let inMode = fired.current
      loop.perform(inModes: [mode]) { loop.stop() }
      _ = runEnded.wait(timeout: .seconds(20))
      // Blocks run at work points before step 9, so two of them can both run before the pass
      // that fires the timer in `.default` reaches it: wait for the fire (a timer lost for good
      // fails here, after the wait's limit).
      waitUntil(timeout: .seconds(10), "the fire in .default") { fired.current >= 1 }
      try loop.performAndWait {}
      let result = [inMode, fired.current, timer.isValid ? 1 : 0]
      timer.invalidate()
      keeper.invalidate()
      for filler in fillers { filler.invalidate() }
      try loop.performAndWait {}
      return result
    }
    #expect(outcome == [0, 1, 0], "[fired in M, fired in all, still valid]")
  }

  /// A signal sent before a held burst of 600 adds, while a due timer's callout runs the loop
  /// nested: when the signal is collected at work point B of the first pass (after step 4), the
  /// timer fires at step 9 and its nested run begins with a fresh budget of changes (entry's
  /// `applyControls(bounded: true)`, not stopping at signals) before its step 4. The signal should
  /// still fire within one budget of the changes sent after it. The loop is held at work point A
  /// (a block collected by step 2), so the signal is collected at work point B. (2026-12-03:
  /// fires after 511 changes.)
  @Test
  func aSignalBeforeABurstFiresWithinOneBudgetAcrossANestedRun() throws {
    let outcome = try withWatchdogSync(timeout: .seconds(30), "nested budget") { () -> [[Int]] in
      let loop = try RunLoopThread(name: "r28-nested-budget")
      defer { loop.shutdownAndWait() }
      var rounds: [[Int]] = []
      for _ in 0..<3 {
        let scheduled = AtomicCounter()
        let sources = (0..<600).map { _ in
          InputSource(schedule: { _, _, _ in _ = scheduled.increment() }, perform: { _ in })
        }
        let early = Guarded<[Int]>([])
        let earlySource = InputSource { _ in
          let now = scheduled.current
          early.withLock { $0.append(now) }
        }
        let nested = AtomicCounter()
        let timer = LoopTimer(after: .seconds(3_600)) { _ in
          _ = nested.increment()
          _ = loop.run(mode: .default, until: .now)
        }
        loop.add(earlySource)
        loop.add(timer)
        try loop.performAndWait {}
        // Held at work point A: a block collected while another block holds the pass.
        let first = blockLoop(loop)
        let started = TestGate()
        let release = TestGate()
        loop.perform {
          started.open()
          _ = release.wait(timeout: .seconds(20))
        }
        first.open()
        _ = started.wait(timeout: .seconds(20))
        timer.setFireDate(.now)
        earlySource.signal()
        for counted in sources { loop.add(counted) }
        release.open()
        _ = waitUntil(timeout: .seconds(10), "the burst") { scheduled.current == 600 }
        try loop.performAndWait {}
        rounds.append([early.snapshot.count, early.snapshot.first ?? Int.max, nested.current])
        earlySource.invalidate()
        timer.invalidate()
        for counted in sources { counted.invalidate() }
        try loop.performAndWait {}
      }
      return rounds
    }
    let rounds = outcome ?? []
    #expect(rounds.count == 3)
    #expect(rounds.allSatisfy { $0[0] == 1 && $0[2] == 1 }, "\(rounds)")
    #expect(rounds.allSatisfy { $0[1] <= LoopCore.controlsPerPass }, "\(rounds)")
  }

  /// Another thread signals a source in a tight loop while a burst of 10k adds is sent: every add
  /// is applied (schedules counted exactly) and a performAndWait sent after them returns.
  @Test
  func aSignalStreamDoesNotStarveABurstOfChanges() throws {
    let outcome = try withWatchdogSync(timeout: .seconds(30), "signal stream") { () -> [Int] in
      let loop = try RunLoopThread(name: "r28-stream")
      defer { loop.shutdownAndWait() }
      let scheduled = AtomicCounter()
      let sources = (0..<10_000).map { _ in
        InputSource(schedule: { _, _, _ in _ = scheduled.increment() }, perform: { _ in })
      }
      let performed = AtomicCounter()
      let hot = InputSource { _ in _ = performed.increment() }
      loop.add(hot)
      try loop.performAndWait {}
      let stop = AtomicCounter()
      let signalled = TestGate()
      let signaller = startThread {
        var sent = 0
        while stop.current == 0 {
          hot.signal()
          loop.wakeUp()
          sent += 1
          if sent == 1_000 { signalled.open() }
        }
      }
      _ = signalled.wait(timeout: .seconds(10))
      for source in sources { loop.add(source) }
      try loop.performAndWait {}
      let afterWait = scheduled.current
      _ = stop.increment()
      joinThread(signaller)
      try loop.performAndWait {}
      let result = [afterWait, scheduled.current, performed.current > 0 ? 1 : 0]
      hot.invalidate()
      for source in sources { source.invalidate() }
      try loop.performAndWait {}
      return result
    }
    #expect(outcome == [10_000, 10_000, 1], "[scheduled at the wait, scheduled, hot fired]")
  }

  /// A handler that signals its own source every time (a pass never ends without a collected
  /// signal) while 10k adds arrive: they are all applied and a performAndWait behind them returns.
  @Test
  func aSelfResignallingHandlerDoesNotStarveABurstOfChanges() throws {
    let outcome = try withWatchdogSync(timeout: .seconds(30), "self signal") { () -> [Int] in
      let loop = try RunLoopThread(name: "r28-self-signal")
      defer { loop.shutdownAndWait() }
      let scheduled = AtomicCounter()
      let sources = (0..<10_000).map { _ in
        InputSource(schedule: { _, _, _ in _ = scheduled.increment() }, perform: { _ in })
      }
      let keepGoing = AtomicCounter()
      let performed = AtomicCounter()
      let hot = InputSource { source in
        _ = performed.increment()
        if keepGoing.current == 0 {
          source.signal()
          loop.wakeUp()
        }
      }
      loop.add(hot)
      try loop.performAndWait {}
      hot.signal()
      loop.wakeUp()
      _ = waitUntil(timeout: .seconds(10), "spinning") { performed.current > 100 }
      for source in sources { loop.add(source) }
      try loop.performAndWait {}
      let afterWait = scheduled.current
      _ = keepGoing.increment()
      try loop.performAndWait {}
      let result = [afterWait, scheduled.current]
      hot.invalidate()
      for source in sources { source.invalidate() }
      try loop.performAndWait {}
      return result
    }
    #expect(outcome == [10_000, 10_000], "[scheduled at the wait, scheduled]")
  }

  /// A signal sent after a removal of its source (held behind a burst) waits for the removal: the
  /// source never fires on this loop; a signal sent before the removal may fire (once at most).
  @Test
  func aSignalAfterARemovalWaitsForIt() throws {
    let outcome = try withWatchdogSync(timeout: .seconds(20), "after removal") { () -> [Int] in
      let loop = try RunLoopThread(name: "r28-after-removal")
      defer { loop.shutdownAndWait() }
      let performed = AtomicCounter()
      let source = InputSource { _ in _ = performed.increment() }
      loop.add(source)
      try loop.performAndWait {}
      let fillers = r28Fillers(600)
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
      let loops = try (0..<3).map { try RunLoopThread(name: "r28-bounce-\($0)") }
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
      let fillers = loops.map { _ in r28Fillers(300) }
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
        "r28-bounce-0: scscsc", "r28-bounce-1: scscsc", "r28-bounce-2: scscsc", "triggers 3",
      ])
  }
}
