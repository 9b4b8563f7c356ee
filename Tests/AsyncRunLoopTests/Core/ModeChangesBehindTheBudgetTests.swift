import Glibc
import Testing

@testable import AsyncRunLoop

/// A member fires only in the modes its last sent change leaves it in, even behind the budget.
@Suite("A member fires only in the modes its last sent change leaves it in, even behind the budget")
struct ModeChangesBehindTheBudgetTests: ChangeBudgetMeasures {
  /// A member added to the default mode, then (300 changes later in the same held burst) removed
  /// from it and added to another mode, is in the other mode only once the burst is applied; the
  /// loop runs only the default mode meanwhile. Without the budget the three changes are applied in
  /// one pass and the member never fires in the default mode; with the removal left to a later
  /// pass, it must not either (the removal was made, the member's side changed at the call).
  @Test(arguments: MovedMemberKind.allCases)
  func aMemberMovedToAnotherModeBehindTheBudgetDoesNotFireInTheOldMode(kind: MovedMemberKind) throws {
    let outcome = try Self.moveBehind(fillers: 300, kind: kind)
    #expect(outcome?.before == 0, "fired in the mode it was removed from")
    #expect(outcome?.after == 1, "fired in the mode it was moved to")
  }

  /// The control for the test above: the same three changes with no burst between them are
  /// applied in one pass, and the member fires only in the mode it was moved to.
  @Test(arguments: MovedMemberKind.allCases)
  func aMemberMovedToAnotherModeInOnePassDoesNotFireInTheOldMode(kind: MovedMemberKind) throws {
    let outcome = try Self.moveBehind(fillers: 0, kind: kind)
    #expect(outcome?.before == 0, "fired in the mode it was removed from")
    #expect(outcome?.after == 1, "fired in the mode it was moved to")
  }

  /// Held loop: adds the member to the default mode, sends `fillers` adds, then moves the member
  /// to another mode; runs the default mode, then the other mode one pass. Returns how often the
  /// member fired before, and after, the other mode ran.
  /// The same rule when the member stays on the loop: a timer in `.default` and another mode (by
  /// name, or through `.common`) is made due and then removed from `.default` (or from `.common`)
  /// behind a held burst of 300 changes. The pass that applies the first 256 runs `.default` with
  /// the timer still held there: it must not fire there (the removal was made), and fires once when
  /// the other mode runs.
  @Test(arguments: [false, true])
  func aTimerRemovedFromOneOfItsModesBehindTheBudgetDoesNotFireThere(throughCommon: Bool) throws {
    let other: RunLoopMode = "kept-other"
    let outcome = try withWatchdogSync(timeout: .seconds(20), "removed from one mode") { () -> [Int] in
      let loop = try RunLoopThread(name: "kept")
      defer { loop.shutdownAndWait() }
      let fired = AtomicCounter()
      let timer = LoopTimer(after: .seconds(3_600)) { _ in fired.increment() }
      let named: RunLoopMode = throughCommon ? .common : .default
      loop.add(timer, to: named)
      loop.add(timer, to: other)
      try loop.performAndWait {}  // both adds applied
      let sources = (0..<300).map { _ in RoutineCountingSource() }
      burstBehindHeldLoop(sources.map(\.source), on: loop) {
        timer.setFireDate(.now)  // applied by the first pass, which then fires .default's due timers
      } then: {
        loop.remove(timer, from: named)
      }
      try loop.performAndWait {}
      try loop.performAndWait {}
      let inDefault = fired.current
      try loop.performAndWait { _ = loop.run(mode: other, until: .now) }
      let inOther = fired.current - inDefault
      timer.invalidate()
      for counted in sources { counted.source.invalidate() }
      try loop.performAndWait {}
      return [inDefault, inOther]
    }
    #expect(outcome == [0, 1], "[fired in .default, fired in the other mode]")
  }

