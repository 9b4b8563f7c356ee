import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("A record that left its loop is never attached again", .serialized, .timeLimit(.minutes(10)))
struct RecordNeverReattachedTests {
  /// A one-shot timer in two modes; while the loop is blocked it leaves both (invalidated, or
  /// removed from both) and is added again. Invalidated: the add is ignored and it never fires.
  /// Removed: it fires exactly once, in the mode it was added to again, and not in the other.
  @Test(arguments: ["invalidate", "remove", "remove-other-loop"])
  func aTimerThatLeftTwoModesWhileTheLoopWasBlockedFiresAtMostOnce(how: String) async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "timer re-add") {
      () throws -> (fires: [String], valid: Bool) in
      let first = try RunLoopThread(name: "rec-a")
      let second = try RunLoopThread(name: "rec-b")
      defer {
        first.shutdownAndWait()
        second.shutdownAndWait()
      }
      var log: [String] = []
      for round in 0..<10 {
        let fires = Guarded<[String]>([])
        // Not due before the test is done with it (unless a case moves its date); scaled, as a
        // sanitizer's slowdown can make the steps below take longer than 60 ms.
        let timer = LoopTimer(after: .milliseconds(60) * watchdogScale) { _ in
          let name = first.isOnLoopThread ? "a" : (second.isOnLoopThread ? "b" : "?")
          fires.withLock { $0.append(name) }
        }
        if round % 2 == 0 {
          first.add(timer, to: .default)
          first.add(timer, to: "other")
          try first.performAndWait {}  // applied before the block
        }
        let release = blockLoop(first)
        if round % 2 == 1 {
          first.add(timer, to: .default)
          first.add(timer, to: "other")
        }
        switch how {
        case "invalidate":
          timer.invalidate()
          first.add(timer, to: .default)
          first.add(timer, to: "other")
        case "remove":
          first.remove(timer, from: "other")
          first.remove(timer, from: .default)
          first.add(timer, to: .default)
          timer.setFireDate(.now)
        default:
          first.remove(timer, from: .default)
          first.remove(timer, from: "other")
          second.add(timer, to: .default)
          timer.setFireDate(.now)
        }
        // The other loop may fire it before `first` is released: fine, it is on that loop now.
        release.open()
        try first.performAndWait {}
        try second.performAndWait {}
        // Let any due entry fire: a sentinel timer later than the timer's date on each loop.
        for loop in [first, second] {
          let gate = TestGate()
          let delay = Duration.milliseconds(how == "invalidate" ? 80 : 30) * watchdogScale
          loop.add(LoopTimer(after: delay) { _ in gate.open() }, to: .default)
          _ = gate.wait(timeout: .seconds(10))
        }
        // Run `first` in the other mode too: a stale entry there would fire now.
        try first.performAndWait { _ = first.run(mode: "other", for: .milliseconds(20)) }
        log.append(fires.snapshot.joined())
        timer.invalidate()
      }
      return (log, true)
    }
    let expected: String
    switch how {
    case "invalidate": expected = ""
    case "remove": expected = "a"
    default: expected = "b"
    }
    #expect(outcome?.fires == Array(repeating: expected, count: 10), "fires per round: \(outcome?.fires ?? [])")
  }

  /// An observer in two modes, removed from both while the loop is blocked and added to one
  /// again, is told exactly as often as an observer that was never moved (once per pass).
  @Test func anObserverAddedAgainAfterLeavingTwoModesIsToldOncePerPass() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "observer re-add") {
      () throws -> [String] in
      let loop = try RunLoopThread(name: "obs")
      defer { loop.shutdownAndWait() }
      let keepAlive = LoopTimer(after: .zero, repeatingEvery: .milliseconds(1)) { _ in }
      loop.add(keepAlive, to: .default)
      loop.add(keepAlive, to: "other")
      var mismatches: [String] = []
      for round in 0..<10 {
        let reference = AtomicCounter()
        let moved = AtomicCounter()
        let referenceObserver = LoopObserver(activities: .beforeTimers) { _, _ in reference.increment() }
        let movedObserver = LoopObserver(activities: .beforeTimers) { _, _ in moved.increment() }
        loop.add(movedObserver, to: .default)
        loop.add(movedObserver, to: "other")
        if round % 2 == 0 { try loop.performAndWait {} }
        let release = blockLoop(loop)
        loop.remove(movedObserver, from: .default)
        loop.remove(movedObserver, from: "other")
        loop.add(movedObserver, to: .default)
        loop.add(referenceObserver, to: .default)
        release.open()
        // From the pass after the blocked one, both are told in the same passes: compare the
        // increments at work point A (both were told in that pass's beforeTimers).
        let start = try loop.performAndWait { (reference.current, moved.current) }
        var seen = (0, 0)
        for _ in 0..<20 {
          seen = try loop.performAndWait { (reference.current - start.0, moved.current - start.1) }
          usleep(1_000)
        }
        // In the other mode: neither is there any more.
        let other = try loop.performAndWait { () -> (Int, Int) in
          let before = (reference.current, moved.current)
          _ = loop.run(mode: "other", for: .milliseconds(10))
          return (reference.current - before.0, moved.current - before.1)
        }
        if seen.0 != seen.1 || other.1 != 0 { mismatches.append("round \(round): \(seen), other \(other)") }
        referenceObserver.invalidate()
        movedObserver.invalidate()
      }
      keepAlive.invalidate()
      return mismatches
    }
    #expect(outcome == [], "\(outcome ?? [])")
  }

  /// A descriptor source in two modes, removed from both while the loop is blocked: added to the
  /// same loop again it is registered afresh (no `EEXIST`, no `.error`) and fires; moved to
  /// another loop it fires there and never on the first.
  @Test(arguments: [false, true])
  func aDescriptorSourceThatLeftTwoModesWhileBlockedIsRegisteredAgain(otherLoop: Bool) async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "descriptor re-add") {
      () throws -> [String] in
      let first = try RunLoopThread(name: "fd-a")
      let second = try RunLoopThread(name: "fd-b")
      defer {
        first.shutdownAndWait()
        second.shutdownAndWait()
      }
      var problems: [String] = []
      for round in 0..<10 {
        let pipe = makePipe()
        let seen = Guarded<[String]>([])
        let source = DescriptorSource(descriptor: pipe.read) { _, events in
          let name = first.isOnLoopThread ? "a" : (second.isOnLoopThread ? "b" : "?")
          seen.withLock { $0.append(events.contains(.error) ? "\(name):error" : name) }
          _ = drainDescriptor(pipe.read)
        }
        try first.add(source, to: .default)
        try first.add(source, to: "other")
        if round % 2 == 0 { try first.performAndWait {} }
        let release = blockLoop(first)
        first.remove(source, from: "other")
        first.remove(source, from: .default)
        let target = otherLoop ? second : first
        try target.add(source, to: .default)
        release.open()
        try first.performAndWait {}
        try second.performAndWait {}
        writeByte(pipe.write)
        let fired = waitUntil(timeout: .seconds(5), "the source fires") { !seen.snapshot.isEmpty }
        try first.performAndWait { _ = first.run(mode: "other", for: .milliseconds(5)) }
        writeByte(pipe.write)
        usleep(20_000)
        try first.performAndWait {}
        try second.performAndWait {}
        let expected = otherLoop ? "b" : "a"
        let log = seen.snapshot
        if !fired || log.isEmpty || log.contains(where: { $0 != expected }) {
          problems.append("round \(round): \(log)")
        }
        source.invalidate()
        try first.performAndWait {}
        try second.performAndWait {}
        close(pipe.read)
        close(pipe.write)
      }
      return problems
    }
    #expect(outcome == [], "\(outcome ?? [])")
  }

  /// `setFireDate` racing a timer's moves between two loops and its invalidation: no callout
  /// ever runs on two threads at once, none starts after `invalidate()` returned, nothing traps.
  @Test func setFireDateRacingMovesAndInvalidationIsHarmless() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "setFireDate race") {
      () throws -> (overlaps: Int, late: Int, rounds: Int) in
      let first = try RunLoopThread(name: "sfd-a")
      let second = try RunLoopThread(name: "sfd-b")
      defer {
        first.shutdownAndWait()
        second.shutdownAndWait()
      }
      let overlaps = AtomicCounter()
      let late = AtomicCounter()
      let rounds = repeatRounds(30) { _ in
        let inside = AtomicCounter()
        let invalidated = Guarded(false)
        let timer = LoopTimer(after: .zero, repeatingEvery: .microseconds(200)) { _ in
          if inside.increment() != 1 { overlaps.increment() }
          if invalidated.snapshot { late.increment() }
          inside.value.subtract(1, ordering: .sequentiallyConsistent)
        }
        first.add(timer, to: .default)
        first.add(timer, to: "other")
        race([
          {
            for index in 0..<200 {
              let (from, to) = index % 2 == 0 ? (first, second) : (second, first)
              from.remove(timer, from: .default)
              from.remove(timer, from: "other")
              to.add(timer, to: index % 3 == 0 ? .common : .default)
              if index % 3 == 0 { to.remove(timer, from: .common) }
              to.add(timer, to: .default)
            }
          },
          {
            for _ in 0..<400 { timer.setFireDate(.now) }
          },
          {
            usleep(UInt32.random(in: 0..<3_000))
            try? timer.invalidateAndWait()
            invalidated.withLock { $0 = true }
          },
        ])
        try? first.performAndWait {}
        try? second.performAndWait {}
      }
      return (overlaps.current, late.current, rounds)
    }
    #expect(outcome?.overlaps == 0)
    #expect(outcome?.late == 0)
  }
}
