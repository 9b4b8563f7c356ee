import CAsyncRunLoop
import Glibc
import Testing

@testable import AsyncRunLoop

/// Using the main loop the wrong way fails clearly instead of hanging or misbehaving. These run in
/// the test process, whose main thread never runs the main loop.
@Suite("MainLoop misuse fails clearly")
struct MainLoopMisuseTests {
  /// Why the main-loop tests launch a fixture process: an exit test's body runs in a child process,
  /// but on one of its pool threads, not on its main thread — also when the body is @MainActor
  /// (the child's main thread is given to libdispatch, which drains the main queue elsewhere).
  @Test func exitTestBodiesDoNotRunOnTheMainThread() async {
    await #expect(processExitsWith: .exitCode(0)) {
      exit(carl_gettid() == getpid() ? 1 : 0)
    }
    await #expect(processExitsWith: .exitCode(0)) { @MainActor in
      exit(carl_gettid() == getpid() ? 1 : 0)
    }
  }

  @Test func runMainLoopOffTheMainThreadTrapsWithAClearMessage() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      runMainLoop()
    }
    expectStandardError(of: result, mentions: "runMainLoop() must be called on the process's main thread")
  }

  @Test func runningTheMainLoopOffTheMainThreadTraps() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      RunLoopThread.main.run(mode: .default, for: .milliseconds(1))
    }
    expectStandardError(of: result, mentions: "must be called on the thread of loop 'main'")
  }

  @Test func runOnMainAndWaitThrowsWhenTheMainLoopIsNotRunning() {
    #expect(!RunLoopThread.isMainLoopRunning)
    let ran = Locked(false)
    #expect {
      try runOnMainAndWait { ran.withLock { $0 = true } }
    } throws: { error in
      guard case RunLoopError.wouldDeadlock(let message) = error else { return false }
      return message.contains("the main loop is not running")
    }
    #expect(!ran.withLock { $0 }, "the refused body ran")
  }

  @Test func poolAndPlainThreadsAreNotTheMainThread() throws {
    #expect(!RunLoopThread.isMainThread)
    let loop = try RunLoopThread(name: "not-main")
    #expect(try loop.performAndWait { RunLoopThread.isMainThread } == false)
    #expect(!RunLoopThread.main.isOnLoopThread)
    loop.shutdownAndWait()
  }
}