  /// A timer due at once is added first in a held burst, and re-timed an hour later from another
  /// thread 300 changes on (its add is applied a pass before the re-timing): it never fires early.
  /// Re-timed to now afterwards, it fires exactly once (a repeating one too, and stays valid).
  @Test(arguments: [false, true])
  func aTimerRetimedLaterBehindTheBudgetNeverFiresEarly(repeating: Bool) throws {
    let outcome = try withWatchdogSync(timeout: .seconds(20), "re-timed") {
      () -> (early: Int, late: Int, valid: Bool) in
      let loop = try RunLoopThread(name: "retimed")
      defer { loop.shutdownAndWait() }
      let fired = AtomicCounter()
      let timer = LoopTimer(after: .zero, repeatingEvery: repeating ? .seconds(3_600) : nil) { _ in fired.increment() }
      let sources = (0..<300).map { _ in RoutineCountingSource() }
      burstBehindHeldLoop(sources.map(\.source), on: loop) {
        loop.add(timer)
      } then: {
        timer.setFireDate(.now.advanced(by: .seconds(3_600)))
        timer.setFireDate(.now.advanced(by: .seconds(7_200)))
      }
      try loop.performAndWait {}
      try loop.performAndWait {}
      let early = fired.current
      timer.setFireDate(.now)
      waitUntil(timeout: .seconds(10), "the re-timed fire") { fired.current >= 1 }
      try loop.performAndWait {}
      try loop.performAndWait {}
      let late = fired.current
      let valid = timer.isValid
      timer.invalidate()
      for counted in sources { counted.source.invalidate() }
      return (early, late, valid)
    }
    #expect(outcome?.early == 0)
    #expect(outcome?.late == 1)
    #expect(outcome?.valid == repeating)
  }

  /// Members added to a held loop A behind 300 adds, then removed from A and added to loop B at
  /// once (the move is allowed at the call): B has them before A even applied the add. A custom
  /// source's routines pair up on each loop, and it fires on B once when signalled; a due timer
  /// fires once, on B only; a descriptor source delivers on B only.
  @Test func membersMovedToAnotherLoopBeforeTheirAddWasAppliedFireThereOnly() throws {
    let outcome = try withWatchdogSync(timeout: .seconds(20), "moved between loops") { () -> [String] in
      let loopA = try RunLoopThread(name: "move-a")
      let loopB = try RunLoopThread(name: "move-b")
      defer {
        loopA.shutdownAndWait()
        loopB.shutdownAndWait()
      }
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let pairs = PairLog()
      let fires = EventLog()
      let source = InputSource(
        schedule: { _, loop, _ in pairs.schedule(loop) }, cancel: { _, loop in pairs.cancel(loop) },
        perform: { _ in fires.add("source on \(RunLoopThread.current.name)") })
      let timer = LoopTimer(after: .zero) { _ in fires.add("timer on \(RunLoopThread.current.name)") }
      let descriptor = DescriptorSource(descriptor: pipe.read) { source, _ in
        drainDescriptor(source.descriptor)
        fires.add("descriptor on \(RunLoopThread.current.name)")
      }
      writeByte(pipe.write)
      let fillers = (0..<300).map { _ in RoutineCountingSource() }
      var found: [String] = []
      let release = blockLoop(loopA)
      for counted in fillers { loopA.add(counted.source) }
      loopA.add(source)
      loopA.add(timer)
      do throws(SystemCallError) { try loopA.add(descriptor) } catch { found.append("add to A threw \(error)") }
      loopA.remove(source)
      loopA.remove(timer)
      loopA.remove(descriptor)
      loopB.add(source)
      loopB.add(timer)
      do throws(SystemCallError) { try loopB.add(descriptor) } catch { found.append("add to B threw \(error)") }
      source.signal()
      release.open()
      try loopA.performAndWait {}
      try loopA.performAndWait {}
      waitUntil(timeout: .seconds(10), "the fires on B") { fires.snapshot.count >= 3 }
      try loopB.performAndWait {}
      try loopA.performAndWait {}
      let got = fires.snapshot.sorted()
      if got != ["descriptor on move-b", "source on move-b", "timer on move-b"] {
        found.append("fires \(got)")
      }
      let onB = try loopB.performAndWait { (loopB.core.modeCount(of: source), loopB.core.modeCount(of: descriptor)) }
      if onB != (1, 1) { found.append("on B: \(onB)") }
      source.invalidate()
      descriptor.invalidate()
      timer.invalidate()
      for counted in fillers { counted.source.invalidate() }
      try loopA.performAndWait {}
      try loopB.performAndWait {}
      found += pairs.unpaired
      if pairs.counts.snapshot["move-b"]?.schedule != 1 { found.append("B: \(pairs.counts.snapshot)") }
      return found
    }
    #expect(outcome == [])
  }

