import Glibc
import Testing

@testable import AsyncRunLoop

// Review round 10: the smaller member records (a timer's extra entries with their unowned back
// reference, descriptor state in the kind's payload, the 32-bit common order and its renumbering)
// and cross-thread changes as values. Blocking work runs on threads of the tests' own
// (`withWatchdogOnThread`, whose thread's current loop the body drives); results are checked after
// it returns.

private let modeA: RunLoopMode = "r10-a"
private let modeB: RunLoopMode = "r10-b"
private let modeC: RunLoopMode = "r10-c"

/// A repeating timer that is never due by itself (an hour): the tests make it due with
/// `setFireDate(.now)`, so every fire is one the test asked for.
private func makeParkedTimer(_ handler: @escaping @Sendable (LoopTimer) -> Void) -> LoopTimer {
  LoopTimer(after: .seconds(3600), repeatingEvery: .seconds(3600), handler: handler)
}

/// An object to watch with a weak reference (captured by a member's closure).
private final class R10Token: Sendable {}

/// Counts the loop's passes (`beforeTimers`) in the modes it is added to.
private final class R10PassCounter: Sendable {
  let passes = AtomicCounter()
  let observer: LoopObserver

  init() {
    observer = LoopObserver(activities: [.beforeTimers]) { [passes] _, _ in passes.increment() }
  }
}

