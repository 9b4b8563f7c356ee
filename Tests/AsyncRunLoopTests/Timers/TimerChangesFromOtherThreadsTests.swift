import Glibc
import Testing

@testable import AsyncRunLoop

/// A timer moved, retimed or invalidated from another thread fires as its last change says.
@Suite(
  "A timer moved, retimed or invalidated from another thread fires as its last change says", .serialized,
  .timeLimit(.minutes(10)))
struct TimerChangesFromOtherThreadsTests: SharedTestLoops, TimerCalloutModes {
  /// SPEC §4 ("its fire date can be moved"), `setFireDate` ("any thread"), and CF's rule: a fire
  /// date set during the timer's callout (to a date after the fire being made) is honoured, not
  /// overwritten by the next point of the repeat grid.
  @Test func crossThreadSetFireDateDuringCalloutIsHonoured() async throws {
    let loop = try RunLoopThread(name: "review-setfire")
    defer { loop.shutdownAndWait() }
    let fires = AtomicCounter()
    let inCallout = TestGate()
    let moved = TestGate()
    let timer = LoopTimer(fireAt: .now, repeatingEvery: .seconds(3600)) { _ in
      if fires.increment() == 1 {
        inCallout.open()
        _ = moved.wait(timeout: .seconds(10))
      }
    }
    loop.add(timer)
    let result = try await withWatchdogOnThread {
      _ = inCallout.wait(timeout: .seconds(10))
      // Another thread moves the next fire to 20 ms from now while the first callout runs.
      timer.setFireDate(.now.advanced(by: .milliseconds(20)))
      moved.open()
      // Bound, not a timing assertion: the moved date is 20 ms away, the grid point an hour.
      let deadline = ContinuousClock.now.advanced(by: .seconds(10))
      while fires.current < 2 && ContinuousClock.now < deadline { usleep(1000) }
      return fires.current
    }
    timer.invalidate()
    #expect(result == 2, "the fire date set during the callout was overwritten by the repeat grid")
  }