  /// A timer's add waits 400 changes into a held burst while the schedule routine of the burst's
  /// 6th add re-times it on the loop thread (before its add is applied): later (it was due at
  /// once) or sooner (it was due in an hour). The add then applied keeps the new date: the first
  /// never fires early and fires once when re-timed to now; the second fires exactly once.
  @Test func aLoopThreadRetimingSoonerOfATimerWhoseAddWaits() throws {
    let outcome = try Self.retimeOnTheLoop(sooner: true)
    #expect(outcome?.early == 1)
    #expect(outcome?.late == 1)
  }

  /// The later case of the test above: the loop-thread `setFireDate` made while the timer's add
  /// waits leaves the timer's reschedule marked pending for good (`applyReschedule` returns
  /// early for a record not attached yet, without `rescheduleApplied`), so every later
  /// `setFireDate` from another thread is dropped as "already sent": re-timed to now, the timer
  /// never fires (it keeps the hour-later date).
  @Test
  func aLoopThreadRetimingLaterOfATimerWhoseAddWaits() throws {
    let outcome = try Self.retimeOnTheLoop(sooner: false)
    #expect(outcome?.early == 0)
    #expect(outcome?.late == 1)
  }

  /// A due timer stays in `.default` the whole time: only the way it is there changes (by name
  /// or through `.common`), behind a burst of 300 changes. The first pass after the burst holds it
  /// in `.default` the old way and fires it: it must fire there exactly once. (Before 2026-12-03: never,
  /// and the one-shot timer stays valid: its popped heap entry is lost.)
  @Test(
    arguments: [DefaultModeRoute.commonToName, .nameToCommon], [false, true])
  func aTimerKeptInItsModeByAnotherRouteBehindTheBudgetStillFires(route: DefaultModeRoute, repeating: Bool) throws {
    let outcome = try withWatchdogSync(timeout: .seconds(20), "re-routed") { () -> [Int] in
      let loop = try RunLoopThread(name: "route")
      defer { loop.shutdownAndWait() }
      let fired = AtomicCounter()
      let timer = LoopTimer(after: .seconds(3_600), repeatingEvery: repeating ? .seconds(3_600) : nil) { _ in
        fired.increment()
      }
      let (first, second): (RunLoopMode, RunLoopMode) =
        route == .commonToName ? (.common, .default) : (.default, .common)
      loop.add(timer, to: first)
      try loop.performAndWait {}
      let fillers = fillerSources(300)
      burstBehindHeldLoop(fillers, on: loop) {
        timer.setFireDate(.now)  // applied by the first pass, which then fires .default's due timers
      } then: {
        loop.add(timer, to: second)
        loop.remove(timer, from: first)
      }
      for _ in 0..<3 { try loop.performAndWait {} }
      try loop.performAndWait { _ = loop.run(mode: .default, until: .now) }
      let result = [fired.current, timer.isValid ? 1 : 0]
      timer.invalidate()
      for filler in fillers { filler.invalidate() }
      try loop.performAndWait {}
      return result
    }
    #expect(outcome == [1, repeating ? 1 : 0], "[fires in .default, still valid]")
  }

  /// An observer re-routed in `.default` (from `.common` to `.default` by name) behind a burst
  /// is told of every pass of `.default`, as an observer left alone there is.
  @Test
  func anObserverKeptInItsModeByAnotherRouteBehindTheBudgetMissesNoPass() throws {
    let outcome = try withWatchdogSync(timeout: .seconds(20), "observer re-routed") { () -> [Int] in
      let loop = try RunLoopThread(name: "obs-route")
      defer { loop.shutdownAndWait() }
      let stable = AtomicCounter()
      let rerouted = AtomicCounter()
      let stableObserver = LoopObserver(activities: [.beforeTimers, .beforeSources, .afterWaiting]) { _, _ in
        stable.increment()
      }
      let reroutedObserver = LoopObserver(activities: [.beforeTimers, .beforeSources, .afterWaiting]) { _, _ in
        rerouted.increment()
      }
      loop.add(stableObserver, to: .default)
      loop.add(reroutedObserver, to: .common)
      try loop.performAndWait {}
      let fillers = fillerSources(700)
      let release = blockLoop(loop)
      let base = (stable.current, rerouted.current)
      for filler in fillers { loop.add(filler) }
      loop.add(reroutedObserver, to: .default)
      loop.remove(reroutedObserver, from: .common)
      release.open()
      for _ in 0..<3 { try loop.performAndWait {} }
      // Both read on the loop thread, between notifications: read from here, a notification in
      // progress (the stable observer told, the re-routed one not yet) showed as a missed pass.
      let counts = try loop.performAndWait { (stable.current, rerouted.current) }
      let result = [counts.0 - base.0, counts.1 - base.1]
      stableObserver.invalidate()
      reroutedObserver.invalidate()
      for filler in fillers { filler.invalidate() }
      try loop.performAndWait {}
      return [result[0] - result[1]]
    }
    #expect(outcome == [0], "[passes the re-routed observer missed]")
  }

