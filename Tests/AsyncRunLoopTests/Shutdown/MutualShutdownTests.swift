import Glibc
import Testing

@testable import AsyncRunLoop

/// `shutdownAndWait()` from a loop thread whose target loop's thread is itself blocked until the
/// caller's loop is done: the call only starts the shutdown instead of deadlocking both threads
/// (`CalloutWaits.beginUnlessDeadlocked`). Blocking work runs on the tests' own threads.
@Suite("Loops shutting each other down", .timeLimit(.minutes(10)))
struct MutualShutdownTests {
  /// Two loops, each in a block, shut each other down at the same moment, round after round: both
  /// calls return, and both loops then finish (a third thread's `shutdownAndWait` joins them).
  @Test func twoLoopsShuttingEachOtherDownAtOnceBothReturn() async throws {
    let rounds = try await withWatchdogOnThread(timeout: .seconds(30), "mutual shutdown") { () -> Int in
      repeatRounds(40, budget: .milliseconds(1500)) { _ in
        guard let first = try? RunLoopThread(name: "mutual-a"), let second = try? RunLoopThread(name: "mutual-b")
        else { return }
        let bothIn = AtomicCounter()
        let returned = AtomicCounter()
        for (loop, other) in [(first, second), (second, first)] {
          loop.perform {
            bothIn.increment()
            while bothIn.current < 2 { sched_yield() }
            other.shutdownAndWait()
            returned.increment()
          }
        }
        first.shutdownAndWait()
        second.shutdownAndWait()
        #expect(returned.current == 2)
      }
    }
    #expect((rounds ?? 0) > 0)
  }

  /// Loop A's thread waits in `performAndWait` for a block on B; that block shuts A down and waits:
  /// A's thread cannot finish while it waits for B, so B's call only starts the shutdown; the
  /// block returns, A's wait ends with the block's result, and A then finishes.
  @Test func aLoopShuttingDownTheLoopThatWaitsForItDoesNotWait() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "shutdown of a waiting loop") {
      () -> (answer: String?, aShutDown: Bool) in
      let first = try RunLoopThread(name: "mutual-waiting")
      let second = try RunLoopThread(name: "mutual-target")
      let answer = Locked<String?>(nil)
      let asked = TestGate()
      first.perform {
        let result = try? second.performAndWait { () -> String in
          first.shutdownAndWait()
          return "answered"
        }
        answer.withLock { $0 = result }
        asked.open()
      }
      #expect(asked.wait(timeout: .seconds(10)))
      first.shutdownAndWait()
      second.shutdownAndWait()
      return (answer.withLock { $0 }, first.isShutDown)
    }
    #expect(outcome?.answer == "answered")
    #expect(outcome?.aShutDown == true)
  }
}