  /// While the loop is held in a block, another thread moves a timer to a near date many times,
  /// then far away: released, the loop applies the last date only, and the timer never fires.
  /// Then many far dates and a near one last: it fires once, not before that date.
  @Test func theLastSetFireDateFromAnotherThreadWins() async throws {
    let loop = try RunLoopThread(name: "resched")
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
    let loop = try RunLoopThread(name: "grid")
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
            loop.add(other, to: orderModeB)
            loop.remove(other, from: orderModeB)
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
    let first = try RunLoopThread(name: "old")
    let second = try RunLoopThread(name: "new")
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
        if fires.snapshot != ["old"] { problems.append("round \(round): fires \(fires.snapshot)") }
        timer.invalidate()
      }
      return problems
    }
    #expect(outcome == [])
  }

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
      loopA.add(timer, to: RunLoopMode("never"))
      race([
        { for _ in 0..<20 { timer.setFireDate(.now.advanced(by: .seconds(3_600))) } },
        {
          loopA.remove(timer, from: .common)
          loopA.remove(timer, from: RunLoopMode("never"))
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

  /// Two due timers on loop A; the first one's callout has another thread move the second, a
  /// one-shot timer, to loop B (remove from A, add to B) before A reaches it. A pops the second's
  /// stale entry: its callout does not run there, and A leaves the timer alone: it fires on B.
  /// (Before the fix A invalidated it, and it never fired on B.)
  @Test
  func oneShotMovedToAnotherLoopBeforeItsFireFiresThere() async throws {
    let loopA = try RunLoopThread(name: "move-a")
    defer { loopA.shutdownAndWait() }
    let loopB = try RunLoopThread(name: "move-b")
    defer { loopB.shutdownAndWait() }
    let modeA = self.modeA
    let base = LoopClock.Instant.now  // one instant: the order of the due dates is fixed
    let modeB = self.modeB
    let result = try await withWatchdogOnThread { () -> (onA: Int, onB: Int, valid: Bool, validAfter: Bool) in
      let onA = AtomicCounter()
      let onB = AtomicCounter()
      let moved = LoopTimer(fireAt: base.advanced(by: .milliseconds(-5))) { _ in
        if loopA.isOnLoopThread { onA.increment() } else { onB.increment() }
      }
      let valid = try loopA.performAndWait { () -> Bool in
        let keeper = InputSource(perform: { _ in })
        loopA.add(keeper, to: modeA)
        let first = LoopTimer(fireAt: base.advanced(by: .milliseconds(-50))) { _ in
          joinThread(
            startThread {
              loopA.remove(moved, from: modeA)
              loopB.add(moved, to: modeB)  // B does not run modeB yet
            })
        }
        loopA.add(first, to: modeA)
        loopA.add(moved, to: modeA)
        for _ in 0..<2 { loopA.run(mode: modeA, until: .now) }
        keeper.invalidate()
        return moved.isValid
      }
      try loopB.performAndWait {
        let keeper = InputSource(perform: { _ in })
        loopB.add(keeper, to: modeB)
        for _ in 0..<2 { loopB.run(mode: modeB, until: .now) }
        keeper.invalidate()
      }
      let validAfter = moved.isValid
      moved.invalidate()
      return (onA.current, onB.current, valid, validAfter)
    }
    #expect(result?.onA == 0)
    #expect(result?.valid == true, "loop A invalidated a timer that had moved to loop B")
    #expect(result?.onB == 1, "the moved one-shot timer never fired on its new loop")
    #expect(result?.validAfter == false)
  }

  /// The same move, but the timer's `setFireDate` was called once before it was added: its
  /// `versionAtFire` (set only by a callout that runs) is stale, so A's `afterFire` answers
  /// `.rescheduled` for the callout that never ran, leaves the timer alone, and it fires on B.
  /// (This passed even before the fix of the test above, whose outcome then hung on a stale version.)
  @Test func oneShotMovedAfterAnEarlierSetFireDateFiresThere() async throws {
    let loopA = try RunLoopThread(name: "move-sa")
    defer { loopA.shutdownAndWait() }
    let loopB = try RunLoopThread(name: "move-sb")
    defer { loopB.shutdownAndWait() }
    let modeA = self.modeA
    let base = LoopClock.Instant.now  // one instant: the order of the due dates is fixed
    let modeB = self.modeB
    let result = try await withWatchdogOnThread { () -> (onA: Int, onB: Int, validAfter: Bool) in
      let onA = AtomicCounter()
      let onB = AtomicCounter()
      let moved = LoopTimer(fireAt: .now) { _ in
        if loopA.isOnLoopThread { onA.increment() } else { onB.increment() }
      }
      moved.setFireDate(base.advanced(by: .milliseconds(-5)))
      try loopA.performAndWait {
        let keeper = InputSource(perform: { _ in })
        loopA.add(keeper, to: modeA)
        let first = LoopTimer(fireAt: base.advanced(by: .milliseconds(-50))) { _ in
          joinThread(
            startThread {
              loopA.remove(moved, from: modeA)
              loopB.add(moved, to: modeB)
            })
        }
        loopA.add(first, to: modeA)
        loopA.add(moved, to: modeA)
        for _ in 0..<2 { loopA.run(mode: modeA, until: .now) }
        keeper.invalidate()
      }
      try loopB.performAndWait {
        let keeper = InputSource(perform: { _ in })
        loopB.add(keeper, to: modeB)
        for _ in 0..<2 { loopB.run(mode: modeB, until: .now) }
        keeper.invalidate()
      }
      let validAfter = moved.isValid
      moved.invalidate()
      return (onA.current, onB.current, validAfter)
    }
    #expect(result?.onA == 0)
    #expect(result?.onB == 1)
    #expect(result?.validAfter == false)
  }

  /// The same for a repeating (1 h) timer: A does not move the date of a timer that never fired
  /// there, so B makes its due fire. (Before the fix A advanced it a period and the fire was lost.)
  @Test
  func repeatingMovedToAnotherLoopBeforeItsFireKeepsItsDate() async throws {
    let loopA = try RunLoopThread(name: "move-ra")
    defer { loopA.shutdownAndWait() }
    let loopB = try RunLoopThread(name: "move-rb")
    defer { loopB.shutdownAndWait() }
    let modeA = self.modeA
    let base = LoopClock.Instant.now  // one instant: the order of the due dates is fixed
    let modeB = self.modeB
    let result = try await withWatchdogOnThread { () -> (onA: Int, onB: Int, kept: Bool) in
      let onA = AtomicCounter()
      let onB = AtomicCounter()
      let date = base.advanced(by: .milliseconds(-5))
      let moved = LoopTimer(fireAt: date, repeatingEvery: .seconds(3600)) { _ in
        if loopA.isOnLoopThread { onA.increment() } else { onB.increment() }
      }
      let release = blockLoop(loopB)
      let kept = try loopA.performAndWait { () -> Bool in
        let keeper = InputSource(perform: { _ in })
        loopA.add(keeper, to: modeA)
        let first = LoopTimer(fireAt: base.advanced(by: .milliseconds(-50))) { _ in
          joinThread(
            startThread {
              loopA.remove(moved, from: modeA)
              loopB.add(moved, to: modeB)
            })
        }
        loopA.add(first, to: modeA)
        loopA.add(moved, to: modeA)
        for _ in 0..<2 { loopA.run(mode: modeA, until: .now) }
        keeper.invalidate()
        return moved.fireDate == date
      }
      release.open()
      try loopB.performAndWait {
        let keeper = InputSource(perform: { _ in })
        loopB.add(keeper, to: modeB)
        for _ in 0..<2 { loopB.run(mode: modeB, until: .now) }
        keeper.invalidate()
      }
      moved.invalidate()
      return (onA.current, onB.current, kept)
    }
    #expect(result?.onA == 0)
    #expect(result?.kept == true, "loop A moved the date of a timer that never fired there")
    #expect(result?.onB == 1, "the moved timer's due fire was skipped")
  }

  /// Two due timers; the first one's callout has another thread set the second (repeating, 1 h)
  /// timer's date 2 h ahead, off its grid, and waits for that call to return. "Elsewhere it takes
  /// effect on the loop's next pass": the second may still fire in this pass, but afterwards its
  /// date must be the one set. (Before the fix the grid advance overwrote it: the call counted as
  /// made before the fire.)
  @Test
  func setFireDateFromAnotherThreadBeforeTheCalloutIsKept() async throws {
    let loop = try RunLoopThread(name: "set-before")
    defer { loop.shutdownAndWait() }
    let modeA = self.modeA
    let base = LoopClock.Instant.now  // one instant: the order of the due dates is fixed
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (fires: Int, kept: Bool) in
        let fires = AtomicCounter()
        let keeper = InputSource(perform: { _ in })
        loop.add(keeper, to: modeA)
        let later = LoopClock.Instant.now.advanced(by: .seconds(7200))
        let second = LoopTimer(fireAt: base.advanced(by: .milliseconds(-5)), repeatingEvery: .seconds(3600)) { _ in
          fires.increment()
        }
        let first = LoopTimer(fireAt: base.advanced(by: .milliseconds(-50))) { _ in
          joinThread(startThread { second.setFireDate(later) })
        }
        loop.add(first, to: modeA)
        loop.add(second, to: modeA)
        for _ in 0..<3 { loop.run(mode: modeA, until: .now) }
        let outcome = (fires.current, second.fireDate == later)
        keeper.invalidate()
        second.invalidate()
        return outcome
      }
    }
    #expect((result?.fires ?? 9) <= 1)
    #expect(result?.kept == true, "a date set from another thread was replaced by the grid")
  }

  /// The same for a one-shot timer: a future date set from another thread before its callout
  /// starts; afterwards it must still have that date to fire at (valid), or never have fired.
  @Test
  func oneShotSetFireDateFromAnotherThreadBeforeTheCalloutIsKept() async throws {
    let loop = try RunLoopThread(name: "set-before-1")
    defer { loop.shutdownAndWait() }
    let modeA = self.modeA
    let base = LoopClock.Instant.now  // one instant: the order of the due dates is fixed
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (fires: Int, valid: Bool) in
        let fires = AtomicCounter()
        let keeper = InputSource(perform: { _ in })
        loop.add(keeper, to: modeA)
        let later = LoopClock.Instant.now.advanced(by: .seconds(7200))
        let second = LoopTimer(fireAt: base.advanced(by: .milliseconds(-5))) { _ in fires.increment() }
        let first = LoopTimer(fireAt: base.advanced(by: .milliseconds(-50))) { _ in
          joinThread(startThread { second.setFireDate(later) })
        }
        loop.add(first, to: modeA)
        loop.add(second, to: modeA)
        for _ in 0..<3 { loop.run(mode: modeA, until: .now) }
        let outcome = (fires.current, second.isValid)
        keeper.invalidate()
        second.invalidate()
        return outcome
      }
    }
    #expect(result?.valid == true, "fires \(result?.fires ?? -1): the date set 2 h ahead was dropped")
  }

  /// A one-shot timer invalidated from another thread while an earlier timer's callout runs:
  /// it never fires, is detached, and its mode finishes.
  @Test func oneShotInvalidatedFromAnotherThreadBeforeItsFireNeverFires() async throws {
    let loop = try RunLoopThread(name: "invalidate-before")
    defer { loop.shutdownAndWait() }
    let modeA = self.modeA
    let base = LoopClock.Instant.now  // one instant: the order of the due dates is fixed
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (fires: Int, modes: Int, run: RunLoopRunResult) in
        let fires = AtomicCounter()
        let second = LoopTimer(fireAt: base.advanced(by: .milliseconds(-5))) { _ in fires.increment() }
        second.setFireDate(base.advanced(by: .milliseconds(-5)))  // a stale version: never fired
        let first = LoopTimer(fireAt: base.advanced(by: .milliseconds(-50))) { _ in
          joinThread(startThread { second.invalidate() })
        }
        loop.add(first, to: modeA)
        loop.add(second, to: modeA)
        loop.run(mode: modeA, until: .now)
        let run = loop.run(mode: modeA, until: .now.advanced(by: .milliseconds(50)))
        return (fires.current, loop.core.modes(of: second).count, run)
      }
    }
    #expect(result?.fires == 0)
    #expect(result?.modes == 0)
    #expect(result?.run == .finished)
  }

  /// `setFireDate(past)` on a one-shot timer from another thread at a random moment around its
  /// fire: it fires once or twice (once more when the call lands during the callout), never
  /// more, and ends invalid.
  @Test func oneShotSetFireDateRacingTheCalloutFiresAtMostTwice() async throws {
    let loop = try RunLoopThread(name: "race-set")
    defer { loop.shutdownAndWait() }
    let counts = try await withWatchdogOnThread { () -> [Int] in
      var counts: [Int] = []
      repeatRounds(40, budget: .milliseconds(400)) { _ in
        let fires = AtomicCounter()
        let timer = LoopTimer(fireAt: .now) { _ in fires.increment() }
        race([
          { loop.add(timer) },
          { timer.setFireDate(.now.advanced(by: .milliseconds(-1))) },
        ])
        waitUntil { !timer.isValid || fires.current >= 2 }
        _ = try? loop.performAndWait { loop.run(mode: .default, until: .now) }
        counts.append(timer.isValid ? -fires.current : fires.current)
        timer.invalidate()
      }
      return counts
    }
    #expect(counts?.allSatisfy { $0 == 1 || $0 == 2 } == true, "\(counts ?? [])")
  }
}