  /// A due timer removed from `.default` and added to it again behind a burst (alone: a new
  /// record; or also in another mode: the same one) fires exactly once in `.default`.
  @Test(arguments: [false, true])
  func aTimerRemovedAndReaddedBehindTheBudgetFiresOnce(alsoInOther: Bool) throws {
    let other: RunLoopMode = "readd-other"
    let outcome = try withWatchdogSync(timeout: .seconds(20), "re-added") { () -> [Int] in
      let loop = try RunLoopThread(name: "readd")
      defer { loop.shutdownAndWait() }
      let fired = AtomicCounter()
      let timer = LoopTimer(after: .seconds(3_600)) { _ in fired.increment() }
      loop.add(timer, to: .default)
      if alsoInOther { loop.add(timer, to: other) }
      try loop.performAndWait {}
      let fillers = fillerSources(300)
      burstBehindHeldLoop(fillers, on: loop) {
        timer.setFireDate(.now)
      } then: {
        loop.remove(timer, from: .default)
        loop.add(timer, to: .default)
      }
      for _ in 0..<3 { try loop.performAndWait {} }
      try loop.performAndWait { _ = loop.run(mode: .default, until: .now) }
      let result = [fired.current, timer.isValid ? 1 : 0]
      timer.invalidate()
      for filler in fillers { filler.invalidate() }
      try loop.performAndWait {}
      return result
    }
    #expect(outcome == [1, 0], "[fired, still valid]")
  }

  /// A timer in `.default` by name and through `.common`, removed from `.common` behind a burst,
  /// fires exactly once in `.default`; one in `.common` only, removed from `.default` by name
  /// (a no-op on the binding's names), too.
  @Test(arguments: [false, true])
  func aTimerStillNamedAfterAWaitingRemovalFiresOnce(removeCommon: Bool) throws {
    let outcome = try withWatchdogSync(timeout: .seconds(20), "still named") { () -> [Int] in
      let loop = try RunLoopThread(name: "named")
      defer { loop.shutdownAndWait() }
      let fired = AtomicCounter()
      let timer = LoopTimer(after: .seconds(3_600)) { _ in fired.increment() }
      loop.add(timer, to: .common)
      if removeCommon { loop.add(timer, to: .default) }
      try loop.performAndWait {}
      let fillers = fillerSources(300)
      burstBehindHeldLoop(fillers, on: loop) {
        timer.setFireDate(.now)
      } then: {
        loop.remove(timer, from: removeCommon ? .common : .default)
      }
      for _ in 0..<3 { try loop.performAndWait {} }
      try loop.performAndWait { _ = loop.run(mode: .default, until: .now) }
      let result = [fired.current]
      timer.invalidate()
      for filler in fillers { filler.invalidate() }
      try loop.performAndWait {}
      return result
    }
    #expect(outcome == [1])
  }

