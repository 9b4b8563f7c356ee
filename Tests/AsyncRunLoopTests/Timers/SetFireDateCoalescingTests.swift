import Glibc
import Testing

@testable import AsyncRunLoop

// MARK: - 2. setFireDate coalescing

@Suite("setFireDate calls coalesce; the last one wins", .serialized, .timeLimit(.minutes(10)))
struct SetFireDateCoalescingTests {
  /// While a reschedule sent by another thread waits in the inbox, the loop thread moves the timer
  /// again. Promised (`setFireDate`): "on the loop thread it takes effect at once": the timer's
  /// heap entry holds the new date when the call returns.
  @Test
  func aLoopThreadSetFireDateTakesEffectAtOnceWhileARescheduleIsPending() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "loop-thread setFireDate") {
      () throws -> (wanted: Int64, heap: Int64?)? in
      let loop = try RunLoopThread(name: "f1")
      defer { loop.shutdownAndWait() }
      let timer = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(timer)
      _ = try loop.performAndWait {}
      let sent = TestGate()
      let go = TestGate()
      startThread(detached: true) {
        _ = go.wait(timeout: .seconds(10))
        timer.setFireDate(.now.advanced(by: .seconds(7200)))
        sent.open()
      }
      let result = try loop.performAndWait { () -> (Int64, Int64?) in
        go.open()
        _ = sent.wait(timeout: .seconds(10))
        let wanted = LoopClock.Instant.now.advanced(by: .seconds(10))
        timer.setFireDate(wanted)
        return (wanted.nanoseconds, loop.core.modeTable.contents(for: .default).timers.firstDeadline)
      }
      timer.invalidate()
      return result
    }
    guard let outcome, let outcome else { return }
    #expect(outcome.heap == outcome.wanted)
  }

  /// One thread moves a one-shot timer between two loops (one of them blocked for a while, so
  /// reschedules wait there), another resets its date (always an hour away) without pause. Then
  /// the timer settles on the second loop and is moved to fire soon. Promised: at most one
  /// reschedule is in flight, but no date is lost: the timer never fires during the flood (at a
  /// stale date), fires exactly once at the final date, on the loop it is on, never early; no
  /// record is left on either loop.
  @Test func setFireDateRacingMovesBetweenLoopsNeverFiresStaleOrTwice() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "setFireDate flood") {
      () throws -> (fires: [String], early: Int, records: [Int?]) in
      let loopA = try RunLoopThread(name: "f2a")
      let loopB = try RunLoopThread(name: "f2b")
      defer {
        loopA.shutdownAndWait()
        loopB.shutdownAndWait()
      }
      let fires = Guarded<[String]>([])
      let finalDate = Guarded<Int64>(Int64.max)
      let early = AtomicCounter()
      let timer = LoopTimer(after: .seconds(3600)) { _ in
        let here = RunLoopThread.current.name
        if LoopClock.monotonicNanoseconds() < finalDate.snapshot { early.increment() }
        fires.withLock { $0.append(here) }
      }
      loopA.add(timer)
      let stop = Guarded(false)
      let release = blockLoop(loopA)
      let resetter = startThread {
        while !stop.snapshot { timer.setFireDate(.now.advanced(by: .seconds(3600))) }
      }
      let mover = startThread {
        for index in 0..<2000 {
          if index % 2 == 0 {
            loopA.remove(timer)
            loopB.add(timer, to: index % 4 == 0 ? .default : .common)
          } else {
            loopB.remove(timer, from: (index - 1) % 4 == 0 ? .default : .common)
            loopA.add(timer)
          }
          if index == 1000 { release.open() }
        }
        loopA.remove(timer)
        loopB.add(timer)
      }
      joinThread(mover)
      stop.withLock { $0 = true }
      joinThread(resetter)
      release.open()
      let final = LoopClock.Instant.now.advanced(by: .milliseconds(30))
      finalDate.withLock { $0 = final.nanoseconds }
      timer.setFireDate(final)
      _ = waitUntil(timeout: .seconds(10), "the timer fired") { !fires.snapshot.isEmpty }
      usleep(50_000)
      return (fires.snapshot, early.current, [recordCount(loopA), recordCount(loopB)])
    }
    guard let outcome else { return }
    #expect(outcome.fires == ["f2b"])
    #expect(outcome.early == 0)
    #expect(outcome.records == [0, 0])
  }

  /// A timer's date is reset from another thread while its loop is blocked (a reschedule waits
  /// there); the timer is then removed, the loop shut down, and the timer added to another loop
  /// and moved to fire soon. Promised: the pending reschedule on the old loop does not swallow
  /// the new one: the timer fires once, on the new loop, not early.
  @Test func aTimerMovedAwayFromAShuttingDownLoopWithARescheduleWaitingFires() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "move with a reschedule waiting") {
      () throws -> (fires: [String], early: Int) in
      let loopA = try RunLoopThread(name: "f3a")
      let loopB = try RunLoopThread(name: "f3b")
      defer { loopB.shutdownAndWait() }
      let fires = Guarded<[String]>([])
      let finalDate = Guarded<Int64>(Int64.max)
      let early = AtomicCounter()
      let timer = LoopTimer(after: .seconds(3600)) { _ in
        if LoopClock.monotonicNanoseconds() < finalDate.snapshot { early.increment() }
        fires.withLock { $0.append(RunLoopThread.current.name) }
      }
      loopA.add(timer)
      let release = blockLoop(loopA)
      timer.setFireDate(.now.advanced(by: .seconds(1800)))  // waits in A's inbox
      loopA.remove(timer)
      loopA.shutdown()
      loopB.add(timer)
      let final = LoopClock.Instant.now.advanced(by: .milliseconds(30))
      finalDate.withLock { $0 = final.nanoseconds }
      timer.setFireDate(final)
      release.open()
      loopA.shutdownAndWait()
      _ = waitUntil(timeout: .seconds(10), "the timer fired") { !fires.snapshot.isEmpty }
      usleep(50_000)
      return (fires.snapshot, early.current)
    }
    guard let outcome else { return }
    #expect(outcome.fires == ["f3b"])
    #expect(outcome.early == 0)
  }

  /// A repeating timer's callout resets its own date while another thread keeps resetting it
  /// too, and the callout runs the loop nested. Promised: the callout never runs twice at once,
  /// and once the other thread stops and sets a last date the timer fires at it (not at a stale
  /// one from before).
  @Test func setFireDateFromTheCalloutAndAnotherThreadKeepsTheLastDate() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "callout and thread reset") {
      () throws -> (overlaps: Int, early: Int, firedAfterFinal: Bool) in
      let loop = try RunLoopThread(name: "f4")
      defer { loop.shutdownAndWait() }
      let inCallout = Guarded(false)
      let overlaps = AtomicCounter()
      let early = AtomicCounter()
      let finalDate = Guarded<Int64>(Int64.max)
      let firedAfterFinal = Guarded(false)
      let fires = AtomicCounter()
      let timer = LoopTimer(after: .zero, repeatingEvery: .milliseconds(1)) { timer in
        if inCallout.withLock({
          let was = $0; $0 = true; return was
        }) {
          overlaps.increment()
        }
        defer { inCallout.withLock { $0 = false } }
        let final = finalDate.snapshot
        if final != Int64.max {
          if LoopClock.monotonicNanoseconds() < final { early.increment() }
          firedAfterFinal.withLock { $0 = true }
          return
        }
        if fires.increment() % 3 == 0 {
          _ = RunLoopThread.current.run(mode: .default, for: .milliseconds(1))
          // (A block run by that nested run may have set the final date: keep it.)
          if finalDate.snapshot != Int64.max { return }
        }
        timer.setFireDate(.now.advanced(by: .microseconds(200)))
      }
      loop.add(timer)
      let stop = Guarded(false)
      let resetter = startThread {
        while !stop.snapshot {
          timer.setFireDate(.now.advanced(by: .microseconds(500)))
          usleep(50)
        }
      }
      usleep(200_000)
      stop.withLock { $0 = true }
      joinThread(resetter)
      let final = LoopClock.Instant.now.advanced(by: .milliseconds(200))
      _ = try loop.performAndWait {
        finalDate.withLock { $0 = final.nanoseconds }
        timer.setFireDate(final)
      }
      _ = waitUntil(timeout: .seconds(10), "fired after the final date") { firedAfterFinal.snapshot }
      timer.invalidate()
      return (overlaps.current, early.current, firedAfterFinal.snapshot)
    }
    guard let outcome else { return }
    #expect(outcome.overlaps == 0)
    #expect(outcome.early == 0)
    #expect(outcome.firedAfterFinal)
  }
}
