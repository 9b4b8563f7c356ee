import Glibc
import Testing

@testable import AsyncRunLoop

/// Handing blocks to a loop: `perform` and `performAndWait` (SPEC §7).
@Suite("Perform")
struct PerformTests {
  struct Failure: Error, Equatable {
    var code: Int
  }

  @Test func performFromAnotherThreadWakesASleepingLoop() throws {
    let loop = try RunLoopThread(name: "perform-wake")
    let asleep = Locked(false)
    let observer = LoopObserver(activities: [.beforeWaiting, .afterWaiting]) { _, activity in
      asleep.withLock { $0 = activity == .beforeWaiting }
    }
    loop.add(observer, to: .default)
    waitUntil("the loop to sleep") { asleep.withLock { $0 } }
    let ranOnLoop = Locked<Bool?>(nil)
    // Nothing else will wake this loop: only perform's own wake-up gets the block run.
    #expect(loop.perform { ranOnLoop.withLock { $0 = loop.isOnLoopThread } })
    waitUntil("the block") { ranOnLoop.withLock { $0 } != nil }
    #expect(ranOnLoop.withLock { $0 } == true)
    observer.invalidate()
    loop.shutdownAndWait()
  }

  @Test func blocksRunOnlyInTheModesTheyWereGiven() throws {
    let loop = try RunLoopThread(name: "perform-modes")
    let special: RunLoopMode = "special"
    let log = EngineEventLog()
    loop.perform(inModes: [special]) {
      log("special block")
      RunLoopThread.current.stop()  // ends the nested run below
    }
    // The loop runs the default mode: the block waits.
    try loop.performAndWait {}
    try loop.performAndWait {}
    #expect(log.entries.isEmpty)
    let nested = try loop.performAndWait(inModes: [.default]) {
      RunLoopThread.current.run(mode: special, until: .now.advanced(by: .seconds(60)))
    }
    #expect(nested == .stopped)
    #expect(log.entries == ["special block"])
    loop.shutdownAndWait()
  }

  @Test func commonBlocksRunInEveryCommonModeOnly() throws {
    let loop = try RunLoopThread(name: "perform-common")
    let custom: RunLoopMode = "custom"
    let log = EngineEventLog()
    // A block for the common modes (the default), sent while the loop runs `custom`, which is not
    // in the common set yet: it waits until `custom` joins the set.
    let results = try loop.performAndWait(inModes: [.default]) { () -> [RunLoopRunResult] in
      let current = RunLoopThread.current
      current.add(LoopTimer(after: .seconds(3_600)) { _ in }, to: custom)
      current.perform { log("common block") }
      let before = current.run(mode: custom, until: .now.advanced(by: .milliseconds(20)))
      log("joined")
      current.addModeToCommonModes(custom)
      current.perform { current.stop() }
      let after = current.run(mode: custom, until: .now.advanced(by: .seconds(60)))
      return [before, after]
    }
    #expect(results == [.timedOut, .stopped])
    #expect(log.entries == ["joined", "common block"])
    loop.shutdownAndWait()
  }

  @Test func blocksRunInTheOrderTheyWerePerformed() throws {
    let loop = try RunLoopThread(name: "perform-order")
    let count = 2_000 * stressFactor
    let fromHere = Locked<[Int]>([])
    for index in 0..<count { loop.perform { fromHere.withLock { $0.append(index) } } }
    // Two more producers: each one's blocks keep their order (they interleave with each other).
    let perProducer = Locked<[[Int]]>([[], []])
    let producers = (0..<2).map { producer in
      EngineTestThread.start {
        for index in 0..<count { loop.perform { perProducer.withLock { $0[producer].append(index) } } }
      }
    }
    producers.forEach { $0.join() }
    try loop.performAndWait {}  // after every block above
    #expect(fromHere.withLock { $0 } == Array(0..<count))
    #expect(perProducer.withLock { $0 } == [Array(0..<count), Array(0..<count)])
    loop.shutdownAndWait()
  }

