import Glibc
import Testing

@testable import AsyncRunLoop

/// A loop's metrics count exactly what ran on it (issue 27, item 2): N jobs move the job counter
/// by N, and so on, and each latency histogram holds one value per event it measures.
@Suite("Loop metrics count what ran")
struct LoopMetricsCountTests {
  @Test func countersMoveByExactlyTheWorkTheTestProduced() async throws {
    let loop = try RunLoopThread(name: "metrics-counts")
    loop.setMetricsEnabled(true)  // applied before the first block below
    // The pass the switch lands in is not counted, but its sleep is: wait until a pass was counted
    // after a first reading taken once the switch was sent (that reading's pass may be the switch's
    // own), so that every later pass (the readings' too) began with metrics on.
    let passesAtSwitch = try loop.performAndWait { loop.metrics.passes }
    let counted = waitUntil("a pass counted after the switch") {
      ((try? loop.performAndWait { loop.metrics.passes }) ?? 0) > passesAtSwitch
    }
    try #require(counted)
    // Both readings are taken on the loop's thread inside a block: at a quiescent moment. A block
    // is counted at its start, its duration and its pass's at their ends: so the first reading's
    // block and pass fall in the difference, the second's do not.
    let before = try loop.performAndWait { loop.metrics }

    let jobs = 40
    for _ in 0..<jobs { await Task(executorPreference: loop) {}.value }

    let blocks = 25
    for _ in 0..<blocks { try loop.performAndWait {} }  // the last one is counted before it returns

    let fires = Guarded(0)
    let source = InputSource { _ in fires.withLock { $0 += 1 } }
    loop.add(source, to: .default)
    let signals = 15
    for round in 1...signals {
      source.signal()
      waitUntil("fire \(round)") { fires.snapshot == round }
    }

    let timers = 6
    let timerFires = Guarded(0)
    for round in 1...timers {
      loop.add(LoopTimer(after: .zero) { _ in timerFires.withLock { $0 += 1 } }, to: .default)
      waitUntil("timer \(round)") { timerFires.snapshot == round }
    }

    let told = Guarded(0)
    let observer = LoopObserver(activities: .all) { _, _ in told.withLock { $0 += 1 } }
    loop.add(observer, to: .default)
    loop.wakeUp()
    waitUntil("the observer") { told.snapshot > 0 }
    observer.invalidate()
    source.invalidate()
    // (After the invalidations: the observer is told no more.)
    let after = try loop.performAndWait { loop.metrics }

    let delta = after - before
    let blocksRun = UInt64(blocks + 1)  // the reading block's too
    #expect(delta.jobs == UInt64(jobs))
    #expect(delta.performedBlocks == blocksRun)
    #expect(delta.sourcesFired == UInt64(signals))
    #expect(delta.timersFired == UInt64(timers))
    #expect(delta.observerCallouts == UInt64(told.snapshot))
    #expect(delta.readinessEvents == 0)
    // One latency per measured event: every job and signal was stamped (metrics were on).
    #expect(delta.jobQueueDelay.count == UInt64(jobs))
    #expect(delta.signalLatency.count == UInt64(signals))
    #expect(delta.timerLateness.count == UInt64(timers))
    let callouts = UInt64(jobs) + blocksRun + UInt64(signals) + UInt64(timers) + UInt64(told.snapshot)
    #expect(delta.calloutDuration.count == callouts)  // the first reading block's, not the second's
    #expect(delta.passes > 0 && delta.passDuration.count == delta.passes)
    // At most one wake-up per pass; the second reading's pass woke already but has not ended.
    #expect(delta.wakeUps > 0 && delta.wakeUps <= delta.passes + 1)
    loop.shutdownAndWait()
  }

  @Test func switchedOffTheCountersStandStill() async throws {
    let loop = try RunLoopThread(name: "metrics-off")
    loop.setMetricsEnabled(false)
    try loop.performAndWait {}
    let before = loop.metrics
    for _ in 0..<10 { try loop.performAndWait {} }
    await Task(executorPreference: loop) {}.value
    #expect(loop.metrics == before)
    loop.setMetricsEnabled(true)
    try loop.performAndWait {}  // applied before this block: counted
    #expect((loop.metrics - before).performedBlocks == 1)
    loop.shutdownAndWait()
  }

