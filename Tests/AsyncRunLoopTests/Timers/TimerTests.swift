import AsyncRunLoopTesting
import Glibc
import Testing

@testable import AsyncRunLoop

/// Loop timers (SPEC §4): one-shot and repeating, never early, missed fires collapse, moving,
/// invalidation, and the defined answers to bad input. Tests about dates, order and counts run on
/// a virtual-time loop (exact instants, no sleeping); those about threads on real loops.
@Suite("LoopTimer")
struct TimerTests {
  /// One fire: the grid point (fire date) it was for, and when it ran.
  struct Fire: Sendable {
    var scheduled: LoopClock.Instant
    var ran: LoopClock.Instant
  }

  /// Records every fire of the timers it builds.
  final class FireRecorder: Sendable {
    let fires = Locked<[Fire]>([])
    let offThread = Locked(0)

    var count: Int { fires.withLock { $0.count } }

    /// A handler that records the fire (and whether it ran on `loop`'s thread).
    func handler(on loop: RunLoopThread) -> @Sendable (LoopTimer) -> Void {
      { timer in
        let ran = loop.clock.now  // the loop's time: virtual on a virtual-time loop
        if !loop.isOnLoopThread { self.offThread.withLock { $0 += 1 } }
        self.fires.withLock { $0.append(Fire(scheduled: timer.fireDate, ran: ran)) }
      }
    }
  }

  @Test func oneShotFiresOnceAndThenInvalidatesItself() throws {
    let loop = try RunLoopThread(name: "timer-once")
    let recorder = FireRecorder()
    let fireDate = LoopClock.Instant.now.advanced(by: .milliseconds(10))
    let timer = LoopTimer(fireAt: fireDate, handler: recorder.handler(on: loop))
    #expect(timer.interval == nil)
    loop.add(timer, to: .default)
    waitUntil("the fire") { recorder.count == 1 && !timer.isValid }
    try loop.performAndWait {}
    try loop.performAndWait {}
    let fires = recorder.fires.withLock { $0 }
    #expect(fires.count == 1)
    #expect(fires[0].ran >= fireDate)
    #expect(recorder.offThread.withLock { $0 } == 0)
    loop.shutdownAndWait()
  }

