import Dispatch
import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("Actor sleeps and the loop's timers", .serialized, .timeLimit(.minutes(10)))
struct ActorSleepTests {
  /// `Task.sleep` in a `LoopActor` method (documented on `LoopSerialExecutor`'s scheduling
  /// conformance): with the Swift 6.3 runtime the standard library's sleep leaves the actor before
  /// it looks for a scheduling executor, so it waits on the global executor's timers; it still
  /// ends, not early, back on the loop. (`LoopClock()` from the same method sleeps on the loop's
  /// own timers: `defaultClockInALoopActorSleepsOnItsLoop`.)
  @Test func taskSleepInALoopActorEndsOnTimeBackOnTheLoop() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "actor sleeps") { () async throws -> Int in
      let loop = try RunLoopThread(name: "actor-nap")
      let actor = NappingActor(loop: loop)
      var onLoop = 0
      for _ in 0..<3 {
        let start = ContinuousClock.now
        if await actor.nap(), ContinuousClock.now - start >= .milliseconds(2) { onLoop += 1 }
      }
      await execShutdown(loop)
      return onLoop
    }
    #expect(outcome == 3)
  }
}

extension ActorSleepTests {
  /// `LoopClock()` "uses the calling thread's loop if it is a loop thread created with
  /// `RunLoopThread(name:)`": under the loop's task-executor preference its sleeps are timers of
  /// that loop.
  @Test func defaultClockUnderThePreferenceSleepsOnThatLoop() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "LoopClock() under preference") {
      () async throws -> UInt64 in
      let loop = try RunLoopThread(name: "default-pref")
      let before = await execOnNewThread { timerSchedulings(loop) }
      await withTaskExecutorPreference(loop) {
        for _ in 0..<3 { try? await LoopClock().sleep(for: .milliseconds(2)) }
      }
      let after = await execOnNewThread { timerSchedulings(loop) }
      await execShutdown(loop)
      return after - before
    }
    #expect((outcome ?? 0) >= 3)
  }

  /// The same from a `LoopActor` method, whose code runs on the loop thread: `LoopClock()`'s
  /// sleep is a nonisolated async function, so it runs on the global pool, finds no current loop
  /// and sleeps on the shared timer loop instead.
  @Test
  func defaultClockInALoopActorSleepsOnItsLoop() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "LoopClock() in an actor") {
      () async throws -> UInt64 in
      let loop = try RunLoopThread(name: "default-actor")
      let actor = NappingActor(loop: loop)
      let before = await execOnNewThread { timerSchedulings(loop) }
      for _ in 0..<3 { _ = await actor.napOnDefaultClock() }
      let after = await execOnNewThread { timerSchedulings(loop) }
      await execShutdown(loop)
      return after - before
    }
    #expect((outcome ?? 0) >= 3)
  }
}

@Suite("Where code runs after a sleep", .serialized, .timeLimit(.minutes(10)))
struct WhereCodeRunsAfterASleepTests {
  /// A task that prefers the loop is back on the loop thread after each `Task.sleep`, with any
  /// clock; so is an actor on the loop.
  @Test func codeAfterASleepUnderThePreferenceRunsOnTheLoop() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "after sleep") { () async throws -> [Int] in
      let loop = try RunLoopThread(name: "after-sleep")
      let onLoop = await Task(executorPreference: loop) { () -> [Int] in
        var counts = [0, 0, 0]
        for _ in 0..<5 {
          try? await Task.sleep(for: .milliseconds(1))
          if loop.isOnLoopThread { counts[0] += 1 }
          try? await Task.sleep(for: .milliseconds(1), clock: .suspending)
          if loop.isOnLoopThread { counts[1] += 1 }
          try? await loop.clock.sleep(for: .milliseconds(1))
          if loop.isOnLoopThread { counts[2] += 1 }
        }
        return counts
      }.value
      let actor = NappingActor(loop: loop)
      var actorOnLoop = 0
      for _ in 0..<5 where await actor.nap() { actorOnLoop += 1 }
      await execShutdown(loop)
      return onLoop + [actorOnLoop]
    }
    #expect(outcome == [5, 5, 5, 5])
  }
}