@Suite("ReviewRound10: timers in several modes", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound10TimerTests {
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
      loop.add(timer, to: modeA)
      loop.add(timer, to: modeB)
      loop.add(timer, to: .common)
      loop.remove(timer, from: modeA)
      #expect(Set(loop.core.modes(of: timer)) == [modeB, .default])
      func runOnce(_ mode: RunLoopMode) -> RunLoopRunResult {
        running.withLock { $0 = mode }
        return loop.run(mode: mode, until: .now.advanced(by: .seconds(5)))
      }
      // From the loop thread.
      timer.setFireDate(.now)
      #expect(runOnce(modeB) == .stopped)
      timer.setFireDate(.now)
      #expect(runOnce(.default) == .stopped)
      // A holds nothing now: the run finds nothing to watch.
      timer.setFireDate(.now)
      #expect(runOnce(modeA) == .finished)
      #expect(runOnce(modeB) == .stopped)  // still due there from the last setFireDate
      // From another thread, while the loop sleeps in the run.
      for mode in [modeB, RunLoopMode.default] {
        let thread = startThread {
          usleep(20_000)
          timer.setFireDate(.now)
        }
        #expect(runOnce(mode) == .stopped)
        joinThread(thread)
      }
      // Back to A (the record's own entry again) and out of B.
      loop.add(timer, to: modeA)
      loop.remove(timer, from: modeB)
      timer.setFireDate(.now)
      #expect(runOnce(modeA) == .stopped)
      timer.setFireDate(.now)
      #expect(runOnce(.default) == .stopped)
      #expect(runOnce(modeB) == .finished)
      timer.invalidate()
      return fires.withLock { $0 }
    }
    #expect(outcome == ["r10-b": 3, "kCFRunLoopDefaultMode": 3, "r10-a": 1])
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
          current.add(keep, to: modeC)
          current.add(keep, to: .default)
          for mode in [modeC, RunLoopMode.default] {
            let result = current.run(mode: mode, until: .now.advanced(by: .milliseconds(30)))
            nested.withLock { $0.append(result) }
          }
          keep.invalidate()
        } else {
          RunLoopThread.current.stop()
        }
        depth.withLock { $0.current -= 1 }
      }
      loop.add(timer, to: modeA)
      loop.add(timer, to: modeB)
      loop.add(timer, to: modeC)
      loop.add(timer, to: .default)
      loop.remove(timer, from: modeA)
      timer.setFireDate(.now)
      // The first fire (with its nested runs); the run then times out, nothing else due.
      _ = loop.run(mode: modeB, until: .now.advanced(by: .milliseconds(150)))
      let firesAfterFirst = fires.current
      // Nothing due in C or default either (their parked entries moved to the next date).
      _ = loop.run(mode: modeC, until: .now.advanced(by: .milliseconds(30)))
      _ = loop.run(mode: .default, until: .now.advanced(by: .milliseconds(30)))
      let firesAfterOthers = fires.current
      var after: [Int] = []
      for mode in [modeC, RunLoopMode.default, modeB] {
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
        current.remove(timer, from: modeA)  // its last mode: unbound
        current.add(timer, to: modeB)  // a new record
        let keep = LoopTimer(after: .seconds(3600)) { _ in }
        current.add(keep, to: modeB)
        _ = current.run(mode: modeB, until: .now.advanced(by: .milliseconds(30)))
        keep.invalidate()
      }
      loop.add(timer, to: modeA)
      timer.setFireDate(.now)
      _ = loop.run(mode: modeA, until: .now.advanced(by: .milliseconds(100)))
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
    let other = try RunLoopThread(name: "r10-other")
    defer { other.shutdown() }
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "moved in callout") {
      () -> (overlapped: Bool, firesDuringCallout: Int, secondFireOnOther: Bool) in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      let fires = AtomicCounter()
      let running = Locked((inside: 0, overlapped: false, duringCallout: -1, secondOnOther: false))
      let timer = makeParkedTimer { timer in
        let fire = fires.increment()
        running.withLock {
          $0.inside += 1
          if $0.inside > 1 { $0.overlapped = true }
          if fire == 2 { $0.secondOnOther = RunLoopThread.current === other }
        }
        defer { running.withLock { $0.inside -= 1 } }
        guard fire == 1 else { return }
        RunLoopThread.current.remove(timer, from: modeA)  // its last mode here: unbound
        other.add(timer)
        timer.setFireDate(.now)  // due there at once (and kept after this callout)
        for _ in 0..<3 {  // the other loop applies the add and makes passes meanwhile
          _ = try? other.performAndWait {}
          usleep(2_000)
        }
        running.withLock { $0.duringCallout = fires.current - 1 }
      }
      loop.add(timer, to: modeA)
      timer.setFireDate(.now)
      _ = loop.run(mode: modeA, until: .now.advanced(by: .milliseconds(100)))
      _ = waitUntil("the second fire, on the other loop") { fires.current >= 2 }
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
      weak var weakCapture: R10Token?
      do {
        let capture = R10Token()
        weakCapture = capture
        let timer = makeParkedTimer { timer in
          withExtendedLifetime(capture) {}
          fires.increment()
          let current = RunLoopThread.current
          let keep = LoopTimer(after: .seconds(3600)) { _ in }
          current.add(keep, to: modeC)
          _ = current.run(mode: modeC, until: .now.advanced(by: .milliseconds(20)))  // parks C's entry
          timer.invalidate()
          _ = current.run(mode: modeC, until: .now.advanced(by: .milliseconds(20)))
          keep.invalidate()
        }
        weakTimer = timer
        loop.add(timer, to: modeA)
        loop.add(timer, to: modeB)
        loop.add(timer, to: modeC)
        loop.remove(timer, from: modeA)
        timer.setFireDate(.now)
      }
      _ = loop.run(mode: modeB, until: .now.advanced(by: .milliseconds(100)))
      for mode in [modeA, modeB, modeC] { _ = loop.run(mode: mode, until: .now.advanced(by: .milliseconds(10))) }
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
        let modes: [RunLoopMode] = [modeA, modeB, modeC, .default]
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

@Suite("ReviewRound10: descriptor registrations in the kind's payload", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound10DescriptorTests {
  /// What the loop keeps for its descriptors (loop thread): registrations by token, and tokens by
  /// number.
  private static func registrations(_ loop: RunLoopThread) -> (byToken: Int, numbers: [Int32]) {
    (loop.core.descriptors.count, loop.core.descriptors.ownedDescriptors)
  }

  /// A source in A and B, its descriptor readable: runs in C silence it (no spin, no delivery),
  /// switching back re-arms it (A and B each deliver, `.readable` only); removed while silenced
  /// (from another thread, during a run in C) it leaves nothing behind, and a second source on
  /// the same descriptor registers and hears it.
  @Test func aSourceInTwoModesIsSilencedAndReArmedAndRemovedWhileSilenced() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "silence and re-arm") {
      () throws -> [String] in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      var problems: [String] = []
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let counter = R10PassCounter()
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: modeC)
      loop.add(counter.observer, to: modeC)
      let events = Locked<[DescriptorEvents]>([])
      weak var weakCapture: R10Token?
      weak var weakSource: DescriptorSource?
      do {
        let capture = R10Token()
        weakCapture = capture
        let source = DescriptorSource(descriptor: pipe.read) { _, fired in
          withExtendedLifetime(capture) {}
          events.withLock { $0.append(fired) }
          _ = drainDescriptor(pipe.read)
          RunLoopThread.current.stop()
        }
        weakSource = source
        try loop.add(source, to: modeA)
        try loop.add(source, to: modeB)
        writeByte(pipe.write)
        var before = counter.passes.current
        _ = loop.run(mode: modeC, until: .now.advanced(by: .milliseconds(100)))
        if counter.passes.current - before > 200 { problems.append("C spun: \(counter.passes.current - before)") }
        if !events.withLock({ $0.isEmpty }) { problems.append("delivered in C") }
        for mode in [modeA, modeB] {
          if mode == modeB { writeByte(pipe.write) }
          let result = loop.run(mode: mode, until: .now.advanced(by: .seconds(5)))
          if result != .stopped { problems.append("\(mode): \(result)") }
          _ = loop.run(mode: modeC, until: .now.advanced(by: .milliseconds(10)))  // silence again
        }
        if events.withLock({ $0 }) != [.readable, .readable] { problems.append("events \(events.withLock { $0 })") }
        // Silenced in C (readable again), then removed from both modes by another thread.
        writeByte(pipe.write)
        let remover = startThread {
          usleep(20_000)
          loop.remove(source, from: modeA)
          loop.remove(source, from: modeB)
        }
        before = counter.passes.current
        _ = loop.run(mode: modeC, until: .now.advanced(by: .milliseconds(100)))
        joinThread(remover)
        _ = loop.run(mode: modeC, until: .now.advanced(by: .milliseconds(10)))  // applied by now
        if counter.passes.current - before > 200 { problems.append("C spun: \(counter.passes.current - before)") }
        let left = Self.registrations(loop)
        if left.byToken != 0 || !left.numbers.isEmpty { problems.append("registration left: \(left)") }
        if !loop.core.modes(of: source).isEmpty { problems.append("still in modes") }
      }
      // A second source on the same descriptor registers (the first one's is gone) and hears it.
      let second = Locked(0)
      let other = DescriptorSource(descriptor: pipe.read) { _, _ in
        second.withLock { $0 += 1 }
        _ = drainDescriptor(pipe.read)
        RunLoopThread.current.stop()
      }
      do {
        try loop.add(other, to: modeA)
      } catch {
        problems.append("second source refused: \(error)")
      }
      if loop.run(mode: modeA, until: .now.advanced(by: .seconds(5))) != .stopped { problems.append("second: no fire") }
      if second.withLock({ $0 }) != 1 { problems.append("second fired \(second.withLock { $0 })") }
      if events.withLock({ $0.count }) != 2 { problems.append("the removed source fired again") }
      other.invalidate()
      keep.invalidate()
      counter.observer.invalidate()
      if weakSource != nil { problems.append("removed source still held") }
      if weakCapture != nil { problems.append("removed source's handler still held") }
      return problems
    }
    #expect(outcome == [])
  }

  /// Paused (as a `ReadinessSequence` consumer with a full buffer pauses it), the registration
  /// stays silent across mode switches, resumes on request, and invalidated while paused from
  /// another thread it leaves nothing: a second source on the descriptor registers.
  @Test func aPausedSourceStaysSilentAcrossModeSwitchesAndLeavesNothingWhenInvalidated() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "paused") { () throws -> [String] in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      var problems: [String] = []
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let counter = R10PassCounter()
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: .common)
      loop.addModeToCommonModes(modeA)
      loop.addModeToCommonModes(modeC)
      loop.add(counter.observer, to: .common)
      let fires = AtomicCounter()
      let source = DescriptorSource(descriptor: pipe.read) { _, _ in
        fires.increment()
        RunLoopThread.current.stop()
      }
      try loop.add(source, to: modeA)
      try loop.add(source, to: .default)
      loop.core.setPaused(source, true)
      writeByte(pipe.write)  // readable from now on (nobody drains it)
      for mode in [modeA, modeC, .default, modeA] {
        let before = counter.passes.current
        _ = loop.run(mode: mode, until: .now.advanced(by: .milliseconds(40)))
        if counter.passes.current - before > 200 { problems.append("\(mode) spun: \(counter.passes.current - before)") }
      }
      if fires.current != 0 { problems.append("a paused source fired \(fires.current) times") }
      loop.core.setPaused(source, false)
      if loop.run(mode: modeA, until: .now.advanced(by: .seconds(5))) != .stopped {
        problems.append("no fire on resume")
      }
      if fires.current != 1 { problems.append("fired \(fires.current) times after resume") }
      // Silenced in C (a mode switch), then paused there, then resumed in C: still silent in C.
      _ = loop.run(mode: modeC, until: .now.advanced(by: .milliseconds(20)))
      loop.core.setPaused(source, true)
      loop.core.setPaused(source, false)  // re-armed although C does not hold it
      let before = counter.passes.current
      _ = loop.run(mode: modeC, until: .now.advanced(by: .milliseconds(40)))
      if counter.passes.current - before > 200 {
        problems.append("C spun after resume: \(counter.passes.current - before)")
      }
      if fires.current != 1 { problems.append("fired in C") }
      loop.core.setPaused(source, true)
      let invalidator = startThread { source.invalidate() }
      joinThread(invalidator)
      _ = loop.run(mode: modeA, until: .now.advanced(by: .milliseconds(20)))
      let left = Self.registrations(loop)
      if left.byToken != 0 || !left.numbers.isEmpty { problems.append("registration left: \(left)") }
      let other = DescriptorSource(descriptor: pipe.read) { _, _ in
        _ = drainDescriptor(pipe.read)
        RunLoopThread.current.stop()
      }
      do {
        try loop.add(other, to: modeA)
      } catch {
        problems.append("second source refused: \(error)")
      }
      if loop.run(mode: modeA, until: .now.advanced(by: .seconds(5))) != .stopped { problems.append("second: no fire") }
      if fires.current != 1 { problems.append("the invalidated source fired") }
      other.invalidate()
      keep.invalidate()
      counter.observer.invalidate()
      return problems
    }
    #expect(outcome == [])
  }

  /// The documented `EEXIST`: a second source on a descriptor that a silenced (or paused) source
  /// of this loop still holds is refused; once that source is removed it is accepted.
  @Test func aSecondSourceOnAHeldDescriptorIsRefusedUntilTheFirstIsRemoved() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "second source") {
      () throws -> [String] in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      var problems: [String] = []
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: modeC)
      let first = DescriptorSource(descriptor: pipe.read) { _, _ in }
      try loop.add(first, to: modeA)
      func secondIsRefused() -> Bool {
        let second = DescriptorSource(descriptor: pipe.read) { _, _ in }
        defer { second.invalidate() }
        do {
          try loop.add(second, to: modeB)
          return false
        } catch {
          return error.errno == EEXIST
        }
      }
      if !secondIsRefused() { problems.append("accepted while the first is armed") }
      writeByte(pipe.write)
      _ = loop.run(mode: modeC, until: .now.advanced(by: .milliseconds(20)))  // silences the first
      if !secondIsRefused() { problems.append("accepted while the first is silenced") }
      loop.core.setPaused(first, true)
      if !secondIsRefused() { problems.append("accepted while the first is paused") }
      loop.remove(first, from: modeA)
      if secondIsRefused() { problems.append("refused after the first was removed") }
      let left = Self.registrations(loop)
      if left.byToken != 0 || !left.numbers.isEmpty { problems.append("registration left: \(left)") }
      first.invalidate()
      keep.invalidate()
      return problems
    }
    #expect(outcome == [])
  }

  /// Silenced, then its descriptor closed and the number reused for another pipe: a new source
  /// on the number is accepted and hears the new pipe; the old one never fires again (re-arming
  /// it would report the new file), and nothing spins.
  @Test func aSilencedSourceWhoseNumberIsReusedNeverHearsTheNewFile() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "reused number") {
      () throws -> [String] in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      var problems: [String] = []
      let counter = R10PassCounter()
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: .common)
      loop.addModeToCommonModes(modeA)
      loop.addModeToCommonModes(modeC)
      loop.add(counter.observer, to: .common)
      let old = makePipe()
      let number = old.read
      let oldFires = AtomicCounter()
      let oldSource = DescriptorSource(descriptor: number) { _, _ in oldFires.increment() }
      try loop.add(oldSource, to: modeA)
      writeByte(old.write)
      _ = loop.run(mode: modeC, until: .now.advanced(by: .milliseconds(20)))  // silenced
      // Closed and reused in one step (dup2 onto the number): between a `close` and a new pipe,
      // a test running alongside could take the number, and then close it under this one.
      let fresh = makePipe()
      precondition(dup2(fresh.read, number) == number)
      close(fresh.read)
      close(old.write)
      let newFires = AtomicCounter()
      let newSource = DescriptorSource(descriptor: number) { _, _ in
        newFires.increment()
        _ = drainDescriptor(number)
        RunLoopThread.current.stop()
      }
      do {
        try loop.add(newSource, to: modeA)
      } catch {
        problems.append("the new source was refused: \(error)")
      }
      writeByte(fresh.write)
      if loop.run(mode: modeA, until: .now.advanced(by: .seconds(5))) != .stopped { problems.append("new: no fire") }
      writeByte(fresh.write)
      let before = counter.passes.current
      _ = loop.run(mode: modeC, until: .now.advanced(by: .milliseconds(30)))
      if loop.run(mode: modeA, until: .now.advanced(by: .seconds(5))) != .stopped {
        problems.append("new: no 2nd fire")
      }
      if counter.passes.current - before > 200 { problems.append("spun: \(counter.passes.current - before)") }
      if oldFires.current != 0 { problems.append("the old source fired \(oldFires.current) times") }
      if newFires.current != 2 { problems.append("the new source fired \(newFires.current) times") }
      oldSource.invalidate()
      newSource.invalidate()
      _ = loop.run(mode: modeA, until: .now.advanced(by: .milliseconds(10)))
      let left = Self.registrations(loop)
      if left.byToken != 0 || !left.numbers.isEmpty { problems.append("registration left: \(left)") }
      keep.invalidate()
      counter.observer.invalidate()
      close(number)
      close(fresh.write)
      return problems
    }
    #expect(outcome == [])
  }
}