  @Test func performAndWaitReturnsTheValueAndRethrows() throws {
    let loop = try RunLoopThread(name: "perform-wait")
    #expect(try loop.performAndWait { 6 * 7 } == 42)
    #expect(try loop.performAndWait { loop.isOnLoopThread })
    #expect(throws: Failure(code: 7)) { try loop.performAndWait { () throws -> Int in throw Failure(code: 7) } }
    // The loop is fine after a block threw.
    #expect(try loop.performAndWait { "still running" } == "still running")
    loop.shutdownAndWait()
  }

  @Test func performAndWaitOnTheLoopsOwnThreadRunsInline() throws {
    let loop = try RunLoopThread(name: "perform-inline")
    let log = EngineEventLog()
    let inner = try loop.performAndWait { () -> Int in
      log("outer before")
      let value = try loop.performAndWait { () -> Int in
        log("inner")
        return 7
      }
      log("outer after")
      return value
    }
    #expect(inner == 7)
    #expect(log.entries == ["outer before", "inner", "outer after"])
    loop.shutdownAndWait()
  }

  @Test func performAndWaitOnARunningCurrentLoopFromAnotherThread() {
    let value = EngineTestThread.run { () -> Int? in
      let loop = RunLoopThread.current
      loop.add(LoopTimer(after: .seconds(3_600)) { _ in }, to: .default)
      let answer = Locked<Int?>(nil)
      let helper = EngineTestThread.start {
        let value = try? loop.performAndWait { 99 }
        answer.withLock { $0 = value }
        loop.stop()
      }
      _ = loop.run(mode: .default, until: .now.advanced(by: .seconds(60)))
      helper.join()
      return answer.withLock { $0 }
    }
    #expect(value == 99)
  }

  @Test func performedBlocksDoNotEndARunAsHandledSource() {
    let (result, ran) = EngineTestThread.run { () -> (RunLoopRunResult, Bool) in
      let loop = RunLoopThread.current
      loop.add(LoopTimer(after: .seconds(3_600)) { _ in }, to: .default)
      let ran = Locked(false)
      loop.perform { ran.withLock { $0 = true } }
      let result = loop.run(mode: .default, until: .now.advanced(by: .milliseconds(20)), returnAfterSourceHandled: true)
      return (result, ran.withLock { $0 })
    }
    #expect(ran)
    #expect(result == .timedOut)
  }

  @Test func aBlockForAnotherModeDoesNotKeepAnEmptyModeRunning() {
    // SPEC §1/§6: a mode with nothing to watch finishes; CF counts only the pending blocks that
    // could run in that mode. A 60 s limit turns a hang into a failure.
    let result = EngineTestThread.run { () -> RunLoopRunResult in
      let loop = RunLoopThread.current
      loop.perform(inModes: ["elsewhere"]) {}
      return loop.run(mode: .default, until: .now.advanced(by: .seconds(60)))
    }
    #expect(result == .finished)
  }

  @Test func aPendingBlockForTheRunningModeKeepsItsRunAliveUntilItRuns() {
    let (result, ran) = EngineTestThread.run { () -> (RunLoopRunResult, Bool) in
      let loop = RunLoopThread.current
      let ran = Locked(false)
      loop.perform { ran.withLock { $0 = true } }
      let result = loop.run(mode: .default, until: .now.advanced(by: .seconds(60)))
      return (result, ran.withLock { $0 })
    }
    #expect(ran)
    #expect(result == .finished)
  }

  @Test func aShutDownLoopRefusesBlocks() throws {
    let loop = try RunLoopThread(name: "perform-shutdown")
    loop.shutdownAndWait()
    #expect(!loop.perform {})
    #expect(throws: RunLoopError.shutDown(loop: "perform-shutdown")) { try loop.performAndWait { 1 } }
  }
}
