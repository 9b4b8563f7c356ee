import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("A timer whose callout is busy is deferred, not lost", .serialized, .timeLimit(.minutes(10)))
struct BusyTimerDeferralTests {
  /// A repeating timer (one hour) due now fires on loop A; its callout moves it to loop B (both
  /// loops on one CPU, so waking B lets B run at once). Its grid point fired once: promised, it
  /// moves to the next point of its grid, an hour later, and does not fire again for this one.
  /// Between the callout's return (which clears "a callout is running" and re-times B's deferred
  /// entry) and `afterFire` (which advances the date) B can find the old date still due.
  @Test
  func aRepeatingTimerMovedToAnotherLoopInItsCalloutFiresOnceForItsDate() async throws {
    let doubled = try await Self.moveInCallout(repeating: true)
    #expect(doubled == [], "the timer fired again for the date it had just fired for")
  }

  /// The same with a one-shot timer: "a one-shot timer is done" after its fire (invalidated), yet
  /// B runs its handler a second time.
  @Test
  func aOneShotTimerMovedToAnotherLoopInItsCalloutFiresOnce() async throws {
    let doubled = try await Self.moveInCallout(repeating: false)
    #expect(doubled == [], "the one-shot timer fired twice")
  }

  /// A one-shot timer whose callout removes it from its only mode and adds it to the same loop
  /// again (a new record there): after its fire it is invalidated and that new record is detached
  /// too (nothing of it stays in a mode, it never fires again, its handler is released).
  @Test func aOneShotTimerReAddedToItsLoopInItsCalloutIsDoneAfterItsFire() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "one-shot re-added") {
      () -> (fires: Int, valid: Bool, modes: Int, released: Bool) in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      let fires = AtomicCounter()
      weak var weakToken: WeaklyObservedObject?
      let timer: LoopTimer
      do {
        let token = WeaklyObservedObject()
        weakToken = token
        timer = LoopTimer(fireAt: .now) { timer in
          withExtendedLifetime(token) {}
          fires.increment()
          RunLoopThread.current.remove(timer, from: barrierModeA)  // its only mode: unbound
          RunLoopThread.current.add(timer, to: barrierModeA)  // a new record on the same loop
        }
      }
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: barrierModeA)
      loop.add(timer, to: barrierModeA)
      _ = loop.run(mode: barrierModeA, until: .now.advanced(by: .milliseconds(50)))
      // Records still on the loop besides `keep` (the binding of an invalidated timer names none).
      let outcome = (fires.current, timer.isValid, loop.core.modeTable.allRecords.count - 1, weakToken == nil)
      keep.invalidate()
      return outcome
    }
    #expect(outcome?.fires == 1)
    #expect(outcome?.valid == false)
    #expect(outcome?.modes == 0, "the new record stayed in the mode")
    #expect(outcome?.released == true)
  }

  /// Rounds of: a timer due now fires on A, its callout moves it to B (and, every other round,
  /// lets B make passes first, so B defers it as busy). Returns the rounds where it fired more
  /// than once.
  private static func moveInCallout(repeating: Bool) async throws -> [String]? {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "moved timer, one date") {
      () throws -> (rounds: Int, doubled: [String]) in
      var doubled: [String] = []
      let rounds = try repeatRounds(30, budget: .milliseconds(1500)) { round in
        let loopA = try RunLoopThread(name: "move-a", cpu: 0)
        let loopB = try RunLoopThread(name: "move-b", cpu: 0)
        defer {
          loopA.shutdownAndWait()
          loopB.shutdownAndWait()
        }
        let fires = Locked<[String]>([])
        let calloutDone = TestGate()
        let timer = LoopTimer(fireAt: .now, repeatingEvery: repeating ? .seconds(3600) : nil) { timer in
          let count = fires.withLock {
            $0.append(RunLoopThread.current.name)
            return $0.count
          }
          guard count == 1 else { return }
          loopA.remove(timer)  // its only mode here: unbound
          loopB.add(timer)  // due there at once: B finds its callout running (busy)
          if round % 2 == 0 {
            for _ in 0..<2 { _ = try? loopB.performAndWait {} }  // B made passes meanwhile
          }
          calloutDone.open()
        }
        loopA.add(timer)
        _ = calloutDone.wait(timeout: .seconds(10))
        for _ in 0..<3 {  // both loops settle: several passes each
          _ = try? loopA.performAndWait {}
          _ = try? loopB.performAndWait {}
          usleep(1_000)
        }
        let fired = fires.withLock { $0 }
        if fired.count != 1 { doubled.append("round \(round): fired on \(fired)") }
        timer.invalidate()
      }
      return (rounds, doubled)
    }
    print("moved timer (repeating: \(repeating)): \(outcome?.rounds ?? 0) rounds, \(outcome?.doubled ?? [])")
    return outcome?.doubled
  }
}

