import Dispatch
import Glibc
import Testing

@_spi(Testing) @testable import AsyncRunLoop

@Suite("Sleeps moved off a shut-down loop", .serialized, .timeLimit(.minutes(10)))
struct SleepsMovedOffAShutDownLoopTests {
  /// A long `Task.sleep` under the loop's preference or in an actor on the loop, moved elsewhere
  /// by the loop's shutdown, still ends with `CancellationError` when its task is cancelled.
  @Test func cancellingASleepMovedByShutdownEndsIt() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "moved sleeps cancelled") {
      () async throws -> [Bool] in
      let loop = try RunLoopThread(name: "moved-sleep")
      let actor = HourSleepingActor(loop: loop)
      let started = AtomicCounter()
      let preferred = Task(executorPreference: loop) { () -> Bool in
        started.increment()
        do {
          try await Task.sleep(for: .seconds(3600))
          return false
        } catch { return error is CancellationError }
      }
      #expect(await pollEveryMillisecond { started.current == 1 && loop.scheduledJobCount >= 1 })
      let isolated = Task { await actor.sleepLong() }
      try await Task.sleep(for: .milliseconds(10))
      await execShutdown(loop)
      preferred.cancel()
      isolated.cancel()
      return [await preferred.value, await isolated.value]
    }
    #expect(outcome == [true, true])
  }

  /// Child tasks of a group under the loop's preference all run on the loop thread.
  @Test func taskGroupChildrenUnderPreferenceRunOnTheLoop() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "group children") { () async throws -> Int in
      let loop = try RunLoopThread(name: "group-pref")
      let onLoop = await withTaskExecutorPreference(loop) {
        await withTaskGroup(of: Bool.self) { group in
          for _ in 0..<100 { group.addTask { loop.isOnLoopThread } }
          var count = 0
          for await on in group where on { count += 1 }
          return count
        }
      }
      await execShutdown(loop)
      return onLoop
    }
    #expect(outcome == 100)
  }
}
