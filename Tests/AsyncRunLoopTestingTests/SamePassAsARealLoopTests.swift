import AsyncRunLoop
import AsyncRunLoopTesting
import Testing

@testable import AsyncRunLoop

/// A virtual-time loop makes the real loop's passes: the same observer activities, sources, timers
/// and run results in the same order as a loop on real time (SPEC §6), and the same events on every
/// run of the same scenario.
@Suite("Same passes as a real loop", .timeLimit(.minutes(2)))
struct SamePassAsARealLoopTests {
  static let scripted = RunLoopMode("scripted")

  /// A nested run in `scripted`: an observer logs every activity; timer A signals a source and
  /// schedules timer B 1 ms after its own date; B stops the run. Nothing in it depends on how long
  /// anything takes (a timer already due when the loop would sleep still goes through step 6–8),
  /// so a real loop logs it exactly too. Performed on `loop`; `done` runs after the run returned.
  static func perform(on loop: RunLoopThread, log: EventLog, done: @escaping @Sendable () -> Void) {
    let mode = scripted
    loop.perform {
      let observer = LoopObserver(activities: .all) { _, activity in log("\(activity)") }
      let source = InputSource { _ in log("source") }
      loop.add(observer, to: mode)
      loop.add(source, to: mode)
      let timerA = LoopTimer(after: .milliseconds(1)) { timer in
        log("timer A")
        source.signal()
        loop.add(
          LoopTimer(fireAt: timer.fireDate.advanced(by: .milliseconds(1))) { _ in
            log("timer B")
            loop.stop()
          }, to: mode)
      }
      loop.add(timerA, to: mode)
      let result = loop.run(mode: mode)
      log("\(result)")
      observer.invalidate()
      source.invalidate()
      done()
    }
  }

  static let expected = [
    "entry",
    "beforeTimers", "beforeSources", "beforeWaiting", "afterWaiting", "timer A",
    "beforeTimers", "beforeSources", "source", "beforeWaiting", "afterWaiting", "timer B",
    "exit", "stopped",
  ]

  @Test func observersSourcesAndTimersComeInTheRealLoopsOrder() async throws {
    let real = try RunLoopThread(name: "vt-real")
    defer { real.shutdownAndWait() }
    let realLog = EventLog()
    await withCheckedContinuation { continuation in
      Self.perform(on: real, log: realLog) { continuation.resume() }
    }

    // Auto-advance: the loop moves its time itself, so no call from the test reaches it (and makes
    // a pass) while the scripted run is on.
    let virtual = try VirtualTimeLoop(name: "vt-virtual", autoAdvances: true)
    defer { virtual.shutdownAndWait() }
    let virtualLog = EventLog()
    await withCheckedContinuation { continuation in
      Self.perform(on: virtual.loop, log: virtualLog) { continuation.resume() }
    }
    #expect(virtual.elapsedMilliseconds == 2)

    #expect(realLog.entries == Self.expected)
    #expect(virtualLog.entries == Self.expected)
  }

  /// A busier scenario: repeating and one-shot timers sharing dates in two modes, a timer sequence
  /// and a sleeping task on the loop, a source signalled by timers, and a modal run with a time
  /// limit. Returns the log of one run on a fresh virtual loop.
  static func busyScenario() async throws -> [String] {
    let virtual = try VirtualTimeLoop(name: "vt-busy")
    defer { virtual.shutdownAndWait() }
    let loop = virtual.loop
    let log = EventLog()
    let modal = RunLoopMode("modal")
    let source = InputSource { _ in log("source at \(loop.clock.now.virtualMilliseconds)") }
    let origin = virtual.now
    let timers = (0..<12).map { index in
      let date = origin.advanced(by: .milliseconds(Int64(index % 4) * 250))
      let repeats: Duration? = index % 3 == 0 ? .milliseconds(300) : nil
      return LoopTimer(fireAt: date, repeatingEvery: repeats) { _ in
        log("t\(index) at \(loop.clock.now.virtualMilliseconds)")
        if index % 5 == 0 { source.signal() }
      }
    }
    // Set up on the loop thread in one go: from the test's thread, the loop could take the adds
    // in two passes, and a source signalled in the first would fire before the second's timers.
    try loop.performAndWait {
      loop.addModeToCommonModes(modal)
      loop.add(source, to: .common)
      for (index, timer) in timers.enumerated() { loop.add(timer, to: index.isMultiple(of: 2) ? .common : .default) }
    }
    let consumer = Task(executorPreference: loop) {
      for await tick in loop.timer(every: .milliseconds(400)) {
        log("tick \(tick.scheduled.virtualMilliseconds)")
        if tick.scheduled.virtualMilliseconds >= 1600 { break }
      }
    }
    let sleeper = Task(executorPreference: loop) {
      try await Task.sleep(for: .milliseconds(700))
      log("slept at \(loop.clock.now.virtualMilliseconds)")
      let result = loop.run(mode: modal, for: .milliseconds(500))
      log("modal \(result) at \(loop.clock.now.virtualMilliseconds)")
    }
    await virtual.runUntilIdle()
    for _ in 0..<4 { await virtual.advance(by: .milliseconds(500)) }
    await consumer.value
    try await sleeper.value
    for timer in timers { timer.invalidate() }
    source.invalidate()
    return log.entries
  }

  @Test func sameScenarioTwiceLogsTheSameEvents() async throws {
    let first = try await Self.busyScenario()
    let second = try await Self.busyScenario()
    #expect(first.count > 30)
    #expect(first == second)
  }
}
