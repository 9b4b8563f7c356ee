import AsyncRunLoop
import AsyncRunLoopTesting
import Testing

/// With `autoAdvances`, the loop jumps to its next deadline whenever it has nothing else to do
/// (Tokio's rule), without the test naming a time.
@Suite("Auto-advance", .timeLimit(.minutes(2)))
struct AutoAdvanceTests {
  @Test func idleLoopJumpsFromDeadlineToDeadline() async throws {
    let virtual = try VirtualTimeLoop(name: "vt-auto", autoAdvances: true)
    defer { virtual.shutdownAndWait() }
    let loop = virtual.loop
    let log = EventLog()
    let task = Task(executorPreference: loop) {
      try await Task.sleep(for: .seconds(3600))
      log("hour at \(loop.clock.now.virtualMilliseconds)")
      try await loop.clock.sleep(for: .seconds(1))
      log("second at \(loop.clock.now.virtualMilliseconds)")
    }
    try await task.value  // nobody advances: the loop does
    #expect(log.entries == ["hour at 3600000", "second at 3601000"])
    await virtual.runUntilIdle()  // no deadline left: returns, time stays
    #expect(virtual.elapsedMilliseconds == 3_601_000)
  }

  @Test func workBeforeADeadlineRunsBeforeTheJump() async throws {
    let virtual = try VirtualTimeLoop(name: "vt-auto-work", autoAdvances: false)
    defer { virtual.shutdownAndWait() }
    let loop = virtual.loop
    let log = EventLog()
    let timer = LoopTimer(after: .seconds(30)) { _ in log("timer at \(loop.clock.now.virtualMilliseconds)") }
    loop.add(timer, to: .default)
    loop.perform { log("block at \(loop.clock.now.virtualMilliseconds)") }
    await virtual.runUntilIdle()
    #expect(log.entries == ["block at 0"])
    virtual.autoAdvances = true
    await virtual.runUntilIdle()  // until no deadline is left
    #expect(log.entries == ["block at 0", "timer at 30000"])
  }
}
