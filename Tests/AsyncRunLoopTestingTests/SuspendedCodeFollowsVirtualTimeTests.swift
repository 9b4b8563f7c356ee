import AsyncRunLoopTesting
import Testing

@_spi(Testing) @testable import AsyncRunLoop

/// Code suspended on the loop's time — a `for await` over a timer sequence, `Task.sleep` in a task
/// that prefers the loop, `loop.clock.sleep`, a run's time limit — resumes when virtual time
/// reaches its deadline, and `advance` returns after it ran.
@Suite("Suspended code follows virtual time", .timeLimit(.minutes(2)))
struct SuspendedCodeFollowsVirtualTimeTests {
  @Test func timerSequenceTicksResumeTheConsumerAfterAdvance() async throws {
    let virtual = try VirtualTimeLoop(name: "vt-ticks")
    defer { virtual.shutdownAndWait() }
    let loop = virtual.loop
    let log = EventLog()
    let consumer = Task(executorPreference: loop) {
      for await tick in loop.timer(every: .seconds(1)) {
        log("tick \(tick.scheduled.virtualMilliseconds) at \(loop.clock.now.virtualMilliseconds)")
        if log.entries.count == 3 { break }
      }
      log("done")
    }
    await virtual.runUntilIdle()  // the consumer made its sequence and waits
    #expect(log.entries.isEmpty)
    await virtual.advance(by: .seconds(1))
    #expect(log.entries == ["tick 1000 at 1000"])
    await virtual.advance(by: .milliseconds(1500))
    #expect(log.entries == ["tick 1000 at 1000", "tick 2000 at 2000"])
    await virtual.advance(by: .milliseconds(500))
    #expect(log.entries == ["tick 1000 at 1000", "tick 2000 at 2000", "tick 3000 at 3000", "done"])
    await consumer.value
  }

  @Test func taskSleepUnderTheLoopsPreferenceWakesAtItsVirtualDeadline() async throws {
    let virtual = try VirtualTimeLoop(name: "vt-task-sleep")
    defer { virtual.shutdownAndWait() }
    let loop = virtual.loop
    let log = EventLog()
    let sleeper = Task(executorPreference: loop) {
      try await Task.sleep(for: .seconds(5))
      log("woke at \(loop.clock.now.virtualMilliseconds)")
    }
    await virtual.runUntilIdle()
    #expect(loop.scheduledJobCount == 1)  // routed to the loop's timers, not the global executor's
    await virtual.advance(by: .seconds(4))
    #expect(log.entries.isEmpty)
    await virtual.advance(by: .seconds(1))
    #expect(log.entries == ["woke at 5000"])
    try await sleeper.value
  }

  @Test func loopClockSleepWakesAtItsVirtualDeadline() async throws {
    let virtual = try VirtualTimeLoop(name: "vt-clock-sleep")
    defer { virtual.shutdownAndWait() }
    let loop = virtual.loop
    let log = EventLog()
    let sleeper = Task(executorPreference: loop) {
      try await loop.clock.sleep(for: .seconds(600))
      log("slept until \(loop.clock.now.virtualMilliseconds)")
      try await loop.clock.sleep(until: loop.clock.now.advanced(by: .seconds(1)))
      log("then until \(loop.clock.now.virtualMilliseconds)")
    }
    await virtual.runUntilIdle()
    await virtual.advance(by: .seconds(599))
    #expect(log.entries.isEmpty)
    await virtual.advance(by: .seconds(2))
    #expect(log.entries == ["slept until 600000", "then until 601000"])
    try await sleeper.value
  }

  @Test func runTimeLimitIsVirtual() async throws {
    let virtual = try VirtualTimeLoop(name: "vt-run-limit")
    defer { virtual.shutdownAndWait() }
    let loop = virtual.loop
    let log = EventLog()
    let ticker = LoopTimer(after: .seconds(1), repeatingEvery: .seconds(1)) { _ in
      log("tick \(loop.clock.now.virtualMilliseconds)")
    }
    loop.add(ticker, to: RunLoopMode("modal"))
    loop.perform {
      let result = loop.run(mode: RunLoopMode("modal"), for: .milliseconds(3500))
      log("\(result) at \(loop.clock.now.virtualMilliseconds)")
    }
    await virtual.advance(by: .seconds(10))
    #expect(log.entries == ["tick 1000", "tick 2000", "tick 3000", "timedOut at 3500"])
    ticker.invalidate()
  }
}