  @Test func repeatingTimerFiresOnItsGridAndNeverEarly() async throws {
    let virtual = try VirtualTimeLoop(name: "timer-repeat")
    defer { virtual.shutdownAndWait() }
    let loop = virtual.loop
    let recorder = FireRecorder()
    let start = virtual.now.advanced(by: .milliseconds(5))
    let interval = Duration.milliseconds(5)
    let timer = LoopTimer(fireAt: start, repeatingEvery: interval, handler: recorder.handler(on: loop))
    loop.add(timer, to: .default)
    await virtual.advance(by: .milliseconds(27))
    timer.invalidate()
    let fires = recorder.fires.withLock { $0 }
    #expect(fires.map(\.scheduled) == (0..<5).map { start.advanced(by: interval * $0) })
    for fire in fires { #expect(fire.ran == fire.scheduled) }  // on its date, in virtual time
    #expect(recorder.offThread.withLock { $0 } == 0)
  }

  @Test func equalFireDatesFireInSchedulingOrder() async throws {
    let virtual = try VirtualTimeLoop(name: "timer-ties")
    defer { virtual.shutdownAndWait() }
    let loop = virtual.loop
    let log = EngineEventLog()
    let date = virtual.now.advanced(by: .milliseconds(5))
    let names = ["a", "b", "c", "d"]
    try loop.performAndWait {
      for name in names { loop.add(LoopTimer(fireAt: date) { _ in log(name) }, to: .default) }
    }
    await virtual.advance(by: .milliseconds(4))
    #expect(log.entries.isEmpty)
    await virtual.advance(by: .milliseconds(1))
    #expect(log.entries == names)
  }

  @Test func toleranceNeverMakesATimerFireEarly() async throws {
    let virtual = try VirtualTimeLoop(name: "timer-tolerance")
    defer { virtual.shutdownAndWait() }
    let loop = virtual.loop
    let recorder = FireRecorder()
    let now = virtual.now
    var timers: [LoopTimer] = []
    for (offset, tolerance) in [(1, 20), (3, 0), (7, 5), (8, 50), (12, 1), (20, 20)] {
      timers.append(
        LoopTimer(
          fireAt: now.advanced(by: .milliseconds(offset)), tolerance: .milliseconds(tolerance),
          handler: recorder.handler(on: loop)))
    }
    let repeating = LoopTimer(
      fireAt: now.advanced(by: .milliseconds(2)), repeatingEvery: .milliseconds(3), tolerance: .milliseconds(10),
      handler: recorder.handler(on: loop))
    timers.append(repeating)
    for timer in timers { loop.add(timer, to: .default) }
    await virtual.advance(by: .milliseconds(100))
    repeating.invalidate()
    #expect(timers.dropLast().allSatisfy { !$0.isValid })
    let fires = recorder.fires.withLock { $0 }
    #expect(fires.count >= 12)
    for fire in fires {
      #expect(fire.ran >= fire.scheduled, "fired \(fire.scheduled.duration(to: fire.ran)) early")
      // Exact in virtual time: no timer is more than its (capped) tolerance late, 50 ms at most.
      #expect(fire.ran <= fire.scheduled.advanced(by: .milliseconds(50)))
    }
  }

  @Test func missedFiresCollapseIntoOneFire() async throws {
    let virtual = try VirtualTimeLoop(name: "timer-missed")
    defer { virtual.shutdownAndWait() }
    let loop = virtual.loop
    let recorder = FireRecorder()
    let origin = virtual.now
    let interval = Duration.milliseconds(10)
    let timer = LoopTimer(
      fireAt: origin.advanced(by: interval), repeatingEvery: interval, handler: recorder.handler(on: loop))
    loop.add(timer, to: .default)
    await virtual.advance(by: .milliseconds(10))
    #expect(recorder.count == 1)
    // Keep the loop away from the timer's mode for 200 ms (a nested run elsewhere): 20 grid points
    // pass unfired.
    let elsewhere = RunLoopMode("elsewhere")
    let keepsModeAlive = LoopTimer(after: .seconds(3_600)) { _ in }
    loop.add(keepsModeAlive, to: elsewhere)
    loop.perform { _ = loop.run(mode: elsewhere, for: .milliseconds(200)) }
    await virtual.advance(by: .milliseconds(240))
    timer.invalidate()
    keepsModeAlive.invalidate()
    let fires = recorder.fires.withLock { $0 }
    let milliseconds = { (instant: LoopClock.Instant) in origin.duration(to: instant) / .milliseconds(1) }
    // One fire catches up for every missed grid point, then the timer is back on its grid.
    #expect(fires.map { milliseconds($0.scheduled) } == [10, 20, 220, 230, 240, 250])
    #expect(fires.map { milliseconds($0.ran) } == [10, 210, 220, 230, 240, 250])
  }

  @Test func setFireDateMovesATimerEarlier() async throws {
    let virtual = try VirtualTimeLoop(name: "timer-earlier")
    defer { virtual.shutdownAndWait() }
    let loop = virtual.loop
    let recorder = FireRecorder()
    let timer = LoopTimer(after: .seconds(3_600), handler: recorder.handler(on: loop))
    loop.add(timer, to: .default)
    await virtual.runUntilIdle()
    let newDate = virtual.now.advanced(by: .milliseconds(20))
    timer.setFireDate(newDate)  // from a thread other than the loop's
    #expect(timer.fireDate == newDate)
    await virtual.advance(by: .milliseconds(19))
    #expect(recorder.count == 0)
    await virtual.advance(by: .milliseconds(1))
    #expect(recorder.count == 1)
    #expect(recorder.fires.withLock { $0[0].ran } == newDate)
  }

  @Test func setFireDateMovesATimerLater() throws {
    let loop = try RunLoopThread(name: "timer-later")
    let recorder = FireRecorder()
    let timer = LoopTimer(fireAt: .now, handler: recorder.handler(on: loop))
    try loop.performAndWait {
      loop.add(timer, to: .default)  // due at once ...
      timer.setFireDate(.now.advanced(by: .seconds(3_600)))  // ... but moved before the pass fires it
    }
    try loop.performAndWait {}
    try loop.performAndWait {}
    #expect(recorder.count == 0)
    #expect(timer.isValid)
    timer.setFireDate(.now)
    waitUntil("the fire") { recorder.count == 1 }
    loop.shutdownAndWait()
  }

  @Test func repeatingTimerMovedKeepsItsIntervalFromTheNewDate() async throws {
    let virtual = try VirtualTimeLoop(name: "timer-move-repeat")
    defer { virtual.shutdownAndWait() }
    let loop = virtual.loop
    let recorder = FireRecorder()
    let timer = LoopTimer(
      after: .seconds(3_600), repeatingEvery: .milliseconds(7), handler: recorder.handler(on: loop))
    loop.add(timer, to: .default)
    let newDate = virtual.now.advanced(by: .milliseconds(5))
    timer.setFireDate(newDate)
    await virtual.advance(by: .milliseconds(20))
    timer.invalidate()
    let fires = recorder.fires.withLock { $0 }
    #expect(fires.map(\.scheduled) == [0, 7, 14].map { newDate.advanced(by: .milliseconds($0)) })
    for fire in fires { #expect(fire.ran == fire.scheduled) }
  }

  @Test func invalidateFromAnotherThreadStopsFurtherFires() throws {
    let loop = try RunLoopThread(name: "timer-invalidate")
    let recorder = FireRecorder()
    let timer = LoopTimer(
      after: .milliseconds(1), repeatingEvery: .milliseconds(1), handler: recorder.handler(on: loop))
    loop.add(timer, to: .default)
    waitUntil("a few fires") { recorder.count >= 3 }
    timer.invalidate()
    #expect(!timer.isValid)
    // A callout that had already started may finish; none starts after this round trip.
    try loop.performAndWait {}
    let settled = recorder.count
    usleep(20_000)
    try loop.performAndWait {}
    try loop.performAndWait {}
    #expect(recorder.count == settled)
    #expect(try loop.performAndWait { loop.core.modeCount(of: timer) == 0 })
    loop.shutdownAndWait()
  }

  @Test func invalidateOnTheLoopThreadPreventsAFireDueInTheSamePass() throws {
    let loop = try RunLoopThread(name: "timer-invalidate-here")
    let log = EngineEventLog()
    try loop.performAndWait {
      let timer = LoopTimer(fireAt: .now) { _ in log("due timer fired") }
      loop.add(timer, to: .default)
      timer.invalidate()
    }
    // Two timers due in the same pass: the first invalidates the second, which must not fire
    // although the pass had already collected it as due.
    let second = LoopTimer(fireAt: LoopClock.Instant(nanoseconds: 1)) { _ in log("second fired") }
    let first = LoopTimer(fireAt: LoopClock.Instant(nanoseconds: 1)) { _ in
      log("first fired")
      second.invalidate()
    }
    try loop.performAndWait {
      loop.add(first, to: .default)
      loop.add(second, to: .default)
    }
    waitUntil("the first timer") { log.entries.count >= 1 }
    try loop.performAndWait {}
    try loop.performAndWait {}
    #expect(log.entries == ["first fired"])
    loop.shutdownAndWait()
  }

  @Test func nanOrInfiniteSecondsAreRejected() {
    let handler: @Sendable (LoopTimer) -> Void = { _ in }
    let nanDelay = #expect(throws: LoopTimerError.self) { try LoopTimer(seconds: .nan, handler: handler) }
    if case .invalidInterval(let value)? = nanDelay {
      #expect(value.isNaN)
    } else {
      Issue.record("\(String(describing: nanDelay))")
    }
    #expect(throws: LoopTimerError.invalidInterval(.infinity)) { try LoopTimer(seconds: .infinity, handler: handler) }
    #expect(throws: LoopTimerError.invalidInterval(-.infinity)) { try LoopTimer(seconds: -.infinity, handler: handler) }
    #expect(throws: LoopTimerError.invalidInterval(.infinity)) {
      try LoopTimer(seconds: 1, repeatingEverySeconds: .infinity, handler: handler)
    }
    let nanInterval = #expect(throws: LoopTimerError.self) {
      try LoopTimer(seconds: 1, repeatingEverySeconds: .nan, handler: handler)
    }
    if case .invalidInterval(let value)? = nanInterval {
      #expect(value.isNaN)
    } else {
      Issue.record("\(String(describing: nanInterval))")
    }
    #expect(throws: LoopTimerError.invalidTolerance(-1)) {
      try LoopTimer(seconds: 1, toleranceSeconds: -1, handler: handler)
    }
    #expect(throws: LoopTimerError.invalidTolerance(.infinity)) {
      try LoopTimer(seconds: 1, toleranceSeconds: .infinity, handler: handler)
    }
    #expect(throws: Never.self) {
      _ = try LoopTimer(seconds: 0.25, repeatingEverySeconds: 0.5, toleranceSeconds: 0.1, handler: handler)
    }
  }

  @Test func negativeDelaysFireOnceAsSoonAsPossible() throws {
    let loop = try RunLoopThread(name: "timer-negative")
    let recorder = FireRecorder()
    let timers = [
      LoopTimer(after: .seconds(-5), handler: recorder.handler(on: loop)),
      try LoopTimer(seconds: -1, handler: recorder.handler(on: loop)),
      // A negative repeat interval makes a one-shot timer.
      LoopTimer(after: .milliseconds(-1), repeatingEvery: .seconds(-1), handler: recorder.handler(on: loop)),
    ]
    #expect(timers[2].interval == nil)
    for timer in timers { loop.add(timer, to: .default) }
    waitUntil("every fire") { recorder.count >= 3 && timers.allSatisfy { !$0.isValid } }
    try loop.performAndWait {}
    try loop.performAndWait {}
    #expect(recorder.count == 3)
    loop.shutdownAndWait()
  }

  @Test func repeatingTimerWithAHugeNegativeDelayKeepsRepeating() throws {
    let loop = try RunLoopThread(name: "timer-past-grid")
    let recorder = FireRecorder()
    // The first fire date saturates to the clock's earliest instant.
    let timer = LoopTimer(
      after: .seconds(-Int64.max), repeatingEvery: .milliseconds(2), handler: recorder.handler(on: loop))
    loop.add(timer, to: .default)
    waitUntil("several fires") { recorder.count >= 4 }
    timer.invalidate()
    let fires = recorder.fires.withLock { $0 }
    for fire in fires.dropFirst() { #expect(fire.ran >= fire.scheduled) }
    loop.shutdownAndWait()
  }

  @Test func durationsNearTheMaximumNeitherOverflowNorBlockOtherTimers() throws {
    let loop = try RunLoopThread(name: "timer-huge")
    let recorder = FireRecorder()
    let never = LoopTimer(after: .seconds(Int64.max), handler: recorder.handler(on: loop))
    #expect(never.fireDate == .distantFuture)
    let hugeInterval = LoopTimer(
      after: .zero, repeatingEvery: .seconds(Int64.max), handler: recorder.handler(on: loop))
    let nearMax = LoopTimer(
      fireAt: LoopClock.Instant(nanoseconds: .max - 1), repeatingEvery: .nanoseconds(Int64.max),
      handler: recorder.handler(on: loop))
    let small = LoopTimer(after: .milliseconds(5), handler: recorder.handler(on: loop))
    for timer in [never, hugeInterval, nearMax, small] { loop.add(timer, to: .default) }
    waitUntil("the small timer and the first fire of the huge-interval one") { recorder.count >= 2 && !small.isValid }
    try loop.performAndWait {}
    try loop.performAndWait {}
    // The huge-interval timer fired once and its next date saturated: no spin, no wrap-around.
    #expect(recorder.count == 2)
    #expect(hugeInterval.isValid)
    #expect(hugeInterval.fireDate == .distantFuture)
    #expect(never.isValid)
    for timer in [never, hugeInterval, nearMax] { timer.invalidate() }
    loop.shutdownAndWait()
  }

  @Test func zeroIntervalFiresOncePerPassAndStopFromItsHandlerWorks() {
    let (result, passesOfFires) = EngineTestThread.run { () -> (RunLoopRunResult, [Int]) in
      let loop = RunLoopThread.current
      let pass = Locked(0)
      let passesOfFires = Locked<[Int]>([])
      let observer = LoopObserver(activities: .beforeTimers) { _, _ in pass.withLock { $0 += 1 } }
      let timer = LoopTimer(after: .zero, repeatingEvery: .zero) { _ in
        let current = pass.withLock { $0 }
        let count = passesOfFires.withLock {
          $0.append(current)
          return $0.count
        }
        if count == 50 { RunLoopThread.current.stop() }
      }
      loop.add(observer, to: .default)
      loop.add(timer, to: .default)
      let result = loop.run(mode: .default, until: .now.advanced(by: .seconds(60)))
      timer.invalidate()
      observer.invalidate()
      return (result, passesOfFires.withLock { $0 })
    }
    #expect(LoopTimer(after: .zero, repeatingEvery: .zero) { _ in }.interval == .zero)
    #expect(result == .stopped)
    #expect(passesOfFires.count == 50)
    // Once per pass: every fire happened in a later pass than the one before.
    for (previous, next) in zip(passesOfFires, passesOfFires.dropFirst()) { #expect(next > previous) }
  }
}
