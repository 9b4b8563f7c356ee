import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("A timer moved by its own callout fires where it was moved", .serialized, .timeLimit(.minutes(10)))
struct TimerMovedByItsCalloutTests {
  /// A one-shot timer due now fires on A; its callout moves it to B and lets B apply the add (and,
  /// every other round, find it due: busy). After the fire it is done: invalidated, and promised
  /// (its doc: "a one-shot timer is done"; `invalidate()`: "the loop drops it from its modes") B
  /// holds nothing of it, and the timer and its handler are released.
  @Test
  func aOneShotTimerMovedToAnotherLoopInItsCalloutLeavesNothingOnThatLoop() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "one-shot moved, records") {
      () throws -> [String] in
      var wrong: [String] = []
      for round in 0..<4 {
        let loopA = try RunLoopThread(name: "os-a")
        let loopB = try RunLoopThread(name: "os-b")
        defer {
          loopA.shutdownAndWait()
          loopB.shutdownAndWait()
        }
        let fires = AtomicCounter()
        let calloutDone = TestGate()
        weak var weakTimer: LoopTimer?
        weak var weakCapture: WeaklyObservedObject?
        do {
          let capture = WeaklyObservedObject()
          weakCapture = capture
          let timer = LoopTimer(fireAt: .now) { timer in
            withExtendedLifetime(capture) {}
            fires.increment()
            loopA.remove(timer)
            loopB.add(timer)
            _ = try? loopB.performAndWait {}  // B applied the add (and found it due: busy)
            if round % 2 == 0 { _ = try? loopB.performAndWait {} }
            calloutDone.open()
          }
          weakTimer = timer
          loopA.add(timer)
          _ = calloutDone.wait(timeout: .seconds(10))
          _ = try? loopA.performAndWait {}
        }
        for _ in 0..<3 {
          _ = try? loopA.performAndWait {}
          _ = try? loopB.performAndWait {}
          usleep(1_000)
        }
        let onB = recordCount(loopB) ?? -1
        if fires.current != 1 || onB != 0 || weakTimer != nil || weakCapture != nil {
          wrong.append(
            "round \(round): \(fires.current) fires, \(onB) records on B, timer held \(weakTimer != nil), "
              + "handler's capture held \(weakCapture != nil)")
        }
      }
      return wrong
    }
    #expect(outcome == [])
  }

  /// The same with a `RunLoopThread.current` loop as B, run in its mode after the move: the timer
  /// that is done must not keep B's run alive (promised: a run "has nothing to watch" finishes).
  @Test
  func aOneShotTimerMovedToAnotherLoopDoesNotKeepThatLoopsRunAlive() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "one-shot moved, run") {
      () throws -> RunLoopRunResult in
      let loopA = try RunLoopThread(name: "os2-a")
      defer { loopA.shutdownAndWait() }
      let loopB = RunLoopThread.current
      defer { loopB.shutdown() }
      let calloutDone = TestGate()
      let timer = LoopTimer(fireAt: .now) { timer in
        loopA.remove(timer)
        loopB.add(timer, to: movedModeA)
        calloutDone.open()
        usleep(20_000)  // B applies the add (its run below) while this callout runs
      }
      loopA.add(timer)
      _ = calloutDone.wait(timeout: .seconds(10))
      // Applies the add, finds the timer due (busy, or invalid once the callout ended), then has
      // nothing left to watch.
      return loopB.run(mode: movedModeA, until: .now.advanced(by: .seconds(1)))
    }
    #expect(outcome == .finished, "B's run ended \(String(describing: outcome))")
  }
}