  @Test(.enabled(if: LoopMonitor.metricsOnByDefault, "ASYNC_RUN_LOOP_METRICS=off in the environment"))
  func aNewLoopKeepsMetricsFromItsFirstPass() async throws {
    let loop = try RunLoopThread(name: "metrics-default")
    await Task(executorPreference: loop) {}.value
    try loop.performAndWait {}
    // (A pass is counted when it ends, after the sleep it may go on to: wake the loop.)
    waitUntil("a pass ends") {
      loop.wakeUp()
      return loop.metrics.passes > 0
    }
    let metrics = loop.metrics
    #expect(metrics.jobs >= 1 && metrics.jobQueueDelay.count >= 1)
    #expect(metrics.performedBlocks >= 1)
    loop.shutdownAndWait()
  }

  @Test func calloutAndPassTimesAreNanoseconds() throws {
    let loop = try RunLoopThread(name: "metrics-units")
    loop.setMetricsEnabled(true)  // (on by default, unless the environment says otherwise)
    let before = try loop.performAndWait { loop.metrics }
    try loop.performAndWait { _ = usleep(20_000) }
    // The block's pass goes on to sleep (its sleep is not counted) and ends after a wake-up.
    // (Both figures in the condition: they are relaxed counters, so on a weakly ordered CPU the
    // later pass figure can be seen before the callout's.)
    waitUntil("the sleeping block's pass ends") {
      loop.wakeUp()
      let delta = loop.metrics - before
      return delta.passDuration.totalNanoseconds >= 20_000_000
        && delta.calloutDuration.totalNanoseconds >= 20_000_000
    }
    let delta = loop.metrics - before
    // At least the 20 ms slept; far below a wrong unit's thousandfold.
    #expect(delta.calloutDuration.totalNanoseconds >= 20_000_000)
    #expect(delta.calloutDuration.totalNanoseconds < 20_000_000_000)
    #expect(delta.passDuration.totalNanoseconds < 20_000_000_000)
    let longest = try #require(delta.calloutDuration.quantile(1.0))
    #expect(longest >= .milliseconds(20))
    loop.shutdownAndWait()
  }

  @Test func aTimerDueAtTheEarliestInstantIsRecordedAsLateInsteadOfOverflowing() throws {
    let loop = try RunLoopThread(name: "metrics-earliest-timer")
    loop.setMetricsEnabled(true)  // (on by default, unless the environment says otherwise)
    let before = try loop.performAndWait { loop.metrics }
    let fired = Guarded(false)
    loop.add(LoopTimer(after: .seconds(-Int64.max)) { _ in fired.withLock { $0 = true } }, to: .default)
    waitUntil("the timer fires") { fired.snapshot }
    let delta = try loop.performAndWait { loop.metrics } - before
    #expect(delta.timersFired == 1)
    #expect(delta.timerLateness.count == 1)
    // Saturated: later than any bucket but the last holds.
    let lateness = try #require(delta.timerLateness.quantile(1.0))
    #expect(lateness > .seconds(500))
    loop.shutdownAndWait()
  }

  /// A pass that began with metrics on, switched them off before its sleep (a beforeWaiting
  /// observer), and had them switched on again by another thread (applied after the wake, in the
  /// same pass): its duration must not include the sleep.
  @Test func aPassDurationNeverCountsASleepTakenWhileMetricsWereOff() throws {
    let loop = try RunLoopThread(name: "metrics-off-across-sleep")
    loop.setMetricsEnabled(true)  // (on by default, unless the environment says otherwise)
    let armed = Guarded(false)
    let switchedOff = Guarded(false)
    let observer = LoopObserver(activities: .beforeWaiting) { _, _ in
      guard armed.snapshot, !switchedOff.snapshot else { return }
      switchedOff.withLock { $0 = true }
      loop.setMetricsEnabled(false)  // on the loop's thread: at once, mid-pass, before the sleep
    }
    loop.add(observer, to: .default)
    let before = try loop.performAndWait { loop.metrics }
    let slept = Guarded(false)
    let afterObserver = LoopObserver(activities: .afterWaiting) { _, _ in
      if switchedOff.snapshot { slept.withLock { $0 = true } }
    }
    loop.add(afterObserver, to: .default)
    try loop.performAndWait { armed.withLock { $0 = true } }
    waitUntil("switched off") { switchedOff.snapshot }
    usleep(300_000)  // the loop sleeps with metrics off
    loop.setMetricsEnabled(true)  // applied after the wake-up, in the pass that slept
    try loop.performAndWait {}
    try loop.performAndWait {}
    let after = loop.metrics
    observer.invalidate()
    afterObserver.invalidate()
    #expect(slept.snapshot, "the loop slept after the switch-off")
    let delta = after - before
    let longest = delta.passDuration.maximum ?? .zero
    #expect(longest < .milliseconds(100), "a pass 'busy' for \(longest)")
    loop.shutdownAndWait()
  }
}
