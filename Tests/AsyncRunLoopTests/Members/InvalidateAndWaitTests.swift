import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

/// invalidateAndWait returns only once no callout of the member runs, and is refused where it would deadlock.
@Suite(
  "invalidateAndWait returns only once no callout of the member runs, and is refused where it would deadlock",
  .serialized, .timeLimit(.minutes(10)))
struct InvalidateAndWaitTests: SharedTestLoops {
  /// `invalidateAndWait()`: "after this returns, no callout of the timer runs anywhere".
  @Test func invalidateAndWaitNeverReturnsWhileACalloutRuns() async throws {
    let loop = try RunLoopThread(name: "review-invwait")
    defer { loop.shutdownAndWait() }
    let violations = AtomicCounter()
    let rounds = try await withWatchdogOnThread(timeout: .seconds(60)) {
      repeatRounds(200_000, budget: .seconds(2)) { round in
        let returned = AtomicCounter()
        let fired = AtomicCounter()
        let timer = LoopTimer(fireAt: .now, repeatingEvery: .zero) { _ in
          fired.increment()
          // A short busy callout: long enough to still run when the waiter returns.
          let end = LoopClock.monotonicNanoseconds() + 5_000
          while LoopClock.monotonicNanoseconds() < end {}
          if returned.current != 0 { violations.increment() }
        }
        loop.add(timer)
        while fired.current == 0 { sched_yield() }
        for _ in 0..<(round % 13) { _ = LoopClock.monotonicNanoseconds() }
        try? timer.invalidateAndWait()
        returned.increment()
      }
    }
    // Let a callout that outlived the wait finish and report.
    _ = try loop.performAndWait { 0 }
    #expect((rounds ?? 0) > 0)
    #expect(violations.current == 0, "invalidateAndWait() returned while a callout was running")
  }

  /// A repeating timer whose callout moves it to the other of two loops at every fire, while
  /// another thread calls `invalidateAndWait()`: callouts never overlap, and after the call
  /// returns no callout runs anywhere (none is in progress, and the count stays put over further
  /// passes of both loops).
  @Test func invalidateAndWaitOnAPingPongTimerLeavesNoCalloutRunning() async throws {
    let failures = try await failuresOverRounds(
      60 * stressFactor, budget: .milliseconds(1500), timeout: .seconds(30), "ping-pong timer"
    ) { round, failures in
      guard let ping = try? RunLoopThread(name: "tping"), let pong = try? RunLoopThread(name: "tpong") else {
        return
      }
      let inCallout = AtomicCounter()
      let overlaps = AtomicCounter()
      let fired = AtomicCounter()
      let timer = LoopTimer(after: .zero, repeatingEvery: .microseconds(200)) { timer in
        if inCallout.value.add(1, ordering: .sequentiallyConsistent).newValue > 1 { overlaps.increment() }
        fired.increment()
        let (here, there) = ping.isOnLoopThread ? (ping, pong) : (pong, ping)
        here.remove(timer)
        there.add(timer)
        usleep(50)
        inCallout.value.subtract(1, ordering: .sequentiallyConsistent)
      }
      ping.add(timer)
      waitUntil(timeout: .seconds(5)) { fired.current >= 1 + round % 5 }
      var outcome = "ok"
      do { try timer.invalidateAndWait() } catch { outcome = "\(error)" }
      let runningAfter = inCallout.current
      let firedAfter = fired.current
      for _ in 0..<3 {
        _ = try? ping.performAndWait {}
        _ = try? pong.performAndWait {}
      }
      ping.shutdownAndWait()
      pong.shutdownAndWait()
      if outcome != "ok" || runningAfter != 0 || fired.current != firedAfter || overlaps.current != 0 {
        failures.append(
          "round \(round): \(outcome), running after \(runningAfter), fired \(firedAfter) then \(fired.current), "
            + "overlaps \(overlaps.current)")
      }
    }
    #expect(failures == [], "\(failures?.prefix(5) ?? [])")
  }

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
      let mode = RunLoopMode("tm")
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
      let idle = RunLoopMode("idle")  // never run: keeps the timer on the loop
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