@Suite("ReviewRound10: the 32-bit common order", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound10CommonOrderTests {
  /// Observers of equal order in `.common` are told, in a mode that joins the common set later,
  /// in the order they were added to `.common`, across two wraps of the 32-bit count: one left
  /// `.common` and came back (last), one was removed from `.default` by name only (kept), one
  /// left `.common` for good; timers due together fire in that order too.
  @Test func modesJoiningTheCommonSetLaterKeepTheOrderAcrossTwoWraps() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "common order") {
      () -> (first: [String], second: [String], timers: [String]) in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      let log = Locked<[String]>([])
      let observers = (0..<11).map { index in
        LoopObserver(activities: .entry) { _, _ in log.withLock { $0.append("o\(index)") } }
      }
      let timerLog = Locked<[String]>([])
      // Due after the two short runs below (which must not fire them): the run in B fires them.
      // (Scaled: under a sanitizer the setup alone can take longer than 300 ms.)
      let due = LoopClock.Instant.now.advanced(by: .milliseconds(300) * watchdogScale)
      let timers = (0..<11).map { index in
        LoopTimer(fireAt: due, repeatingEvery: .seconds(3600)) { _ in timerLog.withLock { $0.append("t\(index)") } }
      }
      let modeTable = loop.core.modeTable
      modeTable.setCommonOrderCountForTesting(UInt32.max - 3)
      for index in 0..<8 {
        loop.add(observers[index], to: .common)
        loop.add(timers[index], to: .common)
      }
      loop.remove(observers[1], from: .common)
      loop.remove(timers[1], from: .common)
      loop.remove(observers[2], from: .default)  // by name: still in the common set
      loop.remove(timers[2], from: .default)
      loop.remove(observers[5], from: .common)  // for good
      loop.remove(timers[5], from: .common)
      loop.add(observers[1], to: .common)  // back, last
      loop.add(timers[1], to: .common)
      func tellEntry(_ mode: RunLoopMode) -> [String] {
        log.withLock { $0.removeAll() }
        let keep = LoopTimer(after: .seconds(3600)) { _ in }
        loop.add(keep, to: mode)
        _ = loop.run(mode: mode, until: .now.advanced(by: .milliseconds(5)))
        keep.invalidate()
        return log.withLock { $0 }
      }
      loop.addModeToCommonModes(modeA)
      let first = tellEntry(modeA)
      // As if 2^32 more adds had happened: the next adds wrap again.
      modeTable.setCommonOrderCountForTesting(UInt32.max - 1)
      for index in 8..<11 {
        loop.add(observers[index], to: .common)
        loop.add(timers[index], to: .common)
      }
      loop.addModeToCommonModes(modeB)
      let second = tellEntry(modeB)
      // Only B runs the timers (out of default and A by name; B holds them through the set).
      for timer in timers {
        loop.remove(timer, from: .default)
        loop.remove(timer, from: modeA)
      }
      timerLog.withLock { $0.removeAll() }
      _ = loop.run(mode: modeB, until: due.advanced(by: .milliseconds(50)))
      for member in observers { member.invalidate() }
      for timer in timers { timer.invalidate() }
      return (first, second, timerLog.withLock { $0 })
    }
    #expect(outcome?.first == ["o0", "o2", "o3", "o4", "o6", "o7", "o1"])
    #expect(outcome?.second == ["o0", "o2", "o3", "o4", "o6", "o7", "o1", "o8", "o9", "o10"])
    #expect(outcome?.timers == ["t0", "t2", "t3", "t4", "t6", "t7", "t1", "t8", "t9", "t10"])
  }

  /// Many members of every kind in `.common` with the count at its wrap: the renumbering keeps
  /// every one of them in the set (each still leaves only by a removal of `.common`).
  @Test func theRenumberingKeepsEveryCommonMemberOnTheLoop() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "renumbering") { () -> [String] in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      var problems: [String] = []
      let pairs = PairLog()
      let sources = (0..<50).map { _ in
        InputSource(schedule: { _, loop, _ in pairs.schedule(loop) }, cancel: { _, loop in pairs.cancel(loop) }) { _ in
        }
      }
      let timers = (0..<50).map { _ in makeParkedTimer { _ in } }
      loop.core.modeTable.setCommonOrderCountForTesting(UInt32.max - 60)
      for index in 0..<50 {
        loop.add(sources[index], to: .common)
        loop.add(timers[index], to: .common)
      }
      // Out of .default by name: only the common set keeps them on the loop.
      for index in 0..<50 {
        loop.remove(sources[index], from: .default)
        loop.remove(timers[index], from: .default)
      }
      loop.addModeToCommonModes(modeC)
      for index in 0..<50 {
        if loop.core.modes(of: sources[index]) != [modeC] { problems.append("source \(index)") }
        if loop.core.modes(of: timers[index]) != [modeC] { problems.append("timer \(index)") }
      }
      for index in 0..<50 {
        loop.remove(sources[index], from: .common)
        loop.remove(timers[index], from: .common)
      }
      if loop.core.modeTable.allRecords.count != 0 {
        problems.append("records left: \(loop.core.modeTable.allRecords.count)")
      }
      problems += pairs.unpaired
      for source in sources { source.invalidate() }
      for timer in timers { timer.invalidate() }
      return problems
    }
    #expect(outcome == [])
  }
}

