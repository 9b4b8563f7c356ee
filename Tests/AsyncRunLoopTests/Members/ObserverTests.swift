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

  /// Observers of many orders (a few shared ones, or nearly every one distinct), added, removed,
  /// invalidated and added again at random: every notification tells exactly the observers in
  /// the mode, lower orders first, equal orders in the order they joined the mode, as a model
  /// sorted by (order, join sequence) says. A callout removes a later observer now and then:
  /// that one is not told in the same notification.
  @Test(arguments: [(seed: UInt64(1), orders: 5), (seed: 2, orders: 5), (seed: 3, orders: 100_000)])
  func observersOfManyOrdersAreToldInOrderAsTheyComeAndGo(seed: UInt64, orders: Int) {
    let wrong = EngineTestThread.run { () -> [String] in
      let loop = RunLoopThread.current
      let mode = RunLoopMode("observer-model")
      loop.add(LoopTimer(after: .seconds(3_600)) { _ in }, to: mode)  // the run has something to wait for
      let told = Locked<[Int]>([])
      let victim = Locked<LoopObserver?>(nil)
      var generator = IndexedTimerHeapTests.SplitMix64(state: seed)
      var observers: [LoopObserver] = []
      var joined: [Int: (order: Int, sequence: Int)] = [:]  // the model: id -> where it sits
      var sequence = 0
      var problems: [String] = []
      for id in 0..<400 {
        let order = Int.random(in: 0..<orders, using: &generator) - orders / 2
        observers.append(
          LoopObserver(activities: .entry, order: order) { _, _ in
            told.withLock { $0.append(id) }
            if let target = victim.withLock({ value -> LoopObserver? in
              defer { value = nil }
              return value
            }) {
              loop.remove(target, from: mode)
            }
          })
      }
      for step in 0..<1_500 {
        let id = Int.random(in: 0..<observers.count, using: &generator)
        let observer = observers[id]
        if joined[id] == nil {
          loop.add(observer, to: mode)
          sequence += 1
          joined[id] = (observer.order, sequence)
        } else {
          loop.remove(observer, from: mode)
          joined[id] = nil
        }
        guard step % 25 == 0 else { continue }
        var expected = joined.sorted { ($0.value.order, $0.value.sequence) < ($1.value.order, $1.value.sequence) }
          .map(\.key)
        // Now and then the first one told removes the last one: it must not be told this time.
        if step % 50 == 0, expected.count >= 2, let last = expected.last {
          victim.withLock { $0 = observers[last] }
          joined[last] = nil
          expected.removeLast()
        }
        told.withLock { $0.removeAll() }
        _ = loop.run(mode: mode, until: .now)
        let got = told.withLock { $0 }
        if got != expected, problems.count < 3 {
          problems.append("step \(step): told \(got.prefix(8))…, expected \(expected.prefix(8))… (\(expected.count))")
        }
      }
      for observer in observers { observer.invalidate() }
      return problems
    }
    #expect(wrong == [])
  }

  @Test func activitiesDescribeThemselves() {
    #expect("\(LoopActivity.entry)" == "entry")
    #expect("\(LoopActivity.afterWaiting)" == "afterWaiting")
    #expect("\([LoopActivity.entry, .exit] as LoopActivity)" == "[entry, exit]")
    #expect(
      "\(LoopActivity.all)" == "[entry, beforeTimers, beforeSources, beforeWaiting, afterWaiting, exit]")
  }
}