  /// A readable (level-triggered) descriptor removed from `.default` behind a burst of 1,000
  /// changes is not told in `.default`; once the burst is applied the idle loop does not spin on
  /// it (passes counted by an `.afterWaiting` observer while idle), and a run of its other mode
  /// tells it exactly once.
  @Test func aReadableDescriptorRemovedBehindABurstIsNotToldAndDoesNotSpin() throws {
    let other: RunLoopMode = "spin-other"
    let outcome = try withWatchdogSync(timeout: .seconds(20), "spin") { () -> [Int] in
      let loop = try RunLoopThread(name: "spin")
      defer { loop.shutdownAndWait() }
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let told = AtomicCounter()
      let wakes = AtomicCounter()
      let descriptor = DescriptorSource(descriptor: pipe.read) { source, _ in
        drainDescriptor(source.descriptor)
        told.increment()
      }
      let observer = LoopObserver(activities: .afterWaiting) { _, _ in wakes.increment() }
      try loop.add(descriptor, to: .default)
      try loop.add(descriptor, to: other)
      loop.add(observer, to: .default)
      try loop.performAndWait {}
      let fillers = fillerSources(1_000)
      burstBehindHeldLoop(fillers, on: loop) {
        writeByte(pipe.write)
      } then: {
        loop.remove(descriptor, from: .default)
      }
      for _ in 0..<6 { try loop.performAndWait {} }
      let inDefault = told.current
      let before = wakes.current
      usleep(200_000)  // idle: a loop spinning on the readable pipe would wake thousands of times
      let idleWakes = wakes.current - before
      try loop.performAndWait { _ = loop.run(mode: other, until: .now) }
      let inOther = told.current - inDefault
      descriptor.invalidate()
      observer.invalidate()
      for filler in fillers { filler.invalidate() }
      try loop.performAndWait {}
      return [inDefault, min(idleWakes, 99), inOther]
    }
    #expect(outcome == [0, 0, 1], "[told in .default, idle wake-ups, told in the other mode]")
  }

  /// A due timer moved from loop A to loop B while its removal waits behind a burst on A fires
  /// exactly once, on B (A refuses it: its binding names B).
  @Test func aTimerMovedToAnotherLoopBehindTheBudgetFiresOnceThere() throws {
    let outcome = try withWatchdogSync(timeout: .seconds(20), "moved loop") { () -> [Int] in
      let loopA = try RunLoopThread(name: "move-a")
      defer { loopA.shutdownAndWait() }
      let loopB = try RunLoopThread(name: "move-b")
      defer { loopB.shutdownAndWait() }
      let onA = AtomicCounter()
      let onB = AtomicCounter()
      let timer = LoopTimer(after: .seconds(3_600)) { _ in
        if loopA.isOnLoopThread { onA.increment() } else if loopB.isOnLoopThread { onB.increment() }
      }
      loopA.add(timer)
      try loopA.performAndWait {}
      let fillers = fillerSources(300)
      let releaseA = blockLoop(loopA)
      timer.setFireDate(.now)
      for filler in fillers { loopA.add(filler) }
      let releaseB = blockLoop(loopB)
      loopA.remove(timer)
      loopB.add(timer)
      releaseA.open()
      for _ in 0..<3 { try loopA.performAndWait {} }
      releaseB.open()
      for _ in 0..<3 { try loopB.performAndWait {} }
      let result = [onA.current, onB.current]
      timer.invalidate()
      for filler in fillers { filler.invalidate() }
      try loopA.performAndWait {}
      return result
    }
    #expect(outcome == [0, 1], "[fired on A, fired on B]")
  }

  /// A flood of `setFireDate` from three threads and from blocks on the loop thread while the
  /// timer's add waits behind a burst; after it the last date set (now, from another thread or
  /// from the loop thread) wins: the timer fires exactly once.
  @Test(arguments: [false, true])
  func theLastFireDateWinsAfterAFloodFromEveryThread(lastFromLoopThread: Bool) throws {
    let outcome = try withWatchdogSync(timeout: .seconds(20), "flood") { () -> [Int] in
      let loop = try RunLoopThread(name: "flood")
      defer { loop.shutdownAndWait() }
      let fired = AtomicCounter()
      let timer = LoopTimer(after: .seconds(3_600)) { _ in fired.increment() }
      let fillers = fillerSources(300)
      burstBehindHeldLoop(fillers, on: loop) {
        loop.add(timer)
      } then: {
      }
      let far = LoopClock.Instant.now.advanced(by: .seconds(7_200))
      var bodies: [@Sendable () -> Void] = (0..<3).map { index in
        {
          for step in 0..<400 { timer.setFireDate(far.advanced(by: .milliseconds(index * 1_000 + step))) }
        }
      }
      bodies.append {
        for step in 0..<100 {
          loop.perform { timer.setFireDate(far.advanced(by: .seconds(step))) }
        }
      }
      race(bodies)
      for _ in 0..<3 { try loop.performAndWait {} }
      let early = fired.current
      if lastFromLoopThread {
        try loop.performAndWait { timer.setFireDate(.now) }
      } else {
        timer.setFireDate(.now)
      }
      for _ in 0..<3 { try loop.performAndWait {} }
      try loop.performAndWait { _ = loop.run(mode: .default, until: .now) }
      let result = [early, fired.current, timer.isValid ? 1 : 0]
      timer.invalidate()
      for filler in fillers { filler.invalidate() }
      try loop.performAndWait {}
      return result
    }
    #expect(outcome == [0, 1, 0], "[fired early, fired, still valid]")
  }

