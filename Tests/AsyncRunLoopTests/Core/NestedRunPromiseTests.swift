import Glibc
import Testing

@testable import AsyncRunLoop

/// The promises of the pass article's "Nested runs" section, each entered from the callout it
/// names: a nested run continues the work the outer pass had in hand, in order, exactly once.
@Suite("Nested runs continue the outer pass's work")
struct NestedRunPromiseTests {
  @Test func aRunNestedInASourceHandlerFiresTheSourcesTheOuterStepFourHadNotFiredYet() async throws {
    let loop = try RunLoopThread(name: "nest-sources")
    defer { loop.shutdownAndWait() }
    let log = Guarded<[String]>([])
    let second = InputSource(order: 1) { _ in log.withLock { $0.append("B") } }
    let first = InputSource(order: 0) { _ in
      log.withLock { $0.append("A-start") }
      let result = loop.run(mode: .default, for: .seconds(10), returnAfterSourceHandled: true)
      log.withLock { $0.append("A-end: \(result)") }
    }
    try loop.performAndWait {
      loop.add(first)
      loop.add(second)
      first.signal()  // both ready in the same step 4: A fires first (lower order)
      second.signal()
    }
    #expect(await eventually("both sources fired") { log.snapshot.count == 3 })
    #expect(log.snapshot == ["A-start", "B", "A-end: handledSource"])
    first.invalidate()
    second.invalidate()
  }

  @Test func aRunNestedInATimerCalloutFiresTheOtherDueTimers() async throws {
    let loop = try RunLoopThread(name: "nest-timers")
    defer { loop.shutdownAndWait() }
    let log = Guarded<[String]>([])
    let due = LoopClock.Instant.now
    let first = LoopTimer(fireAt: due) { _ in
      log.withLock { $0.append("T1-start") }
      let result = loop.run(mode: .default, for: .seconds(10))
      log.withLock { $0.append("T1-end: \(result)") }
    }
    let second = LoopTimer(fireAt: due) { _ in
      log.withLock { $0.append("T2") }
      loop.stop()  // timers never end a run: this ends the nested one
    }
    try loop.performAndWait {
      loop.add(first)  // same date: scheduling order decides, T1 first
      loop.add(second)
    }
    #expect(await eventually("both timers fired") { log.snapshot.count == 3 })
    #expect(log.snapshot == ["T1-start", "T2", "T1-end: stopped"])
  }

  @Test func blocksSentTogetherRunInOrderAndOnceAcrossARunNestedInOneOfThem() async throws {
    let loop = try RunLoopThread(name: "nest-blocks")
    defer { loop.shutdownAndWait() }
    let keeper = LoopTimer(after: .seconds(3600)) { _ in }  // the nested run has something to watch
    loop.add(keeper)
    defer { keeper.invalidate() }
    let log = Guarded<[String]>([])
    let hold = TestGate()
    loop.perform { hold.wait(timeout: .seconds(30)) }  // so that A, B and C are collected together
    loop.perform {
      log.withLock { $0.append("A-start") }
      let result = loop.run(mode: .default, for: .seconds(10))
      log.withLock { $0.append("A-end: \(result)") }
    }
    loop.perform { log.withLock { $0.append("B") } }
    loop.perform {
      log.withLock { $0.append("C") }
      loop.stop()
    }
    hold.open()
    #expect(await eventually("the blocks ran") { log.snapshot.count == 4 })
    _ = try loop.performAndWait { 0 }
    #expect(log.snapshot == ["A-start", "B", "C", "A-end: stopped"])
  }
}
