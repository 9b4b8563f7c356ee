import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

@Suite("Cross-loop waits and performAndWait racing shutdown", .timeLimit(.minutes(10)))
struct CrossLoopWaitsRacingShutdownTests {
  /// A block that throws through `performAndWait` leaves no wait-for edge behind: afterwards the
  /// other loop may wait for the first one (which is free) and gets its value.
  @Test func aThrowingBlockLeavesNoWaitForEdge() async throws {
    let loopA = try RunLoopThread(name: "throw-a")
    let loopB = try RunLoopThread(name: "throw-b")
    let first = await runOnLoopThread(loopA) { () -> String in
      describeOutcome(Result { try loopB.performAndWait { () throws -> Int in throw TestBlockError() } })
    }
    #expect(first?.hasPrefix("other") == true, "B's block threw TestBlockError: \(String(describing: first))")
    let back = try await withWatchdogOnThread(timeout: .seconds(20), "B waiting for A after A's wait ended") {
      try loopB.performAndWait { describeOutcome(Result { try loopA.performAndWait { 1 } }) }
    }
    #expect(back == "value 1")
    await execShutdown(loopA)
    await execShutdown(loopB)
  }

  /// A refused wait (a cycle A → B → A) leaves nothing behind either: the error reaches the
  /// outermost caller, and the same loops then wait for each other in either direction.
  @Test func aRefusedCycleLeavesNoEdgeBehind() async throws {
    let loopA = try RunLoopThread(name: "cyc-a")
    let loopB = try RunLoopThread(name: "cyc-b")
    let refused = try await withWatchdogOnThread(timeout: .seconds(20), "a cycle A → B → A") {
      describeOutcome(
        Result {
          try loopA.performAndWait {
            try loopB.performAndWait { try loopA.performAndWait { 0 } }
          }
        })
    }
    #expect(refused == "wouldDeadlock")
    for _ in 0..<3 {
      let ab = try await withWatchdogOnThread(timeout: .seconds(20), "A → B after the refusal") {
        try loopA.performAndWait { try loopB.performAndWait { 2 } }
      }
      #expect(ab == 2)
      let ba = try await withWatchdogOnThread(timeout: .seconds(20), "B → A after the refusal") {
        try loopB.performAndWait { try loopA.performAndWait { 3 } }
      }
      #expect(ba == 3)
    }
    await execShutdown(loopA)
    await execShutdown(loopB)
  }

  /// Three loops: a chain through all three completes; closing it into a cycle of three is
  /// refused, at the third hop, without running the innermost block.
  @Test func aChainOfThreeCompletesAndACycleOfThreeIsRefused() async throws {
    let loops = try (0..<3).map { try RunLoopThread(name: "three-\($0)") }
    let innermostRan = AtomicCounter()
    let chain = try await withWatchdogOnThread(timeout: .seconds(20), "a chain of three") {
      try loops[0].performAndWait {
        try loops[1].performAndWait { try loops[2].performAndWait { 3 } }
      }
    }
    #expect(chain == 3)
    let cycle = try await withWatchdogOnThread(timeout: .seconds(20), "a cycle of three") {
      describeOutcome(
        Result {
          try loops[0].performAndWait {
            try loops[1].performAndWait {
              try loops[2].performAndWait {
                try loops[0].performAndWait { () -> Int in
                  innermostRan.increment()
                  return 0
                }
              }
            }
          }
        })
    }
    #expect(cycle == "wouldDeadlock")
    #expect(innermostRan.current == 0)
    for loop in loops { await execShutdown(loop) }
  }

