import Testing

@testable import AsyncRunLoop

/// Loop observers (SPEC §5) and the exact activity sequence of a run (SPEC §6). Each test runs
/// `RunLoopThread.current` on a thread of its own, so that its runs end (`.finished`).
@Suite("LoopObserver")
struct ObserverTests {
  /// Runs `body` with the calling thread's loop and a log that an observer of every activity
  /// writes to; returns the log.
  static func logActivities(_ body: @escaping @Sendable (RunLoopThread, EngineEventLog) -> Void) -> [String] {
    EngineTestThread.run {
      let loop = RunLoopThread.current
      let log = EngineEventLog()
      let observer = LoopObserver(activities: .all) { _, activity in log("\(activity)") }
      loop.add(observer, to: .default)
      body(loop, log)
      observer.invalidate()
      return log.entries
    }
  }

  @Test func aRunThatSleepsOnceTellsEveryActivityInSpecOrder() {
    let log = Self.logActivities { loop, log in
      loop.add(LoopTimer(after: .milliseconds(20)) { _ in log("timer") }, to: .default)
      log("\(loop.run(mode: .default, until: .now.advanced(by: .seconds(60))))")
    }
    // The one-shot timer leaves the mode when it fires: the run finishes after that pass.
    #expect(
      log == ["entry", "beforeTimers", "beforeSources", "beforeWaiting", "afterWaiting", "timer", "exit", "finished"])
  }

  @Test func everyPassThatSleepsRepeatsStepsTwoToNine() {
    let log = Self.logActivities { loop, log in
      let fires = Locked(0)
      let timer = LoopTimer(after: .milliseconds(5), repeatingEvery: .milliseconds(5)) { timer in
        log("timer")
        if fires.withLock({
          $0 += 1; return $0
        }) == 3 {
          timer.invalidate()
        }
      }
      loop.add(timer, to: .default)
      log("\(loop.run(mode: .default, until: .now.advanced(by: .seconds(60))))")
    }
    let pass = ["beforeTimers", "beforeSources", "beforeWaiting", "afterWaiting", "timer"]
    #expect(log == ["entry"] + pass + pass + pass + ["exit", "finished"])
  }

  @Test func beforeWaitingIsNotSentForAZeroTimeLimit() {
    let log = Self.logActivities { loop, log in
      let source = InputSource { _ in log("source") }
      loop.add(source, to: .default)
      log("\(loop.run(mode: .default, until: .now))")
      source.signal()
      log("\(loop.run(mode: .default, until: LoopClock.Instant(nanoseconds: 0)))")
      source.invalidate()
    }
    #expect(
      log == [
        "entry", "beforeTimers", "beforeSources", "exit", "timedOut",
        "entry", "beforeTimers", "beforeSources", "source", "exit", "timedOut",
      ])
  }

  @Test func aOneShotObserverIsToldOnceAndThenInvalidated() {
    let (count, stillValid) = EngineTestThread.run { () -> (Int, Bool) in
      let loop = RunLoopThread.current
      let count = Locked(0)
      let observer = LoopObserver(activities: [.beforeTimers, .beforeWaiting], repeats: false) { _, _ in
        count.withLock { $0 += 1 }
      }
      loop.add(observer, to: .default)
      let timer = LoopTimer(after: .milliseconds(2), repeatingEvery: .milliseconds(2)) { _ in }
      loop.add(timer, to: .default)
      _ = loop.run(mode: .default, until: .now.advanced(by: .milliseconds(30)))
      timer.invalidate()
      return (count.withLock { $0 }, observer.isValid)
    }
    #expect(count == 1)
    #expect(!stillValid)
  }

  @Test func observersCanRemoveOrInvalidateThemselvesFromTheirCallout() {
    let log = EngineTestThread.run { () -> [String] in
      let loop = RunLoopThread.current
      let log = EngineEventLog()
      let remover = LoopObserver(activities: .beforeTimers, order: 0) { observer, _ in
        log("remover")
        RunLoopThread.current.remove(observer, from: .default)
      }
      let invalidator = LoopObserver(activities: .beforeTimers, order: 1) { observer, _ in
        log("invalidator")
        observer.invalidate()
      }
      let watcher = LoopObserver(activities: .beforeTimers, order: 2) { _, _ in log("watcher") }
      // Added in another order than their orders: lower orders are told first.
      for observer in [watcher, invalidator, remover] { loop.add(observer, to: .default) }
      let fires = Locked(0)
      let timer = LoopTimer(after: .milliseconds(2), repeatingEvery: .milliseconds(2)) { timer in
        if fires.withLock({
          $0 += 1; return $0
        }) == 2 {
          timer.invalidate()
        }
      }
      loop.add(timer, to: .default)
      log("\(loop.run(mode: .default, until: .now.advanced(by: .seconds(60))))")
      watcher.invalidate()
      return log.entries
    }
    // Two passes (the timer fires twice, then leaves): both self-removing observers are told once.
    #expect(log == ["remover", "invalidator", "watcher", "watcher", "finished"])
  }

  @Test func observersAreToldOnTheLoopThreadOnlyInTheirModes() {
    let log = Self.logActivities { loop, log in
      let offThread = Locked(0)
      let modal = LoopObserver(activities: [.entry, .exit]) { _, activity in
        if !loop.isOnLoopThread { offThread.withLock { $0 += 1 } }
        log("modal \(activity)")
      }
      loop.add(modal, to: "modal")
      loop.add(LoopTimer(after: .seconds(3_600)) { _ in }, to: "modal")
      log("\(loop.run(mode: "modal", until: .now))")
      modal.invalidate()
      log("off thread: \(offThread.withLock { $0 })")
    }
    // The default-mode observer of `logActivities` hears nothing of the modal run.
    #expect(log == ["modal entry", "modal exit", "timedOut", "off thread: 0"])
  }

  @Test func activitiesDescribeThemselves() {
    #expect("\(LoopActivity.entry)" == "entry")
    #expect("\(LoopActivity.afterWaiting)" == "afterWaiting")
    #expect("\([LoopActivity.entry, .exit] as LoopActivity)" == "[entry, exit]")
    #expect(
      "\(LoopActivity.all)" == "[entry, beforeTimers, beforeSources, beforeWaiting, afterWaiting, exit]")
  }
}
