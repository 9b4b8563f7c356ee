import Testing

@testable import AsyncRunLoop

// The three ways to put work on a loop thread that the README shows, compiled and checked here.

/// 1. An actor pinned to a loop: conform to `LoopActor` and store the loop.
actor SensorReader: LoopActor {
  nonisolated let loop: RunLoopThread
  private var readings: [Int] = []

  init(loop: RunLoopThread) { self.loop = loop }

  func record(_ value: Int) -> Int {
    loop.checkIsolated()  // we are on the loop's thread
    readings.append(value)
    return readings.count
  }
}

/// 2. A global actor whose actor lives on a named loop.
@globalActor
actor RenderActor: GlobalActor, LoopActor {
  static let shared = RenderActor()
  /// Created on first use; the thread runs until process exit (or `shutdown()`).
  nonisolated let loop: RunLoopThread = .start(named: "render")
}

@RenderActor
final class Renderer {
  var frames = 0
  func drawFrame() -> Bool {
    frames += 1
    return RenderActor.shared.loop.isOnLoopThread
  }
}

@Suite("Executor pinning examples")
struct ExecutorPinningExamples {
  @Test func loopActorRunsOnItsLoop() async throws {
    let loop = try RunLoopThread(name: "sensors")
    defer { loop.shutdownAndWait() }
    let reader = SensorReader(loop: loop)
    #expect(await reader.record(1) == 1)
    #expect(await reader.record(2) == 2)
  }

  @Test func globalActorRunsOnItsNamedLoop() async {
    let renderer = Renderer()
    #expect(await renderer.drawFrame())
    #expect(await renderer.frames == 1)
  }

  @Test func taskExecutorPreferenceRunsNonisolatedWorkOnTheLoop() async throws {
    let loop = try RunLoopThread(name: "worker")
    defer { loop.shutdownAndWait() }
    // 3a. A task that prefers the loop.
    let onLoop = await Task(executorPreference: loop) { loop.isOnLoopThread }.value
    #expect(onLoop)
    // 3b. A scope that prefers the loop.
    let alsoOnLoop = await withTaskExecutorPreference(loop) { loop.isOnLoopThread }
    #expect(alsoOnLoop)
  }
}
