import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("The executor runs each job once, in order", .serialized, .timeLimit(.minutes(10)))
struct ExecutorJobOrderTests {
  /// Three tasks call an actor pinned to a loop 300 times each while another thread shuts the
  /// loop down. Promised: every job the loop accepted runs exactly once, later ones on the
  /// fallback queue "still isolated to the loop's executor", so no call hangs, each returns once,
  /// the actor's count is exact, and every call ran isolated to the loop.
  @Test func actorCallsRacingShutdownAllCompleteIsolated() async throws {
    for round in 0..<3 {
      let loop = try RunLoopThread(name: "actor")
      let counter = CallCountingActor(loop: loop)
      let outcome = try await withWatchdog(timeout: .seconds(30), "actor calls vs shutdown") {
        () async -> (returned: Int, misisolated: Int, final: Int) in
        startThread(detached: true) {
          usleep(UInt32(300 + round * 700))
          loop.shutdown()
        }
        let returned = await withTaskGroup(of: Int.self) { group in
          for _ in 0..<3 {
            group.addTask {
              var count = 0
              for _ in 0..<300 {
                _ = await counter.call()
                count += 1
              }
              return count
            }
          }
          return await group.reduce(0, +)
        }
        return (returned, await counter.misisolated, await counter.call() - 1)
      }
      loop.shutdownAndWait()
      guard let outcome else { return }
      #expect(outcome.returned == 900, "round \(round)")
      #expect(outcome.final == 900, "round \(round)")
      #expect(outcome.misisolated == 0, "round \(round)")
    }
  }
}
