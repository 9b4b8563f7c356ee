import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

/// performAndWait runs inline on its own loop, completes in chains, and is refused rather than deadlocked.
@Suite(
  "performAndWait runs inline on its own loop, completes in chains, and is refused rather than deadlocked", .serialized,
  .timeLimit(.minutes(10)))
struct PerformAndWaitReturnsTests {
  /// `performAndWait` from a job on the loop (an actor, a task preferring it) runs inline.
  @Test func performAndWaitFromAJobOnTheLoopRunsInline() async throws {
    let loop = try RunLoopThread(name: "paw-inline")
    let outcome = try await withWatchdog(timeout: .seconds(20), "performAndWait inline") {
      try await withTaskExecutorPreference(loop) { () throws -> Bool in
        let inline = Locked(false)
        try loop.performAndWait { inline.withLock { $0 = true } }
        return inline.withLock { $0 }  // set before performAndWait returned: it ran inline
      }
    }
    #expect(outcome == true)
    await execShutdown(loop)
  }

  /// The same stale edge, older than today's change: right after A's `performAndWait` on B ended,
  /// B's next block calls `A.performAndWait`, which could only deadlock if A still waited for B.
  /// It should run the block; it throws `wouldDeadlock` instead while A's edge lingers.
  @Test
  func performAndWaitRightAfterTheTargetsWaitEndedIsNotRefused() async throws {
    let refused = try await withWatchdogOnThread(timeout: .seconds(30), "stale edge, performAndWait") { () -> Int in
      var refused = 0
      for _ in 0..<30 {
        guard let first = try? RunLoopThread(name: "pa"), let second = try? RunLoopThread(name: "pb")
        else { continue }
        let outcome = Locked<Bool?>(nil)
        let done = TestGate()
        first.perform {
          _ = try? second.performAndWait {
            second.perform {
              let ran = (try? first.performAndWait { true }) ?? false
              outcome.withLock { $0 = ran }
              done.open()
            }
          }
        }
        #expect(done.wait(timeout: .seconds(10)))
        if outcome.withLock({ $0 }) == false { refused += 1 }
        first.shutdownAndWait()
        second.shutdownAndWait()
      }
      return refused
    }
    #expect(refused == 0, "refused \(refused ?? -1) of 30 times")
  }

  /// Loop A's block waits for loop B, whose block waits for A: A is waiting for B, so B's
  /// `performAndWait` on A is refused (`wouldDeadlock`) without performing its block — which is
  /// then released, not kept — and A's wait completes.
  @Test func aPerformAndWaitRefusedForACycleReleasesItsBlock() async throws {
    let first = try RunLoopThread(name: "cycle-a")
    let second = try RunLoopThread(name: "cycle-b")
    let deaths = AtomicCounter()
    let ran = AtomicCounter()
    let canary = Guarded<ReleaseCanary?>(ReleaseCanary(deaths))
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "the cycle") { () -> String in
      try first.performAndWait { () -> String in
        (try? second.performAndWait { () -> String in
          let captured = canary.withLock { value in
            defer { value = nil }
            return value!
          }
          do {
            try first.performAndWait {
              captured.touch()
              ran.increment()
            }
            return "inner ran"
          } catch {
            if case .wouldDeadlock = error as? RunLoopError { return "refused" }
            return "\(error)"
          }
        }) ?? "outer refused"
      }
    }
    #expect(outcome == "refused", "\(outcome ?? "hung")")
    #expect(ran.current == 0)
    #expect(await eventuallyWithin { deaths.current == 1 }, "the refused block was kept")
    await execShutdown(first)
    await execShutdown(second)
  }

  /// A `RunLoopThread.current` loop whose thread never runs it: a `performAndWait` from another
  /// thread blocks until the loop is shut down, then throws `RunLoopError.shutDown` at once ("a
  /// `RunLoopThread.current` loop shut down before the block started, while its thread is out of a
  /// run [...] releases the caller with `RunLoopError.shutDown` and skips the block"). The skipped
  /// block is released at the latest when the thread exits (and drains the loop).
  @Test func aSkippedPerformAndWaitOnACurrentLoopReleasesCallerAndBlock() async throws {
    let published = Guarded<RunLoopThread?>(nil)
    let exit = TestGate()
    let exited = TestGate()
    startThread(detached: true) {
      published.withLock { $0 = RunLoopThread.current }
      exit.wait(timeout: .seconds(3600))
      published.withLock { $0 = nil }
      exited.open()
    }
    defer { exit.open() }
    let loop = try #require(
      await execOnNewThread { () -> RunLoopThread? in
        _ = poll(timeout: .seconds(10)) { published.snapshot != nil }
        return published.snapshot
      })
    let deaths = AtomicCounter()
    let ran = AtomicCounter()
    let canary = Guarded<ReleaseCanary?>(ReleaseCanary(deaths))
    let started = TestGate()
    let caller = Task {
      try await withWatchdogOnThread(timeout: .seconds(30), "performAndWait on a current loop") { () -> String in
        let captured = canary.withLock { value in
          defer { value = nil }
          return value!
        }
        started.open()
        do {
          try loop.performAndWait {
            captured.touch()
            ran.increment()
          }
          return "ran"
        } catch {
          return "\(error)"
        }
      }
    }
    _ = await execOnNewThread { started.wait(timeout: .seconds(10)) }
    // The block is in the loop's inbox before the shutdown.
    #expect(await eventuallyWithin { loop.shared.inboxLock.withLock { !loop.shared.inbox.performs.isEmpty } })
    loop.shutdown()
    let outcome = try await caller.value
    #expect(outcome == "\(RunLoopError.shutDown(loop: loop.name))", "\(outcome ?? "hung")")
    exit.open()
    _ = await execOnNewThread { exited.wait(timeout: .seconds(10)) }
    #expect(await eventuallyWithin { deaths.current == 1 }, "the skipped block was never released")
    #expect(ran.current == 0)
  }

  /// A job of loop B's actor calls `performAndWait` on loop A, and A's block calls an
  /// unrelated loop C synchronously: no cycle, so everything completes.
  @Test func performAndWaitChainsAcrossLoopsComplete() async throws {
    let loops = try (0..<3).map { try RunLoopThread(name: "chain-\($0)") }
    let actor = OverlapRecordingActor(loop: loops[1])
    let value = try await withWatchdog(timeout: .seconds(20), "a chain of performAndWait") {
      try await actor.chain(through: loops[0], then: loops[2])
    }
    #expect(value == 3)
    for loop in loops { await execShutdown(loop) }
  }

  /// `next()` hands out the loops round-robin; `shutdownAndWait()` shuts each down, after which
  /// `perform` refuses and a job still runs (on the fallback).
  @Test func loopGroupRoundRobinAndShutdown() async throws {
    let group = try LoopGroup(count: 3, name: "group")
    let handed = (0..<7).map { _ in group.next() }
    #expect(
      handed.map(\.name) == [
        "group-0", "group-1", "group-2", "group-0", "group-1", "group-2", "group-0",
      ])
    let actor = OverlapRecordingActor(loop: group.loops[2])
    #expect(await actor.call())
    await execOnNewThread { group.shutdownAndWait() }
    #expect(group.loops.allSatisfy { $0.isShutDown })
    #expect(group.loops.allSatisfy { !$0.perform {} })
    let late = try await withWatchdog(timeout: .seconds(20), "a late call") { await actor.call() }
    #expect(late == true)
  }
}
