import Glibc
import Testing

@testable import AsyncRunLoop

// MARK: - runOnMain off the main thread

@Suite("runOnMain called off the main thread", .serialized, .timeLimit(.minutes(10)))
struct RunOnMainOffTheMainThreadTests {
  /// Promised: `runOnMainAndWait` and `RunLoopThread.main.performAndWait` from a loop thread,
  /// while the main loop is not running, throw `wouldDeadlock` at once instead of blocking the
  /// loop thread, and the body does not run.
  @Test func waitingForTheMainThreadFromALoopThreadThrowsWhenTheMainLoopIsNotRunning() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "main from loop") {
      () throws -> (running: Bool, answers: [String], ran: Bool) in
      let loop = try RunLoopThread(name: "main")
      defer { loop.shutdownAndWait() }
      let ran = Locked(false)
      let answers = try loop.performAndWait { () -> [String] in
        var answers: [String] = []
        do {
          try runOnMainAndWait { ran.withLock { $0 = true } }
          answers.append("ran")
        } catch RunLoopError.wouldDeadlock {
          answers.append("wouldDeadlock")
        } catch {
          answers.append("\(error)")
        }
        do {
          try RunLoopThread.main.performAndWait { ran.withLock { $0 = true } }
          answers.append("ran")
        } catch RunLoopError.wouldDeadlock {
          answers.append("wouldDeadlock")
        } catch {
          answers.append("\(error)")
        }
        return answers
      }
      return (RunLoopThread.isMainLoopRunning, answers, ran.withLock { $0 })
    }
    guard let outcome, !outcome.running else { return }
    #expect(outcome.answers == ["wouldDeadlock", "wouldDeadlock"])
    #expect(!outcome.ran)
  }
}