extension TimerMovedByItsCalloutTests {
  /// A repeating timer (one hour) due now fires on A; its callout moves it to B (B defers it as
  /// busy), then a third thread calls `setFireDate(now + 20 ms)` while the callout still runs.
  /// Promised: a date set during the callout wins over the grid; B fires it once at (not before)
  /// that date, and never again for an hour. Callouts never overlap; no spin on B meanwhile.
  @Test func aDateSetFromAThirdThreadDuringADeferredCalloutFiresOnceThere() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "deferred, set date") {
      () throws -> (fires: [String], early: Bool, overlapped: Bool, passesB: Int) in
      let loopA = try RunLoopThread(name: "sfd-a")
      let loopB = try RunLoopThread(name: "sfd-b")
      defer {
        loopA.shutdownAndWait()
        loopB.shutdownAndWait()
      }
      let passesB = AtomicCounter()
      loopB.add(LoopObserver(activities: [.beforeTimers]) { _, _ in passesB.increment() }, to: .common)
      let fires = Locked<[String]>([])
      let inside = Locked(0)
      let overlapped = Locked(false)
      let early = Locked(false)
      let target = Locked<LoopClock.Instant?>(nil)
      let timer = LoopTimer(fireAt: .now, repeatingEvery: .seconds(3600)) { timer in
        let depth = inside.withLock {
          $0 += 1
          return $0
        }
        if depth > 1 { overlapped.withLock { $0 = true } }
        defer { inside.withLock { $0 -= 1 } }
        if let date = target.withLock({ $0 }), LoopClock.Instant.now < date { early.withLock { $0 = true } }
        let count = fires.withLock {
          $0.append(RunLoopThread.current.name)
          return $0.count
        }
        guard count == 1 else { return }
        loopA.remove(timer)
        loopB.add(timer)
        _ = try? loopB.performAndWait {}  // B found it due: busy
        let setter = startThread {
          let date = LoopClock.Instant.now.advanced(by: .milliseconds(20))
          target.withLock { $0 = date }
          timer.setFireDate(date)
        }
        joinThread(setter)
        usleep(5_000)
      }
      loopA.add(timer)
      _ = waitUntil("the second fire") { fires.withLock { $0.count } >= 2 }
      let passes = passesB.current
      usleep(50_000)
      for _ in 0..<2 {
        _ = try? loopA.performAndWait {}
        _ = try? loopB.performAndWait {}
      }
      timer.invalidate()
      return (fires.withLock { $0 }, early.withLock { $0 }, overlapped.withLock { $0 }, passes)
    }
    guard let outcome else { return }
    #expect(outcome.fires == ["sfd-a", "sfd-b"])
    #expect(!outcome.early, "fired before the date set during the callout")
    #expect(!outcome.overlapped)
    #expect(outcome.passesB < 200, "B made \(outcome.passesB) passes while the timer was deferred")
    print("deferred timer with a date set: \(outcome.fires), B passes \(outcome.passesB)")
  }

  /// A one-shot timer's callout moves it to B and sets a new date: it keeps that date (it fires
  /// again then, as in CF) on B, once; after that fire it is done on B (B holds nothing of it).
  @Test func aOneShotTimerMovedWithANewDateFiresOnceMoreThereAndIsDone() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "one-shot moved with a date") {
      () throws -> (fires: [String], valid: Bool, onB: Int?) in
      let loopA = try RunLoopThread(name: "osd-a")
      let loopB = try RunLoopThread(name: "osd-b")
      defer {
        loopA.shutdownAndWait()
        loopB.shutdownAndWait()
      }
      let fires = Locked<[String]>([])
      let timer = LoopTimer(fireAt: .now) { timer in
        let count = fires.withLock {
          $0.append(RunLoopThread.current.name)
          return $0.count
        }
        guard count == 1 else { return }
        loopA.remove(timer)
        loopB.add(timer)
        _ = try? loopB.performAndWait {}
        timer.setFireDate(.now.advanced(by: .milliseconds(5)))
      }
      loopA.add(timer)
      _ = waitUntil("the second fire") { fires.withLock { $0.count } >= 2 }
      usleep(20_000)
      for _ in 0..<2 {
        _ = try? loopA.performAndWait {}
        _ = try? loopB.performAndWait {}
      }
      return (fires.withLock { $0 }, timer.isValid, recordCount(loopB))
    }
    guard let outcome else { return }
    #expect(outcome.fires == ["osd-a", "osd-b"])
    #expect(!outcome.valid)
    #expect(outcome.onB == 0, "B still holds the finished one-shot timer")
  }

  /// A repeating 3 ms timer's first callout moves it to B and shuts down its own loop A from inside
  /// the callout. The timer is B's now: it keeps firing there (A's shutdown does not invalidate a
  /// timer that left it), callouts never overlap, and `invalidateAndWait()` ends it.
  @Test func aCalloutShuttingDownItsOwnLoopAfterMovingTheTimerLeavesItFiringThere() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "callout shuts down its loop") {
      () throws -> (onB: Int, valid: Bool, overlapped: Bool, after: Int) in
      let loopA = try RunLoopThread(name: "own-a")
      let loopB = try RunLoopThread(name: "own-b")
      defer {
        loopA.shutdownAndWait()
        loopB.shutdownAndWait()
      }
      let onB = AtomicCounter()
      let first = AtomicCounter()
      let inside = Locked(0)
      let overlapped = Locked(false)
      let timer = LoopTimer(fireAt: .now, repeatingEvery: .milliseconds(3)) { timer in
        let depth = inside.withLock {
          $0 += 1
          return $0
        }
        if depth > 1 { overlapped.withLock { $0 = true } }
        defer { inside.withLock { $0 -= 1 } }
        if RunLoopThread.current === loopB {
          onB.increment()
          return
        }
        guard first.increment() == 1 else { return }
        loopA.remove(timer)
        loopB.add(timer, to: .common)
        loopA.shutdown()
        usleep(10_000)  // B finds it due meanwhile: busy
      }
      loopA.add(timer)
      _ = waitUntil("fires on B") { onB.current >= 5 }
      loopA.shutdownAndWait()
      let before = onB.current
      _ = waitUntil("more fires on B after A finished") { onB.current >= before + 3 }
      let valid = timer.isValid
      try? timer.invalidateAndWait()
      let after = onB.current
      usleep(20_000)
      return (onB.current, valid, overlapped.withLock { $0 }, onB.current - after)
    }
    guard let outcome else { return }
    #expect(outcome.valid, "A's shutdown invalidated a timer that had moved to B")
    #expect(!outcome.overlapped)
    #expect(outcome.after == 0)
  }

  /// A one-shot timer's callout removes it from its only mode, adds it back in another mode of the
  /// same loop and runs that mode nested (the new record is due: busy there, never run inside its
  /// own callout). After the fire it is done: one fire, nothing left in any mode, released.
  @Test func aOneShotTimerReAddedInAnotherModeAndRunNestedFiresOnceAndIsDone() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "one-shot, other mode, nested") {
      () -> (fires: Int, nestedPasses: Int, records: Int, released: Bool) in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      let fires = AtomicCounter()
      let nestedPasses = AtomicCounter()
      loop.add(LoopObserver(activities: [.beforeTimers]) { _, _ in nestedPasses.increment() }, to: movedModeB)
      weak var weakTimer: LoopTimer?
      do {
        let timer = LoopTimer(fireAt: .now) { timer in
          fires.increment()
          RunLoopThread.current.remove(timer, from: movedModeA)
          RunLoopThread.current.add(timer, to: movedModeB)
          _ = RunLoopThread.current.run(mode: movedModeB, until: .now.advanced(by: .milliseconds(20)))
        }
        weakTimer = timer
        let keep = LoopTimer(after: .seconds(3600)) { _ in }
        loop.add(keep, to: movedModeA)
        loop.add(timer, to: movedModeA)
        _ = loop.run(mode: movedModeA, until: .now.advanced(by: .milliseconds(40)))
        _ = loop.run(mode: movedModeB, until: .now.advanced(by: .milliseconds(10)))
        keep.invalidate()
        _ = loop.run(mode: movedModeA, until: .now.advanced(by: .milliseconds(1)))
      }
      // Only the observer is left.
      return (fires.current, nestedPasses.current, loop.core.modeTable.allRecords.count - 1, weakTimer == nil)
    }
    guard let outcome else { return }
    #expect(outcome.fires == 1)
    #expect(outcome.records == 0, "records left in the modes")
    #expect(outcome.released)
    // No spin: 20 ms of nested run with the busy timer parked makes a few passes, not thousands.
    #expect(outcome.nestedPasses < 200, "\(outcome.nestedPasses) passes")
  }
}

