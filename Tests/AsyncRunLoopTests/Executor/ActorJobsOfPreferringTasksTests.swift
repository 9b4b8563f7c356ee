import Synchronization
import Testing

@testable import AsyncRunLoop

/// An actor pinned to a loop that counts its steps and checks, in each, that it runs isolated on
/// its loop's thread and that no other step overlaps it.
private actor HopCountingActor: LoopActor {
  nonisolated let loop: RunLoopThread
  private var inside = false
  private(set) var calls = 0
  private(set) var violations = 0

  init(loop: RunLoopThread) { self.loop = loop }

  /// Awaits `hops` times inside the actor (each `await` a hop back to it), yielding every
  /// `yieldEvery`-th time.
  func hop(_ hops: Int, through helper: HopHelper, yieldEvery: Int = 0) async {
    for index in 0..<hops {
      enter()
      leave()  // (an `await` lets other calls in: actors are reentrant)
      _ = await helper.touch()
      if yieldEvery > 0, index % yieldEvery == 0 { await Task.yield() }
    }
  }

  private func enter() {
    if inside || !loop.isOnLoopThread { violations += 1 }
    loop.checkIsolated()  // traps if the actor's code runs where the loop is not isolated
    inside = true
    calls += 1
  }

  private func leave() { inside = false }
}

/// A second actor on the same loop, so each call of `HopCountingActor.hop` leaves and re-enters it.
private actor HopHelper: LoopActor {
  nonisolated let loop: RunLoopThread
  private var touches = 0
  init(loop: RunLoopThread) { self.loop = loop }
  func touch() -> Int {
    touches += 1
    return touches
  }
}

/// An actor's job whose task prefers the loop runs on the loop's task executor once it has
/// enqueued itself from its own run (`JobRole.serialOnTaskExecutor`); every other task's jobs keep
/// the plain serial role. Whatever the task prefers, the actor's code runs isolated on the loop
/// thread, one call at a time, and every call completes.
@Suite("Actor jobs of tasks that prefer a task executor", .serialized, .timeLimit(.minutes(5)))
struct ActorJobsOfPreferringTasksTests {
  static let hops = 2_000

  @Test(arguments: ["loop", "detached", "other loop"])
  func everyHopRunsIsolatedOnTheLoopWhateverTheTaskPrefers(_ preference: String) async throws {
    let outcome = try await withWatchdog(timeout: .seconds(60), "hops preferring \(preference)") {
      () async throws -> (calls: Int, violations: Int) in
      let loop = try RunLoopThread(name: "prefer-\(preference)")
      let other = try RunLoopThread(name: "prefer-other")
      let actor = HopCountingActor(loop: loop)
      let helper = HopHelper(loop: loop)
      let work: @Sendable () async -> Void = { await actor.hop(Self.hops, through: helper, yieldEvery: 97) }
      switch preference {
      case "loop": await Task(executorPreference: loop) { await work() }.value
      case "other loop": await Task(executorPreference: other) { await work() }.value
      default: await Task.detached { await work() }.value
      }
      let result = (calls: await actor.calls, violations: await actor.violations)
      await execShutdown(loop)
      await execShutdown(other)
      return result
    }
    #expect(outcome?.calls == Self.hops)
    #expect(outcome?.violations == 0)
  }

  /// Several tasks with different preferences call one actor at once: still one call at a time.
  @Test func tasksWithDifferentPreferencesShareOneActorSerially() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(60), "mixed preferences") {
      () async throws -> (calls: Int, violations: Int) in
      let loop = try RunLoopThread(name: "prefer-mixed")
      let other = try RunLoopThread(name: "prefer-mixed-other")
      let actor = HopCountingActor(loop: loop)
      let helper = HopHelper(loop: loop)
      let work: @Sendable () async -> Void = { await actor.hop(500, through: helper, yieldEvery: 13) }
      let tasks = [
        Task(executorPreference: loop) { await work() },
        Task(executorPreference: loop) { await work() },
        Task(executorPreference: other) { await work() },
        Task.detached { await work() },
      ]
      for task in tasks { await task.value }
      let result = (calls: await actor.calls, violations: await actor.violations)
      await execShutdown(loop)
      await execShutdown(other)
      return result
    }
    #expect(outcome?.calls == 2_000)
    #expect(outcome?.violations == 0)
  }

  /// Nonisolated async code called from the actor by a task that prefers the loop runs on the
  /// loop's thread (the task executor), and the actor's code after it is isolated again.
  @Test func nonisolatedCodeOfAPreferringTaskRunsOnTheLoopThread() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "nonisolated under preference") {
      () async throws -> Bool in
      let loop = try RunLoopThread(name: "prefer-nonisolated")
      let actor = ThreadReportingActor(loop: loop)
      let onLoop = await Task(executorPreference: loop) { await actor.nonisolatedRunsOnLoop(times: 50) }.value
      await execShutdown(loop)
      return onLoop
    }
    #expect(outcome == true)
  }
}

private actor ThreadReportingActor: LoopActor {
  nonisolated let loop: RunLoopThread
  init(loop: RunLoopThread) { self.loop = loop }

  func nonisolatedRunsOnLoop(times: Int) async -> Bool {
    var allOnLoop = true
    for _ in 0..<times {
      allOnLoop = await reportsLoopThread(loop) && allOnLoop
      loop.checkIsolated()
    }
    return allOnLoop
  }
}

@concurrent
private func reportsLoopThread(_ loop: RunLoopThread) async -> Bool {
  loop.isOnLoopThread
}