/// A custom source that counts its own schedule and cancel calls (per loop name).
private final class R10CountedSource: Sendable {
  let counts = Locked<[String: (schedule: Int, cancel: Int)]>([:])
  let source: InputSource

  init() {
    let counts = counts
    source = InputSource(
      schedule: { _, loop, _ in counts.withLock { $0[loop.name, default: (0, 0)].schedule += 1 } },
      cancel: { _, loop in counts.withLock { $0[loop.name, default: (0, 0)].cancel += 1 } }
    ) { _ in }
  }

  /// The loops where this source's schedules and cancels do not pair up (`open` loops may hold
  /// it still: one schedule more than cancels there).
  func unpaired(open: Set<String> = []) -> [String] {
    counts.withLock { counts in
      counts.compactMap { loop, pair in
        let expected = open.contains(loop) ? 1 : 0
        return pair.schedule - pair.cancel == expected && pair.schedule - pair.cancel >= 0
          ? nil : "\(loop): schedule \(pair.schedule), cancel \(pair.cancel)"
      }
    }
  }
}

/// A small deterministic generator (each thread its own).
private struct R10Random {
  var state: UInt64
  mutating func next(_ bound: Int) -> Int {
    state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
    return Int((state >> 33) % UInt64(bound))
  }
}

@Suite("ReviewRound10: cross-thread changes as values", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound10CrossThreadTests {
  /// Four threads add, remove, invalidate and reschedule their own members while the loop's own
  /// timer runs the loop nested in another mode from its callout; after each batch of a thread's
  /// calls, a `performAndWait` from that thread sees exactly the modes its calls left. At the
  /// end every source's schedules and cancels pair up and every member is released.
  @Test func aThreadsChangesAreAllAppliedBeforeItsPerformAndWait() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "ordered changes") {
      () throws -> (problems: [String], released: Bool) in
      let loop = try RunLoopThread(name: "r10-order")
      defer { loop.shutdownAndWait() }
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: modeC)
      let churner = LoopTimer(after: .milliseconds(1), repeatingEvery: .milliseconds(1)) { _ in
        _ = RunLoopThread.current.run(mode: modeC, for: .milliseconds(1))
      }
      loop.add(churner, to: .default)
      loop.add(churner, to: modeA)
      let problems = Locked<[String]>([])
      let weakMembers = Locked<[() -> Bool]>([])  // true while the member is alive
      let modes: [RunLoopMode] = [modeA, modeB, .default]
      let threads = (0..<4).map { thread in
        startThread {
          var random = R10Random(state: UInt64(thread + 1) &* 0x9E37_79B9)
          var sources = (0..<5).map { _ in R10CountedSource() }
          var timers = (0..<4).map { _ in makeParkedTimer { _ in } }
          var sourceModes = [Set<RunLoopMode>](repeating: [], count: 5)
          var timerModes = [Set<RunLoopMode>](repeating: [], count: 4)
          var retired: [R10CountedSource] = []
          func watch(_ object: AnyObject) {
            weak let weakObject = object
            let probe: () -> Bool = { weakObject != nil }
            weakMembers.withLock { $0.append(probe) }
          }
          for source in sources { watch(source.source) }
          for timer in timers { watch(timer) }
          _ = repeatRounds(150, budget: .milliseconds(800)) { round in
            for _ in 0..<20 {
              let mode = modes[random.next(3)]
              if random.next(2) == 0 {
                let index = random.next(5)
                switch random.next(7) {
                case 0, 1, 2:
                  loop.add(sources[index].source, to: mode)
                  sourceModes[index].insert(mode)
                case 3, 4, 5:
                  loop.remove(sources[index].source, from: mode)
                  sourceModes[index].remove(mode)
                default:
                  sources[index].source.invalidate()
                  retired.append(sources[index])
                  sources[index] = R10CountedSource()
                  watch(sources[index].source)
                  sourceModes[index] = []
                }
              } else {
                let index = random.next(4)
                switch random.next(8) {
                case 0, 1, 2:
                  loop.add(timers[index], to: mode)
                  timerModes[index].insert(mode)
                case 3, 4:
                  loop.remove(timers[index], from: mode)
                  timerModes[index].remove(mode)
                case 5, 6:
                  timers[index].setFireDate(random.next(2) == 0 ? .now : .now.advanced(by: .seconds(3600)))
                default:
                  timers[index].invalidate()
                  timers[index] = makeParkedTimer { _ in }
                  watch(timers[index])
                  timerModes[index] = []
                }
              }
            }
            let expectedSources = sourceModes
            let expectedTimers = timerModes
            let currentSources = sources.map(\.source)
            let currentTimers = timers
            let seen = try? loop.performAndWait { () -> [String] in
              var wrong: [String] = []
              for (index, source) in currentSources.enumerated()
              where Set(loop.core.modes(of: source)) != expectedSources[index] {
                wrong.append("thread \(thread) round \(round) source \(index): \(loop.core.modes(of: source))")
              }
              for (index, timer) in currentTimers.enumerated()
              where Set(loop.core.modes(of: timer)) != expectedTimers[index] {
                wrong.append("thread \(thread) round \(round) timer \(index): \(loop.core.modes(of: timer))")
              }
              return wrong
            }
            problems.withLock { $0 += seen ?? ["thread \(thread): performAndWait refused"] }
          }
          for source in sources { source.source.invalidate() }
          for timer in timers { timer.invalidate() }
          _ = try? loop.performAndWait {}
          for source in sources + retired {
            let unpaired = source.unpaired()
            if !unpaired.isEmpty { problems.withLock { $0.append("thread \(thread) source: \(unpaired)") } }
          }
        }
      }
      for thread in threads { joinThread(thread) }
      let records = try loop.performAndWait { loop.core.modeTable.allRecords.count }
      if records != 2 { problems.withLock { $0.append("records left: \(records) (2 expected)") } }
      churner.invalidate()
      keep.invalidate()
      try loop.performAndWait {}
      let alive = weakMembers.withLock { $0.filter { $0() }.count }
      return (problems.withLock { $0 }, alive == 0)
    }
    #expect(outcome?.problems == [])
    #expect(outcome?.released == true, "removed or invalidated members are still held")
  }

  /// Stale adds: sources move A→B→A between two loops as fast as the calls go, some invalidated
  /// right after the last add. Each loop schedules and cancels each source in pairs; in the end
  /// the valid ones are in loop one's mode A only, and loop two holds nothing.
  @Test func sourcesMovedBetweenLoopsQuicklyPairTheirRoutinesOnEachLoop() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "stale adds") { () throws -> [String] in
      let one = try RunLoopThread(name: "r10-one")
      let two = try RunLoopThread(name: "r10-two")
      defer {
        one.shutdownAndWait()
        two.shutdownAndWait()
      }
      let problems = Locked<[String]>([])
      let kept = Locked<[R10CountedSource]>([])
      let threads = (0..<3).map { thread in
        startThread {
          var random = R10Random(state: UInt64(thread + 11))
          var all: [R10CountedSource] = []
          var valid: [R10CountedSource] = []
          _ = repeatRounds(300, budget: .milliseconds(600)) { _ in
            let source = R10CountedSource()
            all.append(source)
            one.add(source.source, to: modeA)
            one.remove(source.source, from: modeA)
            two.add(source.source, to: modeB)
            two.remove(source.source, from: modeB)
            one.add(source.source, to: modeA)
            if random.next(3) == 0 {
              source.source.invalidate()
            } else {
              valid.append(source)
            }
          }
          _ = try? one.performAndWait {}
          _ = try? two.performAndWait {}
          for source in all {
            let isValid = source.source.isValid
            let unpaired = source.unpaired(open: isValid ? ["r10-one"] : [])
            if !unpaired.isEmpty { problems.withLock { $0.append("thread \(thread): \(unpaired)") } }
          }
          kept.withLock { $0 += valid }
        }
      }
      for thread in threads { joinThread(thread) }
      let valid = kept.withLock { $0 }
      let onOne = try one.performAndWait { () -> (records: Int, wrong: Int) in
        (one.core.modeTable.allRecords.count, valid.filter { one.core.modes(of: $0.source) != [modeA] }.count)
      }
      let onTwo = try two.performAndWait { two.core.modeTable.allRecords.count }
      var result = problems.withLock { $0 }
      if onOne.records != valid.count { result.append("loop one holds \(onOne.records), \(valid.count) valid") }
      if onOne.wrong != 0 { result.append("\(onOne.wrong) valid sources not in A only") }
      if onTwo != 0 { result.append("loop two holds \(onTwo)") }
      for source in valid { source.source.invalidate() }
      try one.performAndWait {}
      for source in valid where !source.unpaired().isEmpty { result.append("after invalidation: \(source.unpaired())") }
      return result
    }
    #expect(outcome == [])
  }

  /// Shutdown races threads that add, remove, invalidate and reschedule members of every kind
  /// (a descriptor source too): no crash, no hang, every schedule gets exactly one cancel, and
  /// once the threads let go of them every member is released.
  @Test func shutdownRacingChangesLosesNoCancelAndLeaksNothing() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "shutdown race") {
      () throws -> (problems: [String], alive: Int) in
      var problems: [String] = []
      var alive = 0
      for round in 0..<6 {
        let loop = try RunLoopThread(name: "r10-race")
        let counted = Locked<[R10CountedSource]>([])
        let probes = Locked<[() -> Bool]>([])
        let done = Locked(false)
        let pipe = makePipe()
        let churner = LoopTimer(after: .milliseconds(1), repeatingEvery: .milliseconds(1)) { _ in
          _ = RunLoopThread.current.run(mode: modeC, for: .milliseconds(1))
        }
        loop.add(churner, to: .default)
        loop.add(churner, to: modeC)
        let workers = (0..<3).map { thread in
          startThread {
            var random = R10Random(state: UInt64(round * 7 + thread + 1))
            var step = 0
            // Until a while after the shutdown (and at least 100 steps, at most 5,000).
            while step < 5_000 && (step < 100 || !done.withLock({ $0 })) {
              step += 1
              let mode: RunLoopMode = [modeA, .default, .common][random.next(3)]
              switch random.next(4) {
              case 0:
                let source = R10CountedSource()
                counted.withLock { $0.append(source) }
                loop.add(source.source, to: mode)
                if random.next(2) == 0 { loop.remove(source.source, from: mode) }
                if random.next(2) == 0 { source.source.invalidate() }
              case 1:
                let timer = LoopTimer(after: .microseconds(random.next(500)), repeatingEvery: .milliseconds(1)) { _ in }
                weak let weakTimer = timer
                probes.withLock { $0.append { weakTimer != nil } }
                loop.add(timer, to: mode)
                loop.add(timer, to: modeC)
                timer.setFireDate(.now)
                if random.next(2) == 0 { loop.remove(timer, from: mode) }
                if random.next(2) == 0 { timer.invalidate() }
              case 2:
                let observer = LoopObserver(activities: .all) { _, _ in }
                weak let weakObserver = observer
                probes.withLock { $0.append { weakObserver != nil } }
                loop.add(observer, to: mode)
                if random.next(2) == 0 { observer.invalidate() }
              default:
                let source = DescriptorSource(descriptor: pipe.read) { _, _ in }
                weak let weakSource = source
                probes.withLock { $0.append { weakSource != nil } }
                try? loop.add(source, to: mode)
                if random.next(2) == 0 { source.invalidate() }
              }
              if step % 50 == 49 { sched_yield() }
            }
          }
        }
        usleep(UInt32(1_000 + round * 1_000))
        loop.shutdown()
        usleep(2_000)
        done.withLock { $0 = true }
        for worker in workers { joinThread(worker) }
        loop.shutdownAndWait()
        close(pipe.read)
        close(pipe.write)
        for source in counted.withLock({ $0 }) {
          // Shut down: no loop holds any source any more (one removed from its last mode before
          // the shutdown stays valid, on no loop).
          let unpaired = source.unpaired()
          if !unpaired.isEmpty { problems.append("round \(round): \(unpaired)") }
          if source.source.isValid && source.source.boundLoop != nil {
            problems.append("round \(round): a source is still on the shut-down loop")
          }
        }
        churner.invalidate()
        alive += probes.withLock { $0.filter { $0() }.count }
      }
      return (problems, alive)
    }
    #expect(outcome?.problems == [])
    #expect(outcome?.alive == 0, "members still held after the loop shut down")
  }
}