  /// A block of another loop calls back into a loop whose (current-loop) thread is blocked in
  /// `performAndWait` for that other loop: refused with `wouldDeadlock`, not a hang. And while
  /// the current loop's thread runs its loop, the same call completes.
  @Test func aCurrentLoopBlockedWaitingIsSeenInTheGraph() async throws {
    let loopA = try RunLoopThread(name: "cur-a")
    let thread = CommandedCurrentLoopThread()
    let current = await thread.loop()
    let blocked = try await withWatchdog(timeout: .seconds(20), "A's block calling the waiting current loop") {
      await thread.exec { _ in
        describeOutcome(Result { try loopA.performAndWait { try current.performAndWait { 1 } } })
      }
    }
    #expect(blocked == "wouldDeadlock")
    // The current loop's thread runs a run now: A's block reaches it.
    let running = await execOnNewThread { () -> String in
      let done = TestGate()
      let result = Guarded("none")
      thread.send { loop in
        let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
        loop.add(keepAlive)
        while !done.wait(timeout: .zero) { loop.run(for: .milliseconds(5)) }
        keepAlive.invalidate()
      }
      let value = describeOutcome(Result { try loopA.performAndWait { try current.performAndWait { 7 } } })
      result.withLock { $0 = value }
      done.open()
      return result.snapshot
    }
    #expect(running == "value 7")
    thread.quit()
    await execShutdown(loopA)
  }

  /// `performAndWait` on an owned loop racing its `shutdown()`: exactly one of the value (the
  /// block ran once) or `shutDown` (the block never ran), never a hang.
  @Test func performAndWaitRacingShutdownOfAnOwnedLoop() async throws {
    let outcomes = try await withWatchdogOnThread(timeout: .seconds(30), "owned-loop races") { () -> [String] in
      var wrong: [String] = []
      repeatRounds(30, budget: .seconds(3)) { round in
        guard let loop = try? RunLoopThread(name: "race-\(round)") else { return }
        let ran = AtomicCounter()
        let outcome = Guarded("none")
        race([
          { outcome.withLock { $0 = describeOutcome(Result { try loop.performAndWait { ran.increment() } }) } },
          { loop.shutdown() },
        ])
        loop.shutdownAndWait()
        let seen = outcome.snapshot
        let ok = (seen == "value 1" && ran.current == 1) || (seen == "shutDown" && ran.current == 0)
        if !ok { wrong.append("round \(round): \(seen), ran \(ran.current)") }
      }
      return wrong
    }
    #expect(outcomes == [])
  }

  /// The same race on a `RunLoopThread.current` loop whose thread keeps making short runs: one
  /// outcome each, and the block never runs after the caller was told `shutDown` (checked once
  /// the thread has exited and its loop drained).
  @Test func performAndWaitRacingShutdownOfARunningCurrentLoop() async throws {
    let outcomes = try await withWatchdogOnThread(timeout: .seconds(30), "current-loop races") { () -> [String] in
      var wrong: [String] = []
      repeatRounds(25, budget: .seconds(3)) { round in
        let owner = ShortRunsCurrentLoopThread()
        let loop = owner.loopBlocking()
        let ran = AtomicCounter()
        let outcome = Guarded("none")
        race([
          { outcome.withLock { $0 = describeOutcome(Result { try loop.performAndWait { ran.increment() } }) } },
          { loop.shutdown() },
        ])
        owner.finish()
        let seen = outcome.snapshot
        let ok = (seen == "value 1" && ran.current == 1) || (seen == "shutDown" && ran.current == 0)
        if !ok { wrong.append("round \(round): \(seen), ran \(ran.current)") }
      }
      return wrong
    }
    #expect(outcomes == [])
  }

  /// After the current loop's jobs were diverted, its own thread answers false to the
  /// isolation question, while a block `performAndWait` runs inline there.
  @Test func aDivertedCurrentLoopsThreadIsNotIsolatedButRunsItsOwnPerformAndWaitInline() async throws {
    let thread = CommandedCurrentLoopThread()
    let loop = await thread.loop()
    loop.shutdown()
    let answers = await thread.exec { loop -> (Bool?, String) in
      let isolated = loop.isIsolatingCurrentContext()
      let inline = describeOutcome(Result { try loop.performAndWait { loop.isOnLoopThread } })
      return (isolated, inline)
    }
    #expect(answers.0 == false)
    #expect(answers.1 == "value true")
    // From another thread the shut-down loop refuses.
    let outside = await execOnNewThread { describeOutcome(Result { try loop.performAndWait { 1 } }) }
    #expect(outside == "shutDown")
    thread.quit()
  }
}