extension BusyTimerDeferralTests {
  /// The callout moves the timer to B (where it is due: B defers it as busy) and then waits while
  /// a third thread calls `invalidateAndWait()`. That call returns only after the callout
  /// returned, and from then on no callout runs anywhere: not on A, not on B's deferred entry.
  @Test func invalidateAndWaitFromAThirdThreadWhileTheCalloutRunsEndsEveryFire() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "invalidateAndWait, moved") {
      () throws -> (rounds: Int, wrong: [String]) in
      var wrong: [String] = []
      let rounds = try repeatRounds(20, budget: .milliseconds(800)) { round in
        let loopA = try RunLoopThread(name: "iaw-a")
        let loopB = try RunLoopThread(name: "iaw-b")
        defer {
          loopA.shutdownAndWait()
          loopB.shutdownAndWait()
        }
        let fires = AtomicCounter()
        let inCallout = Locked(false)
        let moved = TestGate()
        let timer = LoopTimer(fireAt: .now, repeatingEvery: .milliseconds(1)) { timer in
          inCallout.withLock { $0 = true }
          defer { inCallout.withLock { $0 = false } }
          guard fires.increment() == 1 else { return }
          loopA.remove(timer)
          loopB.add(timer)
          timer.setFireDate(.now)
          _ = try? loopB.performAndWait {}
          moved.open()
          // invalidateAndWait invalidates and starts waiting in one critical section.
          let deadline = ContinuousClock.now.advanced(by: .seconds(10))
          while timer.isValid && ContinuousClock.now < deadline { usleep(200) }
          usleep(2_000)  // still inside when the waiter is released would be the bug
        }
        loopA.add(timer)
        _ = moved.wait(timeout: .seconds(10))
        let early = Locked(false)
        let waiter = startThread {
          try? timer.invalidateAndWait()
          if inCallout.withLock({ $0 }) { early.withLock { $0 = true } }
        }
        joinThread(waiter)
        if early.withLock({ $0 }) { wrong.append("round \(round): returned while the callout ran") }
        let firesAtReturn = fires.current
        for _ in 0..<3 {
          _ = try? loopA.performAndWait {}
          _ = try? loopB.performAndWait {}
          usleep(2_000)
        }
        if fires.current != firesAtReturn || firesAtReturn != 1 {
          wrong.append("round \(round): \(firesAtReturn) fires at return, \(fires.current) later")
        }
      }
      return (rounds, wrong)
    }
    #expect(outcome?.wrong == [])
  }

  /// A repeating 2 ms timer moves between two loops in every callout (A to B, B to A), with
  /// nested runs on the way; an observer counts passes. Promised: callouts never overlap, none
  /// runs after `invalidateAndWait()` returns, the timer keeps firing (no fire lost forever:
  /// each due date fires once its callout returns) and no loop spins while the timer waits.
  @Test func aTimerBouncingBetweenLoopsKeepsFiringWithoutOverlapOrSpin() async throws {
    let loopA = try RunLoopThread(name: "bounce-a")
    let loopB = try RunLoopThread(name: "bounce-b")
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "bouncing timer") {
      () -> (fires: Int, overlapped: Bool, passes: Int, after: Int) in
      defer {
        loopA.shutdownAndWait()
        loopB.shutdownAndWait()
      }
      let passes = AtomicCounter()
      for loop in [loopA, loopB] {
        loop.add(LoopObserver(activities: [.beforeTimers]) { _, _ in passes.increment() }, to: .common)
      }
      let fires = AtomicCounter()
      let inside = Locked(0)
      let overlapped = Locked(false)
      let timer = LoopTimer(after: .milliseconds(2), repeatingEvery: .milliseconds(2)) { timer in
        let depth = inside.withLock {
          $0 += 1
          return $0
        }
        if depth > 1 { overlapped.withLock { $0 = true } }
        defer { inside.withLock { $0 -= 1 } }
        let fire = fires.increment()
        let here = RunLoopThread.current
        let there = here === loopA ? loopB : loopA
        here.remove(timer, from: .common)
        here.remove(timer, from: barrierModeA)  // (a no-op unless it was there)
        if fire % 3 == 0 { there.add(timer, to: barrierModeA) }  // several modes there
        there.add(timer, to: .common)
        if fire % 4 == 0 { _ = here.run(mode: barrierModeB, until: .now.advanced(by: .milliseconds(1))) }
        if fire % 5 == 0 { timer.setFireDate(.now) }
      }
      loopA.add(timer, to: .common)
      // (Scaled: under ThreadSanitizer, with the review suites alongside, 400 ms saw 12 fires.)
      let deadline = ContinuousClock.now.advanced(by: .milliseconds(400 * watchdogScale))
      while ContinuousClock.now < deadline && fires.current < 60 { usleep(2_000) }
      let passesBefore = passes.current
      try? timer.invalidateAndWait()
      let after = fires.current
      usleep(20_000)
      return (after, overlapped.withLock { $0 }, passesBefore, fires.current - after)
    }
    guard let outcome else { return }
    #expect(outcome.fires >= 20, "the bouncing timer stopped firing: \(outcome.fires) fires")
    #expect(!outcome.overlapped, "two callouts of the timer ran at once")
    #expect(outcome.after == 0, "a callout ran after invalidateAndWait returned")
    // No spin: a loop that waits for a 2 ms timer makes a few passes per fire, not thousands.
    #expect(outcome.passes < 200 * max(outcome.fires, 1), "\(outcome.passes) passes for \(outcome.fires) fires")
    print("bouncing timer: \(outcome.fires) fires, \(outcome.passes) passes")
  }

  /// The callout moves the timer to B, B defers it as busy, and B shuts down while the callout
  /// still runs. The callout returns without a crash or hang; the timer is invalid (B's shutdown
  /// invalidated it) and it and its handler are released.
  @Test func theOtherLoopShutsDownWhileItHoldsTheTimerDeferred() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "deferred, then shutdown") {
      () throws -> (fires: Int, valid: Bool, timerGone: Bool, captureGone: Bool) in
      let loopA = try RunLoopThread(name: "sd-a")
      let loopB = try RunLoopThread(name: "sd-b")
      defer { loopA.shutdownAndWait() }
      let fires = AtomicCounter()
      let calloutDone = TestGate()
      weak var weakTimer: LoopTimer?
      weak var weakCapture: WeaklyObservedObject?
      var valid = true
      do {
        let capture = WeaklyObservedObject()
        weakCapture = capture
        let timer = LoopTimer(fireAt: .now, repeatingEvery: .milliseconds(5)) { timer in
          withExtendedLifetime(capture) {}
          guard fires.increment() == 1 else { return }
          loopA.remove(timer)
          loopB.add(timer)
          _ = try? loopB.performAndWait {}
          _ = try? loopB.performAndWait {}
          loopB.shutdownAndWait()
          calloutDone.open()
        }
        weakTimer = timer
        loopA.add(timer)
        _ = calloutDone.wait(timeout: .seconds(10))
        _ = try? loopA.performAndWait {}
        usleep(20_000)
        valid = timer.isValid
      }
      _ = try? loopA.performAndWait {}
      return (fires.current, valid, weakTimer == nil, weakCapture == nil)
    }
    #expect(outcome?.fires == 1)
    #expect(outcome?.valid == false)
    #expect(outcome?.timerGone == true, "the timer is still held")
    #expect(outcome?.captureGone == true, "the timer's handler is still held")
  }
}
