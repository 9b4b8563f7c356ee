import Glibc
import Testing

@testable import AsyncRunLoop

/// A timer's pass honours what its own callout changed: fire date, modes, invalidation.
@Suite(
  "A timer's pass honours what its own callout changed: fire date, modes, invalidation", .serialized,
  .timeLimit(.minutes(10)))
struct TimerCalloutChangesTests: TimerCalloutModes {
  /// A one-shot observer and a one-shot timer each move themselves to a second loop from their
  /// first callout: "a one-shot observer is told exactly once"; a one-shot timer fires once and
  /// is invalidated (the loop it moved to drops it). Over many rounds neither is called twice.
  @Test func oneShotMembersMovingThemselvesInTheirCalloutAreCalledOnce() async throws {
    let failures = try await failuresOverRounds(
      60 * stressFactor, budget: .milliseconds(1500), timeout: .seconds(30), "one-shot moves"
    ) { round, failures in
      guard let first = try? RunLoopThread(name: "os1"), let second = try? RunLoopThread(name: "os2") else {
        return
      }
      let observed = AtomicCounter()
      let fired = AtomicCounter()
      let observer = LoopObserver(activities: .all, repeats: false) { observer, _ in
        observed.increment()
        first.remove(observer)
        second.add(observer)
      }
      let timer = LoopTimer(after: .zero) { timer in
        fired.increment()
        first.remove(timer)
        second.add(timer)
      }
      first.add(observer)
      first.add(timer)
      waitUntil(timeout: .seconds(5)) { observed.current >= 1 && fired.current >= 1 }
      // Both loops make passes meanwhile.
      for _ in 0..<3 {
        _ = try? first.performAndWait {}
        _ = try? second.performAndWait {}
      }
      first.shutdownAndWait()
      second.shutdownAndWait()
      if observed.current != 1 || fired.current != 1 || observer.isValid || timer.isValid {
        failures.append(
          "round \(round): observed \(observed.current), fired \(fired.current), "
            + "observer valid \(observer.isValid), timer valid \(timer.isValid)")
      }
    }
    #expect(failures == [], "\(failures?.prefix(5) ?? [])")
  }