  /// Promise (Members: one lifecycle): a member is on one loop at a time; once removed from its
  /// last mode it may be added to any loop at once, from any thread. Timers and observers moved
  /// between two loops by two threads at once (each thread moves only after its own removal) end
  /// on exactly one loop: after invalidation, neither loop runs them again.
  @Test func timersAndObserversMovedBetweenLoopsEndSilent() async throws {
    let result = try await withWatchdogOnThread(timeout: .seconds(40), "timers and observers between loops") {
      () throws -> Int in
      let loopA = try RunLoopThread(name: "tA")
      let loopB = try RunLoopThread(name: "tB")
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
      loopA.add(timers[0], to: RunLoopMode("iw"))
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

  /// `invalidateAndWait()` from another thread while a zero-interval timer fires on every pass:
  /// once it returns, no callout runs any more.
  @Test func invalidateAndWaitRacingZeroIntervalTimerEndsItsCallouts() async throws {
    let loop = try RunLoopThread(name: "race-invalidate")
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

  /// `invalidate()` from another thread while the handler runs returns at once, and the handler
  /// is never called again although the descriptor stays readable.
  @Test func invalidatingFromAnotherThreadDuringTheHandlerEndsDeliveries() async throws {
    let loop = try RunLoopThread(name: "fd-inval")
    let pipe = makePipe()
    defer {
      close(pipe.read)
      close(pipe.write)
    }
    let calls = Locked(0)
    let inHandler = TestGate()
    let release = TestGate()
    let source = DescriptorSource(descriptor: pipe.read) { _, _ in
      if calls.withLock({
        $0 += 1; return $0
      }) == 1 {
        inHandler.open()
        _ = release.wait(timeout: .seconds(20))
      }
    }
    try loop.add(source)
    writeByte(pipe.write)
    let invalidated = await execOnNewThread { () -> Bool in
      guard inHandler.wait(timeout: .seconds(20)) else { return false }
      source.invalidate()  // never blocks
      release.open()
      // A later pass (the descriptor is still readable) must not call the handler.
      let passed = TestGate()
      loop.perform { passed.open() }
      return passed.wait(timeout: .seconds(20))
    }
    #expect(invalidated)
    #expect(calls.withLock { $0 } == 1)
    #expect(!source.isValid)
    await execShutdown(loop)
  }

  /// A timer's callout on loop A waits (`performAndWait`) for loop B, whose block then calls
  /// `invalidateAndWait()` on that timer: the documented answer is `wouldDeadlock` ("from a
  /// loop thread whose callout the timer's callout is itself waiting for, directly or through
  /// other loops"), not a hang. (If it hangs, both loop threads stay blocked for good.)
  @Test func invalidateAndWaitAgainstACalloutWaitingWithPerformAndWaitIsRefused() async throws {
    let loopA = try RunLoopThread(name: "cycle-a")
    let loopB = try RunLoopThread(name: "cycle-b")
    let outcome = Guarded<String?>(nil)
    let timerBox = Guarded<LoopTimer?>(nil)
    let timer = LoopTimer(after: .zero) { _ in
      let result = Result {
        try loopB.performAndWait { () -> String in
          guard let timer = timerBox.snapshot else { return "no timer" }
          do {
            try timer.invalidateAndWait()
            return "waited"
          } catch {
            return "\(error)"
          }
        }
      }
      outcome.withLock { $0 = (try? result.get()) ?? "performAndWait threw" }
    }
    timerBox.withLock { $0 = timer }
    loopA.add(timer)
    let finished = await execOnNewThread {
      waitUntil(timeout: .seconds(5), "the cross-loop wait to end") { outcome.snapshot != nil }
    }
    #expect(finished)
    #expect(outcome.snapshot?.contains("would wait") == true, "outcome: \(String(describing: outcome.snapshot))")
    if finished {
      await execShutdown(loopA)
      await execShutdown(loopB)
    }
  }
}