@Suite("Timers and observers moved by their callouts", .serialized, .timeLimit(.minutes(10)))
struct TimersAndObserversMovedByTheirCalloutsTests {
  /// A one-shot timer whose callout moves it to the other loop and sets its fire date to now,
  /// 200 times. Promised: a fire date set in the callout wins over the one-shot ending (it fires
  /// again then), callouts never overlap, each runs on the loop the timer is on; after the last
  /// hop it is invalidated and neither loop holds a record of it.
  @Test func aOneShotTimerHoppingBetweenLoopsFiresOncePerHop() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "one-shot hops") {
      () throws -> (fires: Int, overlaps: Int, wrongLoop: Int, valid: Bool, records: [Int?]) in
      let loopA = try RunLoopThread(name: "h1a")
      let loopB = try RunLoopThread(name: "h1b")
      defer {
        loopA.shutdownAndWait()
        loopB.shutdownAndWait()
      }
      let scenario = CalloutPingPongScenario([loopA, loopB])
      let hops = 200
      let finished = TestGate()
      let timer = LoopTimer(after: .zero) { timer in
        scenario.begin(timer)
        defer { scenario.end() }
        let count = scenario.fires.withLock { $0.count }
        guard count < hops else {
          finished.open()
          return
        }
        let here = RunLoopThread.current
        here.remove(timer)
        scenario.other.add(timer)
        timer.setFireDate(.now)
      }
      loopA.add(timer)
      _ = finished.wait(timeout: .seconds(20))
      _ = try loopA.performAndWait {}
      _ = try loopB.performAndWait {}
      let records = [loopA, loopB].map { loop in try? loop.performAndWait { loop.core.modeTable.allRecords.count } }
      let valid = timer.isValid
      timer.invalidate()
      return (scenario.fires.snapshot.count, scenario.overlaps.current, scenario.wrongLoop.current, valid, records)
    }
    guard let outcome else { return }
    #expect(outcome.fires == 200)
    #expect(outcome.overlaps == 0)
    #expect(outcome.wrongLoop == 0)
    #expect(!outcome.valid)
    #expect(outcome.records == [0, 0])
  }

  /// A repeating timer (every 0 s: once per pass) whose callout moves it to the other loop each
  /// time, while the other loop finds it due in the middle of the callout (`.busy`). Promised:
  /// callouts never overlap and run only on the loop the timer is on; it keeps firing (the busy
  /// loop re-times it when the callout returns); after its invalidation neither loop holds it.
  @Test func aRepeatingTimerMovedByItsCalloutKeepsFiringWithoutOverlap() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "repeating hops") {
      () throws -> (fires: Int, overlaps: Int, wrongLoop: Int, records: [Int?]) in
      let loopA = try RunLoopThread(name: "h2a")
      let loopB = try RunLoopThread(name: "h2b")
      defer {
        loopA.shutdownAndWait()
        loopB.shutdownAndWait()
      }
      let scenario = CalloutPingPongScenario([loopA, loopB])
      let timer = LoopTimer(after: .zero, repeatingEvery: .zero) { timer in
        scenario.begin(timer)
        defer { scenario.end() }
        let here = RunLoopThread.current
        here.remove(timer)
        scenario.other.add(timer)
        usleep(50)  // the other loop finds it due meanwhile
      }
      loopA.add(timer)
      waitUntil("300 fires") { scenario.fires.snapshot.count >= 300 }
      timer.invalidate()
      _ = try loopA.performAndWait {}
      _ = try loopB.performAndWait {}
      _ = try loopA.performAndWait {}
      let records = [loopA, loopB].map { loop in try? loop.performAndWait { loop.core.modeTable.allRecords.count } }
      return (scenario.fires.snapshot.count, scenario.overlaps.current, scenario.wrongLoop.current, records)
    }
    guard let outcome else { return }
    #expect(outcome.fires >= 300)
    #expect(outcome.overlaps == 0)
    #expect(outcome.wrongLoop == 0)
    #expect(outcome.records == [0, 0])
  }

  /// A repeating observer of every activity whose callout moves it to the other loop each time.
  /// Promised: it is never told inside its own callout (no overlap), only by the loop it is on,
  /// and after its invalidation neither loop holds it.
  @Test func aRepeatingObserverMovedByItsCalloutNeverOverlaps() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "observer hops") {
      () throws -> (told: Int, overlaps: Int, wrongLoop: Int, records: [Int?]) in
      let loopA = try RunLoopThread(name: "h3a")
      let loopB = try RunLoopThread(name: "h3b")
      defer {
        loopA.shutdownAndWait()
        loopB.shutdownAndWait()
      }
      let scenario = CalloutPingPongScenario([loopA, loopB])
      let observer = LoopObserver(activities: .all) { observer, _ in
        scenario.begin(observer)
        defer { scenario.end() }
        let here = RunLoopThread.current
        here.remove(observer)
        scenario.other.add(observer)
        usleep(20)
      }
      // Passes on both loops (an activity that comes while the callout runs on the other loop is
      // skipped, as a nested run skips it).
      let tickers = [loopA, loopB].map { loop in
        let ticker = LoopTimer(after: .zero, repeatingEvery: .microseconds(200)) { _ in }
        loop.add(ticker)
        return ticker
      }
      loopA.add(observer)
      waitUntil("300 callouts") { scenario.fires.snapshot.count >= 300 }
      observer.invalidate()
      for ticker in tickers { ticker.invalidate() }
      _ = try loopA.performAndWait {}
      _ = try loopB.performAndWait {}
      let records = [loopA, loopB].map { loop in try? loop.performAndWait { loop.core.modeTable.allRecords.count } }
      return (scenario.fires.snapshot.count, scenario.overlaps.current, scenario.wrongLoop.current, records)
    }
    guard let outcome else { return }
    #expect(outcome.told >= 300)
    #expect(outcome.overlaps == 0)
    #expect(outcome.wrongLoop == 0)
    #expect(outcome.records == [0, 0])
  }

  /// A one-shot observer whose callout removes it and adds it back to another mode of the same
  /// loop, then runs the loop nested in that mode. Promised: told exactly once (a nested run skips
  /// it), invalidated after, and the loop holds no record of it.
  @Test func aOneShotObserverReAddedAndNestedInItsCalloutIsToldOnce() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "one-shot re-add") {
      () throws -> (told: Int, valid: Bool, agreement: BindingAgreement?) in
      let loop = try RunLoopThread(name: "h4")
      defer { loop.shutdownAndWait() }
      let told = AtomicCounter()
      let observer = LoopObserver(activities: [.entry, .beforeTimers, .exit], repeats: false) { observer, _ in
        told.increment()
        let loop = RunLoopThread.current
        loop.remove(observer, from: loopThreadModeA)
        loop.add(observer, to: loopThreadModeB)
        _ = loop.run(mode: loopThreadModeB, for: .milliseconds(5))
      }
      loop.add(observer, to: loopThreadModeA)
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: loopThreadModeA)
      loop.add(keep, to: loopThreadModeB)
      runOnLoopAndWait(loop, mode: loopThreadModeA, for: .milliseconds(10))
      runOnLoopAndWait(loop, mode: loopThreadModeB, for: .milliseconds(10))
      keep.invalidate()
      return (told.current, observer.isValid, bindingAgreement(observer, on: loop))
    }
    guard let outcome else { return }
    #expect(outcome.told == 1)
    #expect(!outcome.valid)
    #expect(outcome.agreement == BindingAgreement(modes: [], bound: false, records: 0, registrations: 0))
  }
}
