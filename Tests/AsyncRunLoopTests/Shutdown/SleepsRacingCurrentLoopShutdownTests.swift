import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("Sleeps racing a current loop's shutdown", .serialized, .timeLimit(.minutes(10)))
struct SleepsRacingCurrentLoopShutdownTests {
  /// `Task.sleep` under a shut-down current loop's preference completes at its deadline, never
  /// early; a sleep on its `clock` either completes after its deadline or throws
  /// `CancellationError`. None hangs, whenever the shutdown comes (before, during, after).
  @Test func sleepsRacingTheShutdownNeverEndEarlyAndNeverHang() async throws {
    for round in 0..<12 {
      let thread = await execOnNewThread { OutlivingCurrentLoopThread() }
      let loop = await execOnNewThread { thread.loop() }
      let delay = UInt32(round % 4) * 5_000
      let outcome = try await withWatchdog(timeout: .seconds(20), "sleeps racing shutdown (round \(round))") {
        () async -> [String] in
        let shutter = Task.detached {
          await execOnNewThread {
            usleep(delay)
            loop.shutdown()
          }
        }
        let results = await withTaskGroup(of: String.self) { group in
          for index in 0..<6 {
            group.addTask(executorPreference: loop) {
              let duration = Duration.milliseconds(10 + 5 * index)
              let start = ContinuousClock.now
              if index % 2 == 0 {
                do {
                  try await Task.sleep(for: duration)
                } catch {
                  return "task sleep threw \(error)"
                }
                return ContinuousClock.now - start >= duration ? "ok" : "task sleep early"
              }
              do {
                try await loop.clock.sleep(for: duration)
                return ContinuousClock.now - start >= duration ? "ok" : "clock sleep early"
              } catch is CancellationError {
                return "ok"
              } catch {
                return "clock sleep threw \(error)"
              }
            }
          }
          var all: [String] = []
          for await result in group { all.append(result) }
          return all
        }
        await shutter.value
        return results
      }
      await execOnNewThread { thread.end() }
      #expect(outcome.map { $0.count == 6 && $0.allSatisfy { $0 == "ok" } } == true, "round \(round): \(outcome ?? [])")
    }
  }
}