  /// A loop-thread `setFireDate` (from a block, or from a change's schedule routine) made while a
  /// reschedule from another thread waits behind a burst leaves nothing pending: a later
  /// `setFireDate(.now)` from another thread still reaches the loop and the timer fires once.
  @Test(arguments: [false, true])
  func aLoopThreadRetimeWhileARescheduleWaitsLeavesNothingPending(fromChangeRoutine: Bool) throws {
    let outcome = try withWatchdogSync(timeout: .seconds(20), "pending reschedule") { () -> [Int] in
      let loop = try RunLoopThread(name: "pending")
      defer { loop.shutdownAndWait() }
      let fired = AtomicCounter()
      let timer = LoopTimer(after: .seconds(3_600)) { _ in fired.increment() }
      loop.add(timer)
      try loop.performAndWait {}
      let far = LoopClock.Instant.now.advanced(by: .seconds(7_200))
      let trigger = InputSource(
        schedule: { _, _, _ in timer.setFireDate(far.advanced(by: .seconds(2))) }, perform: { _ in })
      let fillers = fillerSources(300)
      burstBehindHeldLoop(fillers, on: loop) {
        if fromChangeRoutine { loop.add(trigger) }
      } then: {
        timer.setFireDate(far.advanced(by: .seconds(1)))
        if !fromChangeRoutine { loop.perform { timer.setFireDate(far.advanced(by: .seconds(2))) } }
      }
      for _ in 0..<3 { try loop.performAndWait {} }
      let early = fired.current
      let kept = timer.fireDate == far.advanced(by: .seconds(2)) ? 1 : 0
      timer.setFireDate(.now)
      for _ in 0..<3 { try loop.performAndWait {} }
      try loop.performAndWait { _ = loop.run(mode: .default, until: .now) }
      let result = [early, kept, fired.current]
      timer.invalidate()
      trigger.invalidate()
      for filler in fillers { filler.invalidate() }
      try loop.performAndWait {}
      return result
    }
    #expect(outcome == [0, 1, 1], "[fired early, last far date kept, fired]")
  }

  /// A due timer in mode M by name (M not in the common set) is added to `.common` and removed
  /// from M by name, behind a burst; `addModeToCommonModes(M)` is sent in the same burst.
  /// Removing a mode by name takes the member out of that mode, also while it is in `.common`
  /// (README, "Members: one lifecycle"): once the burst is applied the timer is in `.default`
  /// (through `.common`) and not in M. It must not fire in M (the removal was made before the
  /// passes that held it there), and fires exactly once when `.default` runs.
  @Test
  func aTimerWhoseModeJoinsTheCommonSetBehindTheBudgetStillFires() throws {
    let mode: RunLoopMode = "joins-common"
    let outcome = try withWatchdogSync(timeout: .seconds(20), "joins common") { () -> [Int] in
      let loop = try RunLoopThread(name: "joins-common")
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
      let fillers = fillerSources(300)
      burstBehindHeldLoop(fillers, on: loop, inModes: [mode]) {
        timer.setFireDate(.now)
      } then: {
        loop.addModeToCommonModes(mode)
        loop.add(timer, to: .common)
        loop.remove(timer, from: mode)
      }
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
    let mode: RunLoopMode = "common-from-start"
    let outcome = try withWatchdogSync(timeout: .seconds(20), "named and common") { () -> [Int] in
      let loop = try RunLoopThread(name: "common-start")
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
      let fillers = fillerSources(300)
      burstBehindHeldLoop(fillers, on: loop, inModes: [mode]) {
        timer.setFireDate(.now)
      } then: {
        loop.remove(timer, from: mode)
      }
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
}
