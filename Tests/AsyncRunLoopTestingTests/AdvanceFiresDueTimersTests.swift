import AsyncRunLoop
import AsyncRunLoopTesting
import Testing

/// `advance(by:)` and `advance(to:)` fire exactly the timers due by the target, in (date,
/// scheduling) order, each at its own virtual instant; nothing fires while time stands still.
@Suite("Advancing virtual time", .timeLimit(.minutes(2)))
struct AdvanceFiresDueTimersTests {
  @Test func nothingFiresUntilTimeIsAdvanced() async throws {
    let virtual = try VirtualTimeLoop(name: "vt-still")
    defer { virtual.shutdownAndWait() }
    let log = EventLog()
    virtual.loop.add(LoopTimer(after: .seconds(1)) { _ in log("fired") }, to: .default)
    await virtual.runUntilIdle()
    #expect(log.entries.isEmpty)
    #expect(virtual.now == VirtualTimeLoop.defaultOrigin)
    await virtual.advance(by: .milliseconds(999))
    #expect(log.entries.isEmpty)
    await virtual.advance(by: .milliseconds(1))
    #expect(log.entries == ["fired"])
  }

  @Test func advanceFiresExactlyTheDueTimersInDeadlineThenInsertionOrder() async throws {
    let virtual = try VirtualTimeLoop(name: "vt-due")
    defer { virtual.shutdownAndWait() }
    let loop = virtual.loop
    let log = EventLog()
    let origin = virtual.now
    // Added out of date order; b1/b2 and d1/d2 share dates and must keep their scheduling order.
    let plan: [(String, Int64)] = [("c", 30), ("b1", 20), ("a", 10), ("b2", 20), ("e", 50), ("d1", 40), ("d2", 40)]
    for (name, milliseconds) in plan {
      let timer = LoopTimer(fireAt: origin.advanced(by: .milliseconds(milliseconds))) { _ in
        log("\(name)@\(loop.clock.now.virtualMilliseconds)")
      }
      loop.add(timer, to: .default)
    }
    await virtual.advance(by: .milliseconds(20))
    #expect(log.entries == ["a@10", "b1@20", "b2@20"])
    #expect(virtual.elapsedMilliseconds == 20)
    await virtual.advance(by: .milliseconds(19))
    #expect(log.entries == ["a@10", "b1@20", "b2@20", "c@30"])
    #expect(virtual.elapsedMilliseconds == 39)
    await virtual.advance(to: origin.advanced(by: .milliseconds(45)))
    #expect(log.entries == ["a@10", "b1@20", "b2@20", "c@30", "d1@40", "d2@40"])
    await virtual.advance(to: origin)  // in the past: time does not go back, nothing fires
    #expect(virtual.elapsedMilliseconds == 45)
    await virtual.advance(by: .seconds(10))
    #expect(log.entries.last == "e@50")
    #expect(log.entries.count == plan.count)
  }

  /// The example of the `AsyncRunLoopTesting` article and of "Testing code that uses loops".
  @Test func heartbeatEveryThirtySecondsBeatsTenTimesInFiveMinutes() async throws {
    let virtual = try VirtualTimeLoop()
    defer { virtual.shutdownAndWait() }
    let beats = Beats()
    let heartbeat = LoopTimer(after: .seconds(30), repeatingEvery: .seconds(30)) { _ in beats.count += 1 }
    virtual.loop.add(heartbeat, to: .common)
    await virtual.advance(by: .seconds(300))
    #expect(try virtual.loop.performAndWait { beats.count } == 10)
  }

  // Safety: touched on the loop thread only (the timer's callout and performAndWait).
  final class Beats: @unchecked Sendable { var count = 0 }

  @Test func repeatingTimerFiresOncePerIntervalOnItsGrid() async throws {
    let virtual = try VirtualTimeLoop(name: "vt-repeat")
    defer { virtual.shutdownAndWait() }
    let log = EventLog()
    let loop = virtual.loop
    let timer = LoopTimer(after: .milliseconds(100), repeatingEvery: .milliseconds(100)) { timer in
      log("\(timer.fireDate.virtualMilliseconds)@\(loop.clock.now.virtualMilliseconds)")
    }
    loop.add(timer, to: .default)
    await virtual.advance(by: .milliseconds(350))
    // `fireDate` in the callout is the date being fired; the log shows it equals the virtual now.
    #expect(log.entries == ["100@100", "200@200", "300@300"])
    timer.invalidate()
    await virtual.advance(by: .seconds(1))
    #expect(log.entries.count == 3)
  }

  @Test func timerMadeWithADelayCountsItFromTheLoopsTimeWhenAdded() async throws {
    let virtual = try VirtualTimeLoop(name: "vt-after")
    defer { virtual.shutdownAndWait() }
    let log = EventLog()
    let loop = virtual.loop
    await virtual.advance(by: .seconds(5))
    loop.add(LoopTimer(after: .seconds(2)) { _ in log("at \(loop.clock.now.virtualMilliseconds)") }, to: .default)
    await virtual.advance(by: .seconds(2))
    #expect(log.entries == ["at 7000"])
  }

  @Test func aCalloutsNewTimerInsideTheSpanFiresInIt() async throws {
    let virtual = try VirtualTimeLoop(name: "vt-chain")
    defer { virtual.shutdownAndWait() }
    let log = EventLog()
    let loop = virtual.loop
    @Sendable func chain(_ step: Int) {
      loop.add(
        LoopTimer(after: .milliseconds(10)) { _ in
          log("\(step)@\(loop.clock.now.virtualMilliseconds)")
          if step < 5 { chain(step + 1) }
        }, to: .default)
    }
    chain(1)
    await virtual.advance(by: .milliseconds(35))
    #expect(log.entries == ["1@10", "2@20", "3@30"])
    #expect(virtual.elapsedMilliseconds == 35)
    await virtual.advance(by: .seconds(1))
    #expect(log.entries == ["1@10", "2@20", "3@30", "4@40", "5@50"])
  }
}
