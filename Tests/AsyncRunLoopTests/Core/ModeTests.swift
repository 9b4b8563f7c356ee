import Glibc
import Testing

@testable import AsyncRunLoop

/// Modes (SPEC §2) and the ways a run ends (SPEC §6). Each test runs `RunLoopThread.current` on a
/// thread of its own, since a loop that owns its thread never finishes (it serves as an executor).
@Suite("Modes and run results")
struct ModeTests {
  static let modal: RunLoopMode = "modal"

  /// A timer far in the future: gives a mode something to watch without ever firing.
  static func keepAlive() -> LoopTimer { LoopTimer(after: .seconds(3_600)) { _ in } }

  /// An input source that counts its performs, added to `loop`'s default mode and signalled once.
  static func signalledCountingSource(on loop: RunLoopThread) -> (source: InputSource, performed: Locked<Int>) {
    let performed = Locked(0)
    let source = InputSource { _ in performed.withLock { $0 += 1 } }
    loop.add(source, to: .default)
    source.signal()
    return (source, performed)
  }

  @Test func runningAnEmptyModeFinishesAtOnceWithoutEntryOrExit() {
    let (results, log) = EngineTestThread.run { () -> ([RunLoopRunResult], [String]) in
      let loop = RunLoopThread.current
      let log = EngineEventLog()
      // Observers do not count as something to watch.
      loop.add(LoopObserver(activities: .all) { _, activity in log("\(activity)") }, to: "empty")
      // Members of other modes do not count either.
      loop.add(Self.keepAlive(), to: .default)
      let limited = loop.run(mode: "empty", until: .now.advanced(by: .seconds(60)))
      let unlimited = loop.run(mode: "empty")
      let returnAfterSource = loop.run(mode: "empty", until: .distantFuture, returnAfterSourceHandled: true)
      return ([limited, unlimited, returnAfterSource], log.entries)
    }
    #expect(results == [.finished, .finished, .finished])
    #expect(log.isEmpty)
  }