@Suite("ReviewRound10: members released once they leave", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound10ReleaseTests {
  /// Members of every kind in several modes and `.common`, removed by name and by `.common` in
  /// every order: once out of their last mode name, the loop holds none of them (nor their
  /// closures), and they are in no mode.
  @Test func membersInSeveralModesAreReleasedOnceRemovedFromTheirLastModeName() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "release") { () throws -> [String] in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      var problems: [String] = []
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let names: [[RunLoopMode]] = [
        [modeA, modeB, .common], [.common, modeA, modeB], [modeB, .common, modeA], [.common, .default, modeA, modeB],
      ]
      loop.addModeToCommonModes(modeC)
      for (round, order) in names.enumerated() {
        weak var weakTimer: LoopTimer?
        weak var weakObserver: LoopObserver?
        weak var weakSource: DescriptorSource?
        weak var weakInput: InputSource?
        weak var weakCapture: R10Token?
        do {
          let capture = R10Token()
          weakCapture = capture
          let timer = makeParkedTimer { _ in withExtendedLifetime(capture) {} }
          let observer = LoopObserver(activities: .all) { _, _ in withExtendedLifetime(capture) {} }
          let source = DescriptorSource(descriptor: pipe.read) { _, _ in withExtendedLifetime(capture) {} }
          let input = InputSource { _ in withExtendedLifetime(capture) {} }
          (weakTimer, weakObserver, weakSource, weakInput) = (timer, observer, source, input)
          for mode in names[0] {
            loop.add(timer, to: mode)
            loop.add(observer, to: mode)
            try loop.add(source, to: mode)
            loop.add(input, to: mode)
          }
          timer.setFireDate(.now)
          writeByte(pipe.write)
          input.signal()
          for mode in [modeA, modeB, modeC, RunLoopMode.default] {
            _ = loop.run(mode: mode, until: .now.advanced(by: .milliseconds(5)))
          }
          _ = drainDescriptor(pipe.read)
          for mode in order {
            loop.remove(timer, from: mode)
            loop.remove(observer, from: mode)
            loop.remove(source, from: mode)
            loop.remove(input, from: mode)
          }
          if !loop.core.modes(of: timer).isEmpty || !loop.core.modes(of: observer).isEmpty
            || !loop.core.modes(of: source).isEmpty || !loop.core.modes(of: input).isEmpty
          {
            problems.append("round \(round): still in modes")
          }
          if loop.core.modeTable.allRecords.count != 0 { problems.append("round \(round): records left") }
        }
        let alive = [weakTimer != nil, weakObserver != nil, weakSource != nil, weakInput != nil]
        if alive.contains(true) { problems.append("round \(round): members still held \(alive)") }
        if weakCapture != nil { problems.append("round \(round): a closure is still held") }
      }
      return problems
    }
    #expect(outcome == [])
  }

  /// The loop shuts down from a timer's callout while a run nested in it has parked the timer's
  /// extra entries (the first mode removed): the drain detaches it without a crash and releases
  /// it.
  @Test func shutdownFromACalloutWithParkedExtraEntriesReleasesTheTimer() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "shutdown in callout") {
      () throws -> (fires: Int, released: Bool) in
      let fires = AtomicCounter()
      weak var weakTimer: LoopTimer?
      do {
        let loop = try RunLoopThread(name: "r10-shutdown-callout")
        let calloutDone = TestGate()
        let timer = makeParkedTimer { _ in
          fires.increment()
          let current = RunLoopThread.current
          _ = current.run(mode: modeC, until: .now.advanced(by: .milliseconds(10)))
          current.shutdown()
          _ = current.run(mode: modeB, until: .now.advanced(by: .milliseconds(10)))
          calloutDone.open()
        }
        weakTimer = timer
        for mode in [modeA, modeB, modeC, RunLoopMode.default] { loop.add(timer, to: mode) }
        loop.remove(timer, from: modeA)
        let keep = LoopTimer(after: .seconds(3600)) { _ in }
        loop.add(keep, to: modeC)
        timer.setFireDate(.now)
        _ = calloutDone.wait(timeout: .seconds(10))
        loop.shutdownAndWait()
        keep.invalidate()
      }
      return (fires.current, weakTimer == nil)
    }
    #expect(outcome?.fires == 1)
    #expect(outcome?.released == true)
  }
}