  /// LoopTimer: "a one-shot timer invalidates itself after firing". A one-shot timer in modes A
  /// and B fires in A; its callout removes it from B only (it stays in A). Before the fix the pass
  /// took that for a move and neither invalidated it nor put its A entry (popped) back: the timer
  /// stayed valid, never fired again, and kept mode A alive.
  @Test
  func oneShotTimerRemovedFromOtherModeInCalloutIsInvalidated() async throws {
    let loop = try RunLoopThread(name: "oneshot-remove")
    defer { loop.shutdownAndWait() }
    let modeA = RunLoopMode("a")
    let modeB = RunLoopMode("b")
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (fires: Int, valid: Bool, run: RunLoopRunResult, inA: Bool) in
        let fires = AtomicCounter()
        let timer = LoopTimer(fireAt: .now.advanced(by: .milliseconds(-5))) { timer in
          fires.increment()
          loop.remove(timer, from: modeB)
        }
        loop.add(timer, to: modeA)
        loop.add(timer, to: modeB)
        loop.run(mode: modeA, until: .now)  // one pass: fires
        let valid = timer.isValid
        let inA = loop.core.modes(of: timer).contains(modeA)
        // Nothing else is in A: once the one-shot timer is done, the run finishes at once.
        let run = loop.run(mode: modeA, until: .now.advanced(by: .milliseconds(30)))
        timer.invalidate()
        return (fires.current, valid, run, inA)
      }
    }
    #expect(result?.fires == 1)
    #expect(result?.valid == false, "a one-shot timer that fired stayed valid")
    #expect(result?.inA == false, "the fired one-shot timer is still in mode A")
    #expect(result?.run == .finished, "mode A kept alive by a one-shot timer that already fired")
  }

  /// The same cause for a repeating timer (zero interval: once per pass): removed from mode B in
  /// its first callout, it never fires again in mode A, where it still is.
  @Test
  func repeatingTimerRemovedFromOtherModeInCalloutKeepsFiring() async throws {
    let loop = try RunLoopThread(name: "repeat-remove")
    defer { loop.shutdownAndWait() }
    let modeA = RunLoopMode("a")
    let modeB = RunLoopMode("b")
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> Int in
        let fires = AtomicCounter()
        let timer = LoopTimer(fireAt: .now.advanced(by: .milliseconds(-5)), repeatingEvery: .zero) { timer in
          if fires.increment() == 1 { loop.remove(timer, from: modeB) }
        }
        let keeper = InputSource(perform: { _ in })
        loop.add(keeper, to: modeA)
        loop.add(timer, to: modeA)
        loop.add(timer, to: modeB)
        for _ in 0..<4 { loop.run(mode: modeA, until: .now) }
        timer.invalidate()
        keeper.invalidate()
        return fires.current
      }
    }
    #expect(result == 4, "a repeating timer still in mode A stopped firing there")
  }

  /// SPEC §4: a repeating timer "fires once and moves to the next future multiple of its
  /// interval". A repeating (1 h) timer that adds itself to a new mode in its callout must be
  /// advanced, not put back at the date that just fired (before the fix it fired again on the
  /// next pass for the same grid point).
  @Test
  func repeatingTimerAddedToNewModeInCalloutFiresOncePerDate() async throws {
    let loop = try RunLoopThread(name: "repeat-add")
    defer { loop.shutdownAndWait() }
    let modeA = RunLoopMode("a")
    let modeC = RunLoopMode("c")
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (fires: Int, advanced: Bool) in
        let fires = AtomicCounter()
        let start = LoopClock.Instant.now
        let timer = LoopTimer(fireAt: start.advanced(by: .milliseconds(-5)), repeatingEvery: .seconds(3600)) { timer in
          fires.increment()
          loop.add(timer, to: modeC)  // a no-op after the first time
        }
        let keeper = InputSource(perform: { _ in })
        loop.add(keeper, to: modeA)
        loop.add(timer, to: modeA)
        for _ in 0..<3 { loop.run(mode: modeA, until: .now) }
        let advanced = timer.fireDate > start
        timer.invalidate()
        keeper.invalidate()
        return (fires.current, advanced)
      }
    }
    #expect(result?.fires == 1, "one grid point fired more than once")
    #expect(result?.advanced == true)
  }

  /// The same with the mode joining through `.common`: a one-shot timer in `.common` whose
  /// callout adds a mode to the common set (the timer joins it) fires twice.
  @Test
  func oneShotCommonTimerAddingCommonModeFiresOnce() async throws {
    let loop = try RunLoopThread(name: "common-add")
    defer { loop.shutdownAndWait() }
    let modeX = RunLoopMode("common-x")
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (fires: Int, valid: Bool) in
        let fires = AtomicCounter()
        let timer = LoopTimer(fireAt: .now.advanced(by: .milliseconds(-5))) { _ in
          fires.increment()
          loop.addModeToCommonModes(modeX)
        }
        let keeper = InputSource(perform: { _ in })
        loop.add(keeper, to: .default)
        loop.add(timer, to: .common)
        for _ in 0..<3 { loop.run(mode: .default, until: .now) }
        let valid = timer.isValid
        timer.invalidate()
        keeper.invalidate()
        return (fires.current, valid)
      }
    }
    #expect(result?.fires == 1, "a one-shot timer fired twice")
    #expect(result?.valid == false)
  }

  /// A one-shot timer in A and B whose callout runs B nested (parking its B entry) fires once,
  /// is invalidated, and the nested run neither fires it nor spins.
  @Test
  func parkedOneShotTimerFiresOnceAndLeaves() async throws {
    let loop = try RunLoopThread(name: "park")
    defer { loop.shutdownAndWait() }
    let modeA = RunLoopMode("a")
    let modeB = RunLoopMode("b")
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (fires: Int, passes: Int, valid: Bool, modes: Int) in
        let fires = AtomicCounter()
        let passes = AtomicCounter()
        let observer = LoopObserver(activities: .beforeTimers) { _, _ in passes.increment() }
        loop.add(observer, to: modeB)
        let timer = LoopTimer(fireAt: .now.advanced(by: .milliseconds(-5))) { _ in
          fires.increment()
          loop.run(mode: modeB, until: .now.advanced(by: .milliseconds(20)))
        }
        loop.add(timer, to: modeA)
        loop.add(timer, to: modeB)
        loop.run(mode: modeA, until: .now)
        let valid = timer.isValid
        let modes = loop.core.modeCount(of: timer)
        observer.invalidate()
        timer.invalidate()
        return (fires.current, passes.current, valid, modes)
      }
    }
    #expect(result?.fires == 1)
    #expect((result?.passes ?? 99) < 10, "the nested run spun on the parked timer")
    #expect(result?.valid == false)
    #expect(result?.modes == 0)
  }

  /// A repeating timer parked by a nested run, rescheduled from another thread during the
  /// callout (applied by the nested run), then invalidated in the same callout: no crash, no fire
  /// inside its own callout, its handler released.
  @Test
  func parkedTimerRescheduledFromAnotherThreadThenInvalidated() async throws {
    let loop = try RunLoopThread(name: "park-resched")
    defer { loop.shutdownAndWait() }
    let modeA = RunLoopMode("a")
    let modeB = RunLoopMode("b")
    let result = try await withWatchdogOnThread {
      var weakCapture: [() -> Bool] = []
      var totals = 0
      var rounds = 0
      rounds = repeatRounds(200, budget: .milliseconds(400)) { round in
        let fires = AtomicCounter()
        let capture = Capture()
        weak let weakRef = capture
        let timer = LoopTimer(fireAt: .now.advanced(by: .milliseconds(-5)), repeatingEvery: .seconds(3600)) {
          timer in
          withExtendedLifetime(capture) {}
          fires.increment()
          let other = startThread { timer.setFireDate(.now.advanced(by: .milliseconds(-1))) }
          joinThread(other)
          loop.run(mode: modeB, until: .now)  // applies the reschedule, parks the B entry
          if round % 2 == 0 { timer.invalidate() } else { loop.remove(timer, from: modeB) }
          loop.run(mode: modeA, until: .now)
        }
        try? loop.performAndWait {
          loop.add(timer, to: modeA)
          loop.add(timer, to: modeB)
          loop.run(mode: modeA, until: .now)
          timer.invalidate()
        }
        totals += fires.current
        weakCapture.append { weakRef == nil }
      }
      try loop.performAndWait {}
      return (totals, rounds, weakCapture.allSatisfy { $0() })
    }
    #expect(result?.0 == result?.1, "a timer fired inside its own callout, or not once")
    #expect(result?.2 == true, "a handler was never released")
  }

  /// A date in the past set in a one-shot timer's callout wins: it fires once more (on the next
  /// pass, never inside its own callout), then ends.
  @Test func oneShotSetToPastInCalloutFiresExactlyTwice() async throws {
    let loop = try RunLoopThread(name: "oneshot-past")
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
    let loop = try RunLoopThread(name: "oneshot-future")
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
    let loop = try RunLoopThread(name: "repeat-now")
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
    let loop = try RunLoopThread(name: "repeat-future")
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

  /// invalidate() then setFireDate(past) in the callout: invalid, never fires again.
  @Test(arguments: [false, true])
  func invalidateThenSetFireDateInCallout(repeating: Bool) async throws {
    let loop = try RunLoopThread(name: "invalidate-set")
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
    let loop = try RunLoopThread(name: "set-invalidate")
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

  /// A one-shot timer in A and B sets a past date in its callout, then runs B nested (its B entry
  /// is due there: parked, not fired inside its own callout) and A nested. It fires once more on
  /// the next pass (the date set wins), then ends; never inside its own callout.
  @Test(arguments: [false, true])
  func oneShotSetsPastDateThenRunsNested(nestedInSameMode: Bool) async throws {
    let loop = try RunLoopThread(name: "nested-past")
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
    let loop = try RunLoopThread(name: "nested-readd")
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
    let loop = try RunLoopThread(name: "zero-nested")
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
    let loop = try RunLoopThread(name: "add-run-nested")
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
    let loop = try RunLoopThread(name: "nested-invalidate")
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

  /// A repeating (1 h) timer in `.common` whose callout adds a mode to the common set: it fires
  /// once for its date and its new entry follows the next grid point (no fire in the new mode).
  @Test func repeatingCommonTimerAddingCommonModeFiresOncePerDate() async throws {
    let loop = try RunLoopThread(name: "common-repeat")
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

  /// "A one-shot timer invalidates itself after firing", also one that removes itself from its
  /// only mode in its callout: added again, it does not fire a second time for the same date.
  /// (Before the fix the pass returned early for the detached record and left it valid.)
  @Test
  func oneShotRemovingItselfFromItsOnlyModeIsInvalidated() async throws {
    let loop = try RunLoopThread(name: "oneshot-self-remove")
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
    let loop = try RunLoopThread(name: "repeat-readd")
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
}
