import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("A timer in several modes fires once per date", .serialized, .timeLimit(.minutes(10)))
struct TimerInSeveralModesTests {
  /// A timer added to A, then B, then `.common`; A (its first mode, the record's own entry) is
  /// removed, so every mode left uses an extra entry. It fires once per run in each mode it is in,
  /// never in A, and follows `setFireDate` from the loop thread and from another thread.
  @Test func aTimerWhoseFirstModeWasRemovedFiresOnceInEachOtherMode() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "extra entries") {
      () -> [String: Int] in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      let fires = Locked<[String: Int]>([:])
      let running = Locked<RunLoopMode?>(nil)
      let timer = makeParkedTimer { _ in
        let mode = running.withLock { $0 }
        fires.withLock { $0[mode?.rawValue ?? "?", default: 0] += 1 }
        RunLoopThread.current.stop()
      }
      loop.add(timer, to: payloadModeA)
      loop.add(timer, to: payloadModeB)
      loop.add(timer, to: .common)
      loop.remove(timer, from: payloadModeA)
      #expect(Set(loop.core.modes(of: timer)) == [payloadModeB, .default])
      func runOnce(_ mode: RunLoopMode) -> RunLoopRunResult {
        running.withLock { $0 = mode }
        return loop.run(mode: mode, until: .now.advanced(by: .seconds(5)))
      }
      // From the loop thread.
      timer.setFireDate(.now)
      #expect(runOnce(payloadModeB) == .stopped)
      timer.setFireDate(.now)
      #expect(runOnce(.default) == .stopped)
      // A holds nothing now: the run finds nothing to watch.
      timer.setFireDate(.now)
      #expect(runOnce(payloadModeA) == .finished)
      #expect(runOnce(payloadModeB) == .stopped)  // still due there from the last setFireDate
      // From another thread, while the loop sleeps in the run.
      for mode in [payloadModeB, RunLoopMode.default] {
        let thread = startThread {
          usleep(20_000)
          timer.setFireDate(.now)
        }
        #expect(runOnce(mode) == .stopped)
        joinThread(thread)
      }
      // Back to A (the record's own entry again) and out of B.
      loop.add(timer, to: payloadModeA)
      loop.remove(timer, from: payloadModeB)
      timer.setFireDate(.now)
      #expect(runOnce(payloadModeA) == .stopped)
      timer.setFireDate(.now)
      #expect(runOnce(.default) == .stopped)
      #expect(runOnce(payloadModeB) == .finished)
      timer.invalidate()
      return fires.withLock { $0 }
    }
    #expect(outcome == ["payload-mode-b": 3, "kCFRunLoopDefaultMode": 3, "payload-mode-a": 1])
  }

  /// The timer fires in B (an extra entry) and its callout runs the loop nested in C and in
  /// `.default` (further extra entries, all due): those runs skip it (they park its entries), and
  /// once the callout returns each entry follows the timer's next date: nothing fires again
  /// until the test asks.
  @Test func nestedRunsInTheTimersOtherModesSkipItAndItsEntriesComeBack() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "parked entries") {
      () -> (fires: Int, maxDepth: Int, nested: [RunLoopRunResult], after: [Int]) in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      let fires = AtomicCounter()
      let depth = Locked((current: 0, max: 0))
      let nested = Locked<[RunLoopRunResult]>([])
      let first = Locked(true)
      let timer = makeParkedTimer { _ in
        fires.increment()
        depth.withLock {
          $0.current += 1
          $0.max = max($0.max, $0.current)
        }
        let isFirst = first.withLock { isFirst in
          defer { isFirst = false }
          return isFirst
        }
        if isFirst {
          let current = RunLoopThread.current
          // A keep-alive in C and default, so each nested run sleeps its whole time.
          let keep = LoopTimer(after: .seconds(3600)) { _ in }
          current.add(keep, to: payloadModeC)
          current.add(keep, to: .default)
          for mode in [payloadModeC, RunLoopMode.default] {
            let result = current.run(mode: mode, until: .now.advanced(by: .milliseconds(30)))
            nested.withLock { $0.append(result) }
          }
          keep.invalidate()
        } else {
          RunLoopThread.current.stop()
        }
        depth.withLock { $0.current -= 1 }
      }
      loop.add(timer, to: payloadModeA)
      loop.add(timer, to: payloadModeB)
      loop.add(timer, to: payloadModeC)
      loop.add(timer, to: .default)
      loop.remove(timer, from: payloadModeA)
      timer.setFireDate(.now)
      // The first fire (with its nested runs); the run then times out, nothing else due.
      _ = loop.run(mode: payloadModeB, until: .now.advanced(by: .milliseconds(150)))
      let firesAfterFirst = fires.current
      // Nothing due in C or default either (their parked entries moved to the next date).
      _ = loop.run(mode: payloadModeC, until: .now.advanced(by: .milliseconds(30)))
      _ = loop.run(mode: .default, until: .now.advanced(by: .milliseconds(30)))
      let firesAfterOthers = fires.current
      var after: [Int] = []
      for mode in [payloadModeC, RunLoopMode.default, payloadModeB] {
        timer.setFireDate(.now)
        _ = loop.run(mode: mode, until: .now.advanced(by: .seconds(5)))
        after.append(fires.current)
      }
      timer.invalidate()
      return (firesAfterFirst * 10 + firesAfterOthers, depth.withLock { $0.max }, nested.withLock { $0 }, after)
    }
    #expect(outcome?.fires == 11, "fires after the first run, and after the runs in C and default")
    #expect(outcome?.maxDepth == 1, "the timer fired inside its own callout")
    #expect(outcome?.nested == [.timedOut, .timedOut])
    #expect(outcome?.after == [2, 3, 4])
  }

  /// The callout removes the timer from every mode it is in and adds it back to another (a new
  /// record on the same loop, with no callout running as far as that record knows), then runs
  /// the loop nested in that mode, where the re-added timer is due at the date that just fired.
  /// Promised: "a timer never fires inside its own callout".
  @Test func aTimerReAddedInItsOwnCalloutDoesNotFireInsideIt() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "re-added in callout") {
      () -> (maxDepth: Int, fires: Int) in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      let fires = AtomicCounter()
      let depth = Locked((current: 0, max: 0))
      let timer = makeParkedTimer { timer in
        fires.increment()
        let nestedCall = depth.withLock {
          $0.current += 1
          $0.max = max($0.max, $0.current)
          return $0.current > 1
        }
        defer { depth.withLock { $0.current -= 1 } }
        guard !nestedCall, fires.current == 1 else { return }
        let current = RunLoopThread.current
        current.remove(timer, from: payloadModeA)  // its last mode: unbound
        current.add(timer, to: payloadModeB)  // a new record
        let keep = LoopTimer(after: .seconds(3600)) { _ in }
        current.add(keep, to: payloadModeB)
        _ = current.run(mode: payloadModeB, until: .now.advanced(by: .milliseconds(30)))
        keep.invalidate()
      }
      loop.add(timer, to: payloadModeA)
      timer.setFireDate(.now)
      _ = loop.run(mode: payloadModeA, until: .now.advanced(by: .milliseconds(100)))
      timer.invalidate()
      return (depth.withLock { $0.max }, fires.current)
    }
    #expect(outcome?.maxDepth == 1, "the timer's handler ran inside its own callout")
    #expect(outcome?.fires == 1)
  }

  /// The same across loops: the callout moves the timer to another loop and makes it due there,
  /// then waits while that loop makes passes. The other loop must not run the handler while the
  /// callout runs (callouts never overlap, and `invalidateAndWait` waits for one callout); once
  /// it returns, the other loop fires it.
  @Test func aTimerMovedToAnotherLoopInItsCalloutFiresThereOnlyAfterTheCalloutReturns() async throws {
    let other = try RunLoopThread(name: "other")
    defer { other.shutdown() }
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "moved in callout") {
      () -> (overlapped: Bool, firesDuringCallout: Int, secondFireOnOther: Bool) in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      let fires = AtomicCounter()
      // `recorded`: fires whose callout has recorded where it ran (after `fires` counted it).
      let running = Locked((inside: 0, overlapped: false, duringCallout: -1, secondOnOther: false, recorded: 0))
      let timer = makeParkedTimer { timer in
        let fire = fires.increment()
        running.withLock {
          $0.inside += 1
          if $0.inside > 1 { $0.overlapped = true }
          if fire == 2 { $0.secondOnOther = RunLoopThread.current === other }
          $0.recorded += 1
        }
        defer { running.withLock { $0.inside -= 1 } }
        guard fire == 1 else { return }
        RunLoopThread.current.remove(timer, from: payloadModeA)  // its last mode here: unbound
        other.add(timer)
        timer.setFireDate(.now)  // due there at once (and kept after this callout)
        for _ in 0..<3 {  // the other loop applies the add and makes passes meanwhile
          _ = try? other.performAndWait {}
          usleep(2_000)
        }
        running.withLock { $0.duringCallout = fires.current - 1 }
      }
      loop.add(timer, to: payloadModeA)
      timer.setFireDate(.now)
      _ = loop.run(mode: payloadModeA, until: .now.advanced(by: .milliseconds(100)))
      _ = waitUntil("the second fire, on the other loop") { running.withLock { $0.recorded >= 2 } }
      timer.invalidate()
      return running.withLock { ($0.overlapped, $0.duringCallout, $0.secondOnOther) }
    }
    #expect(outcome?.overlapped == false, "two callouts of the timer ran at once")
    #expect(outcome?.firesDuringCallout == 0, "the other loop fired it during its callout")
    #expect(outcome?.secondFireOnOther == true)
  }

  /// The callout invalidates the timer while a nested run in its other modes has parked their
  /// entries: nothing fires again, nothing crashes, and the timer and its handler's captures are
  /// released.
  @Test func invalidatedInItsCalloutWithParkedExtraEntriesTheTimerIsReleased() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "invalidate in callout") {
      () -> (fires: Int, timerGone: Bool, captureGone: Bool) in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      let fires = AtomicCounter()
      weak var weakTimer: LoopTimer?
      weak var weakCapture: WeaklyObservedObject?
      do {
        let capture = WeaklyObservedObject()
        weakCapture = capture
        let timer = makeParkedTimer { timer in
          withExtendedLifetime(capture) {}
          fires.increment()
          let current = RunLoopThread.current
          let keep = LoopTimer(after: .seconds(3600)) { _ in }
          current.add(keep, to: payloadModeC)
          _ = current.run(mode: payloadModeC, until: .now.advanced(by: .milliseconds(20)))  // parks C's entry
          timer.invalidate()
          _ = current.run(mode: payloadModeC, until: .now.advanced(by: .milliseconds(20)))
          keep.invalidate()
        }
        weakTimer = timer
        loop.add(timer, to: payloadModeA)
        loop.add(timer, to: payloadModeB)
        loop.add(timer, to: payloadModeC)
        loop.remove(timer, from: payloadModeA)
        timer.setFireDate(.now)
      }
      _ = loop.run(mode: payloadModeB, until: .now.advanced(by: .milliseconds(100)))
      for mode in [payloadModeA, payloadModeB, payloadModeC] {
        _ = loop.run(mode: mode, until: .now.advanced(by: .milliseconds(10)))
      }
      return (fires.current, weakTimer == nil, weakCapture == nil)
    }
    #expect(outcome?.fires == 1)
    #expect(outcome?.timerGone == true, "the invalidated timer is still held")
    #expect(outcome?.captureGone == true, "the invalidated timer's handler is still held")
  }

  /// Churn: a timer in several modes moves between them, is removed from its first mode,
  /// rescheduled from another thread and re-added, many times, with a fire in each round; every
  /// round it fires exactly once in the mode run, and at the end it and its handler are released.
  @Test func churningATimersModesKeepsExactFireCounts() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "timer churn") {
      () -> (rounds: Int, wrong: [String], released: Bool) in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      let fires = AtomicCounter()
      var wrong: [String] = []
      weak var weakTimer: LoopTimer?
      var rounds = 0
      do {
        let timer = makeParkedTimer { _ in
          fires.increment()
          RunLoopThread.current.stop()
        }
        weakTimer = timer
        let modes: [RunLoopMode] = [payloadModeA, payloadModeB, payloadModeC, .default]
        rounds = repeatRounds(60, budget: .milliseconds(600)) { round in
          // A rotating set of modes, the first of them removed again.
          let first = modes[round % 4]
          let second = modes[(round + 1) % 4]
          let third = modes[(round + 2) % 4]
          loop.add(timer, to: first)
          loop.add(timer, to: second)
          loop.add(timer, to: round % 3 == 0 ? .common : third)
          loop.remove(timer, from: first)
          let before = fires.current
          if round % 2 == 0 {
            timer.setFireDate(.now)
          } else {
            let thread = startThread { timer.setFireDate(.now) }
            joinThread(thread)
          }
          let result = loop.run(mode: second, until: .now.advanced(by: .seconds(5)))
          if result != .stopped || fires.current != before + 1 {
            wrong.append("round \(round): \(result), fires \(fires.current - before)")
          }
          // Out of every mode: the next round starts with a new record.
          for mode in modes { loop.remove(timer, from: mode) }
          loop.remove(timer, from: .common)
          if !loop.core.modes(of: timer).isEmpty { wrong.append("round \(round): still in modes") }
        }
        timer.invalidate()
      }
      return (rounds, wrong, weakTimer == nil)
    }
    #expect(outcome?.wrong == [])
    #expect(outcome?.released == true)
  }
}