  @Test func timersAndSourcesFireOnlyInTheirModes() {
    let log = EngineTestThread.run { () -> [String] in
      let loop = RunLoopThread.current
      let note = EngineEventLog()
      let defaultSource = InputSource { _ in note("default source") }
      let modalSource = InputSource { _ in note("modal source") }
      loop.add(defaultSource, to: .default)
      loop.add(modalSource, to: Self.modal)
      loop.add(LoopTimer(after: .zero) { _ in note("default timer") }, to: .default)
      loop.add(LoopTimer(after: .zero) { _ in note("modal timer") }, to: Self.modal)
      defaultSource.signal()
      modalSource.signal()

      note("\(loop.run(mode: .default, until: .now.advanced(by: .milliseconds(30))))")
      note("\(loop.run(mode: Self.modal, until: .now.advanced(by: .milliseconds(30))))")
      note("\(loop.run(mode: .default, until: .now.advanced(by: .milliseconds(10))))")
      defaultSource.invalidate()
      modalSource.invalidate()
      return note.entries
    }
    // Sources fire at step 4, timers at step 9; nothing of the other mode fires in between.
    #expect(
      log == ["default source", "default timer", "timedOut", "modal source", "modal timer", "timedOut", "timedOut"])
  }

  @Test func commonItemsJoinModesAddedToTheCommonSetLater() {
    let log = EngineTestThread.run { () -> [String] in
      let loop = RunLoopThread.current
      let note = EngineEventLog()
      let custom: RunLoopMode = "custom"
      let source = InputSource(cancel: { _, _ in note("cancel") }, perform: { _ in note("source") })
      let timer = LoopTimer(after: .zero) { _ in note("timer") }
      loop.add(source, to: .common)
      loop.add(timer, to: .common)
      source.signal()

      // Not in the common set yet: the custom mode holds nothing.
      note("\(loop.run(mode: custom, until: .now.advanced(by: .seconds(60))))")
      note("common: \(loop.commonModes.map(\.rawValue).sorted())")
      loop.addModeToCommonModes(custom)
      note("common: \(loop.commonModes.map(\.rawValue).sorted())")
      // Now the source and timer that were added to .common earlier are in it.
      note("\(loop.run(mode: custom, until: .now.advanced(by: .milliseconds(20))))")

      // Items added to .common afterwards go to every common mode, the new one included.
      let late = InputSource { _ in note("late source") }
      loop.add(late, to: .common)
      late.signal()
      note("\(loop.run(mode: custom, until: .now.advanced(by: .milliseconds(20))))")

      // Removing from .common removes from every common mode: cancel runs once.
      loop.remove(source, from: .common)
      note("memberships: \(loop.core.modeCount(of: source))")
      loop.remove(late, from: .common)
      note("\(loop.run(mode: custom, until: .now.advanced(by: .seconds(60))))")
      return note.entries
    }
    #expect(
      log == [
        "finished", "common: [\"kCFRunLoopDefaultMode\"]", "common: [\"custom\", \"kCFRunLoopDefaultMode\"]", "source",
        "timer", "timedOut",
        "late source", "timedOut", "cancel", "memberships: 0", "finished",
      ])
  }

  /// Records keep 32 bits of the count of adds to `.common`: when it would wrap, the loop
  /// renumbers the common members instead of trapping or losing their order, which a mode joining
  /// the common set later still receives them in (timers due at the same time fire in that order).
  @Test func theCommonOrderSurvivesTheCountWrapping() {
    let log = EngineTestThread.run { () -> [String] in
      let loop = RunLoopThread.current
      let note = EngineEventLog()
      loop.core.modeTable.setCommonOrderCountForTesting(UInt32.max - 2)
      let due = LoopClock.Instant.now
      let timers = (0..<6).map { index in LoopTimer(fireAt: due) { _ in note("timer \(index)") } }
      for (index, timer) in timers.enumerated() {
        loop.add(timer, to: .common)
        if index == 3 { loop.remove(timers[1], from: .common) }  // one leaves before the wrap
      }
      let custom: RunLoopMode = "custom"
      loop.addModeToCommonModes(custom)
      // Only the custom mode runs them: the order comes from the common set, not from .default.
      for timer in timers { loop.remove(timer, from: .default) }
      _ = loop.run(mode: custom, until: .now.advanced(by: .milliseconds(50)))
      for timer in timers { timer.invalidate() }
      return note.entries
    }
    #expect(log == ["timer 0", "timer 2", "timer 3", "timer 4", "timer 5"])
  }

  @Test func addingDefaultOrCommonToTheCommonSetChangesNothing() {
    let modes = EngineTestThread.run { () -> Set<RunLoopMode> in
      let loop = RunLoopThread.current
      loop.addModeToCommonModes(.default)
      loop.addModeToCommonModes(.common)
      loop.addModeToCommonModes(Self.modal)
      loop.addModeToCommonModes(Self.modal)
      return loop.commonModes
    }
    #expect(modes == [.default, Self.modal])
  }

  @Test func nestedRunInAnotherModeFromAHandlerThenTheOuterRunResumes() {
    let (outer, log) = EngineTestThread.run { () -> (RunLoopRunResult, [String]) in
      let loop = RunLoopThread.current
      let note = EngineEventLog()
      loop.add(LoopObserver(activities: [.entry, .exit]) { _, activity in note("default \(activity)") }, to: .default)
      loop.add(LoopObserver(activities: [.entry, .exit]) { _, activity in note("modal \(activity)") }, to: Self.modal)
      let trigger = InputSource { _ in
        note("outer source")
        // Due during the nested run, but it belongs to the outer mode: it waits for the outer run.
        loop.add(
          LoopTimer(after: .milliseconds(1)) { _ in
            note("default timer")
            loop.stop()
          }, to: .default)
        loop.add(
          LoopTimer(after: .milliseconds(20)) { _ in
            note("modal timer")
            loop.stop()  // stops the innermost run: the nested one
          }, to: Self.modal)
        let nested = loop.run(mode: Self.modal, until: .now.advanced(by: .seconds(60)))
        note("nested returned \(nested)")
      }
      loop.add(trigger, to: .default)
      trigger.signal()
      let outer = loop.run(mode: .default, until: .now.advanced(by: .seconds(60)))
      trigger.invalidate()
      return (outer, note.entries)
    }
    #expect(outer == .stopped)
    #expect(
      log == [
        "default entry", "outer source", "modal entry", "modal timer", "modal exit", "nested returned stopped",
        "default timer", "default exit",
      ])
  }

  @Test func stopBeforeRunIsRememberedByTheNextRun() {
    let results = EngineTestThread.run { () -> [RunLoopRunResult] in
      let loop = RunLoopThread.current
      loop.add(Self.keepAlive(), to: .default)
      loop.stop()
      let first = loop.run(mode: .default, until: .now.advanced(by: .seconds(60)))
      // The stop was consumed: the next run goes on to its limit.
      let second = loop.run(mode: .default, until: .now.advanced(by: .milliseconds(10)))
      return [first, second]
    }
    #expect(results == [.stopped, .timedOut])
  }

  @Test func stopFromAnotherThreadWhileTheLoopIsNotRunningIsRemembered() {
    let published = Locked<RunLoopThread?>(nil)
    let go = Locked(false)
    let result = Locked<RunLoopRunResult?>(nil)
    let thread = EngineTestThread.start {
      let loop = RunLoopThread.current
      loop.add(Self.keepAlive(), to: .default)
      published.withLock { $0 = loop }
      while !go.withLock({ $0 }) { usleep(1_000) }
      let outcome = loop.run(mode: .default, until: .now.advanced(by: .seconds(60)))
      result.withLock { $0 = outcome }
    }
    waitUntil("the loop to be published") { published.withLock { $0 != nil } }
    published.withLock { $0! }.stop()
    go.withLock { $0 = true }
    thread.join()
    #expect(result.withLock { $0 } == .stopped)
  }

  /// Runs the calling thread's loop until +60 s in a thread of its own with an observer that
  /// counts activities; returns the loop, the counts and the thread.
  static func startSleepingLoop(
    _ result: Locked<RunLoopRunResult?>
  ) -> (Locked<RunLoopThread?>, Locked<[LoopActivity: Int]>, EngineTestThread) {
    let published = Locked<RunLoopThread?>(nil)
    let counts = Locked<[LoopActivity: Int]>([:])
    let thread = EngineTestThread.start {
      let loop = RunLoopThread.current
      loop.add(Self.keepAlive(), to: .default)
      loop.add(LoopObserver(activities: .all) { _, activity in counts.withLock { $0[activity, default: 0] += 1 } })
      published.withLock { $0 = loop }
      let outcome = loop.run(mode: .default, until: .now.advanced(by: .seconds(60)))
      result.withLock { $0 = outcome }
    }
    return (published, counts, thread)
  }

  @Test func stopFromAnotherThreadEndsASleepingRun() {
    let result = Locked<RunLoopRunResult?>(nil)
    let (published, counts, thread) = Self.startSleepingLoop(result)
    waitUntil("the loop to sleep") { counts.withLock { $0[.beforeWaiting, default: 0] >= 1 } }
    published.withLock { $0! }.stop()
    thread.join()
    #expect(result.withLock { $0 } == .stopped)
    #expect(counts.withLock { $0[.afterWaiting] } == 1)
    #expect(counts.withLock { $0[.exit] } == 1)
  }

  @Test func wakeUpFromAnotherThreadMakesAPassWithoutEndingTheRun() {
    let result = Locked<RunLoopRunResult?>(nil)
    let (published, counts, thread) = Self.startSleepingLoop(result)
    waitUntil("the loop to sleep") { counts.withLock { $0[.beforeWaiting, default: 0] >= 1 } }
    let loop = published.withLock { $0! }
    loop.wakeUp()
    // It wakes, goes back to step 2 and sleeps again: the run goes on.
    waitUntil("the loop to wake and sleep again") {
      counts.withLock { $0[.afterWaiting, default: 0] >= 1 && $0[.beforeWaiting, default: 0] >= 2 }
    }
    #expect(result.withLock { $0 } == nil)
    loop.stop()
    thread.join()
    #expect(result.withLock { $0 } == .stopped)
    #expect(counts.withLock { $0[.entry] } == 1)
  }

  @Test func runReturnsTimedOutWhenItsLimitPasses() {
    let (result, elapsed) = EngineTestThread.run { () -> (RunLoopRunResult, Duration) in
      let loop = RunLoopThread.current
      loop.add(Self.keepAlive(), to: .default)
      let start = LoopClock.Instant.now
      let result = loop.run(mode: .default, until: start.advanced(by: .milliseconds(20)))
      return (result, start.duration(to: .now))
    }
    #expect(result == .timedOut)
    #expect(elapsed >= .milliseconds(20))
  }

  @Test func aZeroTimeLimitMakesOnePassAndTimesOut() {
    let (results, performed) = EngineTestThread.run { () -> ([RunLoopRunResult], Int) in
      let loop = RunLoopThread.current
      let (source, performed) = Self.signalledCountingSource(on: loop)
      let now = loop.run(mode: .default, until: .now)
      let past = loop.run(mode: .default, until: LoopClock.Instant(nanoseconds: 0))
      source.invalidate()
      return ([now, past], performed.withLock { $0 })
    }
    #expect(results == [.timedOut, .timedOut])
    #expect(performed == 1)
  }

  @Test func runReturnsHandledSourceAfterAnInputSourceWhenAsked() {
    let (results, performed) = EngineTestThread.run { () -> ([RunLoopRunResult], Int) in
      let loop = RunLoopThread.current
      let (source, performed) = Self.signalledCountingSource(on: loop)
      let asked = loop.run(mode: .default, until: .now.advanced(by: .seconds(60)), returnAfterSourceHandled: true)
      // Without asking, a handled source does not end the run.
      source.signal()
      let notAsked = loop.run(mode: .default, until: .now.advanced(by: .milliseconds(20)))
      source.invalidate()
      return ([asked, notAsked], performed.withLock { $0 })
    }
    #expect(results == [.handledSource, .timedOut])
    #expect(performed == 2)
  }

  @Test func handledSourceIsReportedBeforeAStopAndTheStopIsKept() {
    let results = EngineTestThread.run { () -> [RunLoopRunResult] in
      let loop = RunLoopThread.current
      let source = InputSource { _ in RunLoopThread.current.stop() }
      loop.add(source, to: .default)
      source.signal()
      // CF's order after a pass: handled a source, timed out, stopped, finished.
      let first = loop.run(mode: .default, until: .now.advanced(by: .seconds(60)), returnAfterSourceHandled: true)
      let second = loop.run(mode: .default, until: .now.advanced(by: .seconds(60)))
      source.invalidate()
      return [first, second]
    }
    #expect(results == [.handledSource, .stopped])
  }

  @Test func timersNeverEndARunAsHandledSource() {
    let (result, fires) = EngineTestThread.run { () -> (RunLoopRunResult, Int) in
      let loop = RunLoopThread.current
      let fires = Locked(0)
      let timer = LoopTimer(after: .milliseconds(2), repeatingEvery: .milliseconds(2)) { _ in
        fires.withLock { $0 += 1 }
      }
      loop.add(timer, to: .default)
      let result = loop.run(
        mode: .default, until: .now.advanced(by: .milliseconds(40)), returnAfterSourceHandled: true)
      timer.invalidate()
      return (result, fires.withLock { $0 })
    }
    #expect(result == .timedOut)
    #expect(fires >= 1)
  }

  @Test func runFinishesWhenASourceHandlerEmptiesTheMode() {
    // The pass that empties the mode must not go to sleep: nothing would ever wake it. (A 60 s
    // limit turns that hang into a failure.)
    let result = EngineTestThread.run { () -> RunLoopRunResult in
      let loop = RunLoopThread.current
      let source = InputSource { source in source.invalidate() }
      loop.add(source, to: .default)
      source.signal()
      return loop.run(mode: .default, until: .now.advanced(by: .seconds(60)))
    }
    #expect(result == .finished)
  }

  @Test func runFinishesWhenAPerformedBlockEmptiesTheMode() {
    let result = EngineTestThread.run { () -> RunLoopRunResult in
      let loop = RunLoopThread.current
      let timer = Self.keepAlive()
      loop.add(timer, to: .default)
      loop.perform { timer.invalidate() }
      return loop.run(mode: .default, until: .now.advanced(by: .seconds(60)))
    }
    #expect(result == .finished)
  }

  @Test func runFinishesWhenItsModeEmptiesDuringTheRun() {
    let result = EngineTestThread.run { () -> RunLoopRunResult in
      let loop = RunLoopThread.current
      loop.add(LoopTimer(after: .milliseconds(5)) { _ in }, to: .default)  // one-shot: leaves after firing
      return loop.run(mode: .default, until: .now.advanced(by: .seconds(60)))
    }
    #expect(result == .finished)
  }
}
