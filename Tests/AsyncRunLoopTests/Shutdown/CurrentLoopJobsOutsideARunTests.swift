import Glibc
import Testing

@testable import AsyncRunLoop

// MARK: - 4. Current loops take jobs only inside a run

@Suite("A current loop's jobs sent outside a run are not lost", .serialized, .timeLimit(.minutes(10)))
struct CurrentLoopJobsOutsideARunTests {
  /// While a current loop's thread is out of any run, an actor on the loop has 200 calls waiting;
  /// the thread adds and removes members (loop-thread calls that collect the inbox), then the loop
  /// is shut down. Promised: outside a run every accepted job stays in the inbox, so the shutdown
  /// hands them all to the fallback in order: every call completes and no two run at once.
  @Test func loopThreadAddsAndRemovesOutsideARunLeaveJobsInTheInbox() async throws {
    let thread = CommandedCurrentLoopThread()
    let loop = await thread.loop()
    let actor = NestedRunActor(loop: loop)
    let calls = Task {
      await withTaskGroup(of: Void.self) { group in
        for _ in 0..<200 { group.addTask { await actor.call() } }
      }
    }
    _ = await execOnNewThread {
      waitUntil("the calls queued") { loop.shared.inboxLock.withLock { loop.shared.inbox.jobs.count } >= 50 }
    }
    let done = await thread.exec { loop -> Bool in
      let timer = LoopTimer(after: .seconds(3600)) { _ in }
      let source = InputSource(perform: { _ in })
      for _ in 0..<20 {
        loop.add(timer, to: drainModeX)
        loop.add(source, to: .common)
        loop.remove(timer, from: drainModeX)
        loop.remove(source, from: .common)
      }
      timer.invalidate()
      source.invalidate()
      return true
    }
    #expect(done)
    loop.shutdown()
    let finished: Bool? = try await withWatchdog(timeout: .seconds(20), "the calls") {
      await calls.value; return true
    }
    thread.quit()
    #expect(finished != nil)
    #expect(actor.overlap.maximum <= 1, "two jobs of the actor ran at once")
    #expect(await actor.calls == 200)
  }
}

extension CurrentLoopJobsOutsideARunTests {
  /// The loop thread removes a timer from mode X (it stays in mode M) while another thread adds
  /// it to X again, 10,000 rounds, at varying moments. Promised (`bind`/`unbind`): the loop
  /// applies the calls on a member in the order its binding changed, so once both calls have
  /// returned and the changes are applied, the loop's modes for the timer are its binding's.
  @Test
  func aLoopThreadRemoveRacingAnAddLeavesLoopAndBindingAgreeing() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(60), "remove racing add") {
      try raceTimerMembership(loopThreadRemoves: true, rounds: 3_000 * stressFactor)
    }
    guard let outcome else { return }
    #expect(outcome.mismatches == 0, "\(outcome.mismatches) rounds: \(outcome.example)")
  }

  /// The same with the roles reversed: the loop thread adds the timer to X while another thread
  /// removes it from X. Promised: as above, loop and binding agree after every round.
  @Test
  func aLoopThreadAddRacingARemoveLeavesLoopAndBindingAgreeing() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(60), "add racing remove") {
      try raceTimerMembership(loopThreadRemoves: false, rounds: 3_000 * stressFactor)
    }
    guard let outcome else { return }
    #expect(outcome.mismatches == 0, "\(outcome.mismatches) rounds: \(outcome.example)")
  }
}
