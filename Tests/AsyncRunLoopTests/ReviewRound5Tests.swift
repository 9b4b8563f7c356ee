import Glibc
import Testing

@testable import AsyncRunLoop

/// Review round 5: what a timer's pass decides after its callout (`LoopTimer.afterFire`): a fire
/// date set during the callout, grid advance, one-shot end, parked and set-aside entries, nested
/// runs, moves to another loop and other threads racing the callout. Exact counts only; no timing
/// beyond "not before its date". Six of these failed before the fix that followed the review
/// (moves before a fire, a date set from another thread before the callout, a callout that
/// removes its timer from its only mode).
@Suite("ReviewRound5")
struct ReviewRound5Tests {
  let modeA = RunLoopMode("r5-a")
  let modeB = RunLoopMode("r5-b")
  let modeC = RunLoopMode("r5-c")

  // MARK: setFireDate from the callout

  /// A date in the past set in a one-shot timer's callout wins: it fires once more (on the next
  /// pass, never inside its own callout), then ends.
  @Test func oneShotSetToPastInCalloutFiresExactlyTwice() async throws {
    let loop = try RunLoopThread(name: "r5-oneshot-past")
    defer { loop.shutdownAndWait() }
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (fires: Int, valid: Bool) in
        let fires = AtomicCounter()
        let keeper = InputSource(perform: { _ in })
        loop.add(keeper, to: modeA)
        let timer = LoopTimer(fireAt: .now.advanced(by: .milliseconds(-5))) { timer in
          if fires.increment() == 1 { timer.setFireDate(.now.advanced(by: .milliseconds(-1))) }
        }
        loop.add(timer, to: modeA)
        for _ in 0..<4 { loop.run(mode: modeA, until: .now) }
        let valid = timer.isValid
        keeper.invalidate()
        timer.invalidate()
        return (fires.current, valid)
      }
    }
    #expect(result?.fires == 2)
    #expect(result?.valid == false)
  }

  /// A future date set in a one-shot timer's callout: it stays valid with that date and does not
  /// fire before it.
  @Test func oneShotSetToFutureInCalloutKeepsTheDate() async throws {
    let loop = try RunLoopThread(name: "r5-oneshot-future")
    defer { loop.shutdownAndWait() }
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (fires: Int, valid: Bool, kept: Bool) in
        let fires = AtomicCounter()
        let later = LoopClock.Instant.now.advanced(by: .seconds(3600))
        let keeper = InputSource(perform: { _ in })
        loop.add(keeper, to: modeA)
        let timer = LoopTimer(fireAt: .now.advanced(by: .milliseconds(-5))) { timer in
          fires.increment()
          timer.setFireDate(later)
        }
        loop.add(timer, to: modeA)
        for _ in 0..<3 { loop.run(mode: modeA, until: .now) }
        let outcome = (fires.current, timer.isValid, timer.fireDate == later)
        keeper.invalidate()
        timer.invalidate()
        return outcome
      }
    }
    #expect(result?.fires == 1)
    #expect(result?.valid == true)
    #expect(result?.kept == true)
  }

  /// `setFireDate(.now)` in the callout of a repeating (1 h) timer wins over the grid: it fires
  /// once more on the next pass, then advances from that date (no burst).
  @Test func repeatingSetToNowInCalloutFiresOnceMoreThenAdvances() async throws {
    let loop = try RunLoopThread(name: "r5-repeat-now")
    defer { loop.shutdownAndWait() }
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (fires: Int, future: Bool) in
        let fires = AtomicCounter()
        let keeper = InputSource(perform: { _ in })
        loop.add(keeper, to: modeA)
        let timer = LoopTimer(fireAt: .now.advanced(by: .milliseconds(-5)), repeatingEvery: .seconds(3600)) {
          timer in
          if fires.increment() == 1 { timer.setFireDate(.now) }
        }
        loop.add(timer, to: modeA)
        for _ in 0..<4 { loop.run(mode: modeA, until: .now) }
        let future = timer.fireDate > LoopClock.Instant.now.advanced(by: .seconds(3000))
        keeper.invalidate()
        timer.invalidate()
        return (fires.current, future)
      }
    }
    #expect(result?.fires == 2)
    #expect(result?.future == true)
  }

  /// An off-grid future date set in a repeating timer's callout is kept exactly.
  @Test func repeatingSetToFutureInCalloutKeepsTheDate() async throws {
    let loop = try RunLoopThread(name: "r5-repeat-future")
    defer { loop.shutdownAndWait() }
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (fires: Int, kept: Bool) in
        let fires = AtomicCounter()
        let later = LoopClock.Instant.now.advanced(by: .seconds(7777))
        let keeper = InputSource(perform: { _ in })
        loop.add(keeper, to: modeA)
        let timer = LoopTimer(fireAt: .now.advanced(by: .milliseconds(-5)), repeatingEvery: .zero) { timer in
          fires.increment()
          timer.setFireDate(later)
        }
        loop.add(timer, to: modeA)
        for _ in 0..<3 { loop.run(mode: modeA, until: .now) }
        let outcome = (fires.current, timer.fireDate == later)
        keeper.invalidate()
        timer.invalidate()
        return outcome
      }
    }
    #expect(result?.fires == 1)
    #expect(result?.kept == true)
  }

  // MARK: invalidate in the callout

  /// invalidate() then setFireDate(past) in the callout: invalid, never fires again.
  @Test(arguments: [false, true])
  func invalidateThenSetFireDateInCallout(repeating: Bool) async throws {
    let loop = try RunLoopThread(name: "r5-invalidate-set")
    defer { loop.shutdownAndWait() }
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (fires: Int, valid: Bool, modes: Int) in
        let fires = AtomicCounter()
        let keeper = InputSource(perform: { _ in })
        loop.add(keeper, to: modeA)
        let timer = LoopTimer(
          fireAt: .now.advanced(by: .milliseconds(-5)), repeatingEvery: repeating ? .zero : nil
        ) { timer in
          fires.increment()
          timer.invalidate()
          timer.setFireDate(.now.advanced(by: .milliseconds(-1)))
        }
        loop.add(timer, to: modeA)
        loop.add(timer, to: modeB)
        for _ in 0..<3 { loop.run(mode: modeA, until: .now) }
        for _ in 0..<2 { loop.run(mode: modeB, until: .now) }
        let outcome = (fires.current, timer.isValid, loop.core.modes(of: timer).count)
        keeper.invalidate()
        return outcome
      }
    }
    #expect(result?.fires == 1)
    #expect(result?.valid == false)
    #expect(result?.modes == 0)
  }

  /// setFireDate(past) then invalidate() in the callout: the same.
  @Test func setFireDateThenInvalidateInCallout() async throws {
    let loop = try RunLoopThread(name: "r5-set-invalidate")
    defer { loop.shutdownAndWait() }
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (fires: Int, valid: Bool) in
        let fires = AtomicCounter()
        let keeper = InputSource(perform: { _ in })
        loop.add(keeper, to: modeA)
        let timer = LoopTimer(fireAt: .now.advanced(by: .milliseconds(-5))) { timer in
          fires.increment()
          timer.setFireDate(.now.advanced(by: .milliseconds(-1)))
          timer.invalidate()
        }
        loop.add(timer, to: modeA)
        for _ in 0..<3 { loop.run(mode: modeA, until: .now) }
        keeper.invalidate()
        return (fires.current, timer.isValid)
      }
    }
    #expect(result?.fires == 1)
    #expect(result?.valid == false)
  }

  // MARK: Nested runs in the callout

  /// A one-shot timer in A and B sets a past date in its callout, then runs B nested (its B entry
  /// is due there: parked, not fired inside its own callout) and A nested. It fires once more on
  /// the next pass (the date set wins), then ends; never inside its own callout.
  @Test(arguments: [false, true])
  func oneShotSetsPastDateThenRunsNested(nestedInSameMode: Bool) async throws {
    let loop = try RunLoopThread(name: "r5-nested-past")
    defer { loop.shutdownAndWait() }
    let modeA = self.modeA
    let modeB = self.modeB
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (fires: Int, reentered: Int, valid: Bool, modes: Int) in
        let fires = AtomicCounter()
        let depth = AtomicCounter()
        let reentered = AtomicCounter()
        let keeper = InputSource(perform: { _ in })
        loop.add(keeper, to: modeA)
        loop.add(keeper, to: modeB)
        let timer = LoopTimer(fireAt: .now.advanced(by: .milliseconds(-5))) { timer in
          if depth.increment() > 1 { reentered.increment() }
          if fires.increment() == 1 {
            timer.setFireDate(.now.advanced(by: .milliseconds(-1)))
            for _ in 0..<2 { loop.run(mode: nestedInSameMode ? modeA : modeB, until: .now) }
          }
          depth.value.subtract(1, ordering: .sequentiallyConsistent)
        }
        loop.add(timer, to: modeA)
        loop.add(timer, to: modeB)
        for _ in 0..<3 { loop.run(mode: modeA, until: .now) }
        for _ in 0..<2 { loop.run(mode: modeB, until: .now) }
        let outcome = (fires.current, reentered.current, timer.isValid, loop.core.modes(of: timer).count)
        keeper.invalidate()
        timer.invalidate()
        return outcome
      }
    }
    #expect(result?.fires == 2)
    #expect(result?.reentered == 0)
    #expect(result?.valid == false)
    #expect(result?.modes == 0)
  }

  /// A repeating (1 h) timer in A and B whose callout, inside a nested run of B (where its entry
  /// is parked), removes it from A and adds it back: it fires once for its date, and both its
  /// entries then follow the next grid point (no second fire in A or B).
  @Test func repeatingRemovedAndReAddedInsideNestedRunFiresOncePerDate() async throws {
    let loop = try RunLoopThread(name: "r5-nested-readd")
    defer { loop.shutdownAndWait() }
    let modeA = self.modeA
    let modeB = self.modeB
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (fires: Int, future: Bool, modes: Int) in
        let fires = AtomicCounter()
        let keeper = InputSource(perform: { _ in })
        loop.add(keeper, to: modeA)
        loop.add(keeper, to: modeB)
        let start = LoopClock.Instant.now
        let timer = LoopTimer(fireAt: start.advanced(by: .milliseconds(-5)), repeatingEvery: .seconds(3600)) {
          timer in
          guard fires.increment() == 1 else { return }
          let inner = LoopTimer(fireAt: .now.advanced(by: .milliseconds(-1))) { _ in
            loop.remove(timer, from: modeA)
            loop.add(timer, to: modeA)
          }
          loop.add(inner, to: modeB)
          for _ in 0..<2 { loop.run(mode: modeB, until: .now) }
        }
        loop.add(timer, to: modeA)
        loop.add(timer, to: modeB)
        for _ in 0..<3 { loop.run(mode: modeA, until: .now) }
        for _ in 0..<3 { loop.run(mode: modeB, until: .now) }
        let outcome = (fires.current, timer.fireDate > start, loop.core.modes(of: timer).count)
        keeper.invalidate()
        timer.invalidate()
        return outcome
      }
    }
    #expect(result?.fires == 1)
    #expect(result?.future == true)
    #expect(result?.modes == 2)
  }

  /// A zero-interval repeating timer in A and B runs B nested in every callout: it fires once per
  /// outer pass, never inside its own callout, and keeps firing in both modes.
  @Test func zeroIntervalRunningOtherModeNestedFiresOncePerPass() async throws {
    let loop = try RunLoopThread(name: "r5-zero-nested")
    defer { loop.shutdownAndWait() }
    let modeA = self.modeA
    let modeB = self.modeB
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (inA: Int, inB: Int) in
        let fires = AtomicCounter()
        let keeper = InputSource(perform: { _ in })
        loop.add(keeper, to: modeA)
        loop.add(keeper, to: modeB)
        let timer = LoopTimer(fireAt: .now.advanced(by: .milliseconds(-5)), repeatingEvery: .zero) { _ in
          fires.increment()
          loop.run(mode: modeB, until: .now)
        }
        loop.add(timer, to: modeA)
        loop.add(timer, to: modeB)
        for _ in 0..<4 { loop.run(mode: modeA, until: .now) }
        let inA = fires.current
        for _ in 0..<3 { loop.run(mode: modeB, until: .now) }
        let inB = fires.current - inA
        keeper.invalidate()
        timer.invalidate()
        return (inA, inB)
      }
    }
    #expect(result?.inA == 4)
    #expect(result?.inB == 3)
  }

  /// A timer in A whose callout adds it to C and runs C nested: its new C entry is due there
  /// (parked, never fired inside its own callout); afterwards a one-shot timer ends and a
  /// repeating (1 h) one moves both entries to its next grid point: no second fire in A or C.
  @Test(arguments: [false, true])
  func timerAddingItselfToNewModeAndRunningItNestedFiresOnce(repeating: Bool) async throws {
    let loop = try RunLoopThread(name: "r5-add-run-nested")
    defer { loop.shutdownAndWait() }
    let modeA = self.modeA
    let modeC = self.modeC
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (fires: Int, valid: Bool, modes: Int) in
        let fires = AtomicCounter()
        let keeper = InputSource(perform: { _ in })
        loop.add(keeper, to: modeA)
        loop.add(keeper, to: modeC)
        let timer = LoopTimer(
          fireAt: .now.advanced(by: .milliseconds(-5)), repeatingEvery: repeating ? .seconds(3600) : nil
        ) { timer in
          fires.increment()
          loop.add(timer, to: modeC)
          for _ in 0..<2 { loop.run(mode: modeC, until: .now) }
        }
        loop.add(timer, to: modeA)
        for _ in 0..<3 { loop.run(mode: modeA, until: .now) }
        for _ in 0..<3 { loop.run(mode: modeC, until: .now) }
        let outcome = (fires.current, timer.isValid, loop.core.modes(of: timer).count)
        keeper.invalidate()
        timer.invalidate()
        return outcome
      }
    }
    #expect(result?.fires == 1)
    #expect(result?.valid == repeating)
    #expect(result?.modes == (repeating ? 2 : 0))
  }

  /// A repeating timer in A and B runs B nested (its B entry is parked there), and another timer
  /// of B invalidates it inside that nested run: it is detached, never fires again, and both modes
  /// finish.
  @Test func repeatingInvalidatedInsideNestedRunWhereParkedIsDetached() async throws {
    let loop = try RunLoopThread(name: "r5-nested-invalidate")
    defer { loop.shutdownAndWait() }
    let modeA = self.modeA
    let modeB = self.modeB
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (fires: Int, modes: Int, runA: RunLoopRunResult, runB: RunLoopRunResult) in
        let fires = AtomicCounter()
        let timer = LoopTimer(fireAt: .now.advanced(by: .milliseconds(-5)), repeatingEvery: .zero) { timer in
          fires.increment()
          let killer = LoopTimer(fireAt: .now.advanced(by: .milliseconds(-1))) { _ in timer.invalidate() }
          loop.add(killer, to: modeB)
          for _ in 0..<2 { loop.run(mode: modeB, until: .now) }
        }
        loop.add(timer, to: modeA)
        loop.add(timer, to: modeB)
        loop.run(mode: modeA, until: .now)
        let runA = loop.run(mode: modeA, until: .now.advanced(by: .milliseconds(50)))
        let runB = loop.run(mode: modeB, until: .now.advanced(by: .milliseconds(50)))
        return (fires.current, loop.core.modes(of: timer).count, runA, runB)
      }
    }
    #expect(result?.fires == 1)
    #expect(result?.modes == 0)
    #expect(result?.runA == .finished)
    #expect(result?.runB == .finished)
  }

  // MARK: .common

  /// A repeating (1 h) timer in `.common` whose callout adds a mode to the common set: it fires
  /// once for its date and its new entry follows the next grid point (no fire in the new mode).
  @Test func repeatingCommonTimerAddingCommonModeFiresOncePerDate() async throws {
    let loop = try RunLoopThread(name: "r5-common-repeat")
    defer { loop.shutdownAndWait() }
    let modeC = self.modeC
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (fires: Int, future: Bool) in
        let fires = AtomicCounter()
        let keeper = InputSource(perform: { _ in })
        loop.add(keeper, to: .default)
        loop.add(keeper, to: modeC)
        let start = LoopClock.Instant.now
        let timer = LoopTimer(fireAt: start.advanced(by: .milliseconds(-5)), repeatingEvery: .seconds(3600)) { _ in
          fires.increment()
          loop.addModeToCommonModes(modeC)
        }
        loop.add(timer, to: .common)
        for _ in 0..<3 { loop.run(mode: .default, until: .now) }
        for _ in 0..<3 { loop.run(mode: modeC, until: .now) }
        let outcome = (fires.current, timer.fireDate > start)
        keeper.invalidate()
        timer.invalidate()
        return outcome
      }
    }
    #expect(result?.fires == 1)
    #expect(result?.future == true)
  }

  // MARK: Removal from its only mode in the callout

  /// "A one-shot timer invalidates itself after firing", also one that removes itself from its
  /// only mode in its callout: added again, it does not fire a second time for the same date.
  /// (Before the fix the pass returned early for the detached record and left it valid.)
  @Test
  func oneShotRemovingItselfFromItsOnlyModeIsInvalidated() async throws {
    let loop = try RunLoopThread(name: "r5-oneshot-self-remove")
    defer { loop.shutdownAndWait() }
    let modeA = self.modeA
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (fires: Int, valid: Bool) in
        let fires = AtomicCounter()
        let keeper = InputSource(perform: { _ in })
        loop.add(keeper, to: modeA)
        let timer = LoopTimer(fireAt: .now.advanced(by: .milliseconds(-5))) { timer in
          fires.increment()
          loop.remove(timer, from: modeA)
        }
        loop.add(timer, to: modeA)
        loop.run(mode: modeA, until: .now)
        let valid = timer.isValid
        loop.add(timer, to: modeA)  // a no-op for an invalidated timer
        for _ in 0..<2 { loop.run(mode: modeA, until: .now) }
        keeper.invalidate()
        timer.invalidate()
        return (fires.current, valid)
      }
    }
    #expect(result?.valid == false, "a one-shot timer that fired is still valid")
    #expect(result?.fires == 1, "a one-shot timer fired twice for one date")
  }

  /// SPEC §4, once per grid point: a repeating (1 h) timer whose callout removes it from its only
  /// mode and adds it back (a new record) is advanced, and its new record follows the new date.
  /// (Before the fix it was never advanced and fired on every pass: 3 fires in 3 passes.)
  @Test
  func repeatingReAddedToItsOnlyModeInCalloutFiresOncePerDate() async throws {
    let loop = try RunLoopThread(name: "r5-repeat-readd")
    defer { loop.shutdownAndWait() }
    let modeA = self.modeA
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (fires: Int, advanced: Bool) in
        let fires = AtomicCounter()
        let keeper = InputSource(perform: { _ in })
        loop.add(keeper, to: modeA)
        let start = LoopClock.Instant.now
        let timer = LoopTimer(fireAt: start.advanced(by: .milliseconds(-5)), repeatingEvery: .seconds(3600)) {
          timer in
          fires.increment()
          loop.remove(timer, from: modeA)
          loop.add(timer, to: modeA)
        }
        loop.add(timer, to: modeA)
        for _ in 0..<3 { loop.run(mode: modeA, until: .now) }
        let advanced = timer.fireDate > start
        keeper.invalidate()
        timer.invalidate()
        return (fires.current, advanced)
      }
    }
    #expect(result?.fires == 1, "one grid point fired more than once")
    #expect(result?.advanced == true)
  }

  // MARK: Another thread between the pop and the callout

  /// Two due timers on loop A; the first one's callout has another thread move the second, a
  /// one-shot timer, to loop B (remove from A, add to B) before A reaches it. A pops the second's
  /// stale entry: its callout does not run there, and A leaves the timer alone: it fires on B.
  /// (Before the fix A invalidated it, and it never fired on B.)
  @Test
  func oneShotMovedToAnotherLoopBeforeItsFireFiresThere() async throws {
    let loopA = try RunLoopThread(name: "r5-move-a")
    defer { loopA.shutdownAndWait() }
    let loopB = try RunLoopThread(name: "r5-move-b")
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
    let loopA = try RunLoopThread(name: "r5-move-sa")
    defer { loopA.shutdownAndWait() }
    let loopB = try RunLoopThread(name: "r5-move-sb")
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
    let loopA = try RunLoopThread(name: "r5-move-ra")
    defer { loopA.shutdownAndWait() }
    let loopB = try RunLoopThread(name: "r5-move-rb")
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
    let loop = try RunLoopThread(name: "r5-set-before")
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
    let loop = try RunLoopThread(name: "r5-set-before-1")
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
    let loop = try RunLoopThread(name: "r5-invalidate-before")
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

  // MARK: Races with the callout

  /// `setFireDate(past)` on a one-shot timer from another thread at a random moment around its
  /// fire: it fires once or twice (once more when the call lands during the callout), never
  /// more, and ends invalid.
  @Test func oneShotSetFireDateRacingTheCalloutFiresAtMostTwice() async throws {
    let loop = try RunLoopThread(name: "r5-race-set")
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

  /// `invalidateAndWait()` from another thread while a zero-interval timer fires on every pass:
  /// once it returns, no callout runs any more.
  @Test func invalidateAndWaitRacingZeroIntervalTimerEndsItsCallouts() async throws {
    let loop = try RunLoopThread(name: "r5-race-invalidate")
    defer { loop.shutdownAndWait() }
    let bad = try await withWatchdogOnThread { () -> Int in
      var bad = 0
      repeatRounds(30, budget: .milliseconds(400)) { round in
        let started = AtomicCounter()
        let timer = LoopTimer(fireAt: .now, repeatingEvery: .zero) { timer in
          started.increment()
          if round % 2 == 0 { timer.setFireDate(.now) }
        }
        loop.add(timer)
        waitUntil { started.current >= 2 + round % 3 }
        try? timer.invalidateAndWait()
        let seen = started.current
        _ = try? loop.performAndWait { loop.run(mode: .default, until: .now) }
        usleep(1000)
        if started.current != seen { bad += 1 }
      }
      return bad
    }
    #expect(bad == 0)
  }
}
