import Glibc
import Testing

/// The test watchdog itself: a hang ends the test (and, as a last resort, the process) instead of
/// stalling the run.
@Suite("Watchdog: a hung body ends the test")
struct WatchdogTests {
  @Test func aFinishedBodyReturnsItsValue() async throws {
    let value = try await withWatchdog(timeout: .seconds(10), "quick body") { 42 }
    #expect(value == 42)
  }

  @Test func aThrowingBodyRethrows() async {
    struct Failure: Error {}
    await #expect(throws: Failure.self) {
      _ = try await withWatchdog(timeout: .seconds(10), "throwing body") { () async throws -> Int in throw Failure() }
    }
  }

  @Test func aHungBodyReturnsNilAtTheTimeoutWithoutWaitingForIt() async throws {
    let release = TestGate()
    let start = ContinuousClock.now
    var value: Int? = -1
    await withKnownIssue("the watchdog records the hang") {
      // Blocks a pool thread (not cancellable): the old task-group watchdog waited for it.
      value = try await withWatchdog(timeout: .milliseconds(200), "blocked body") { () async -> Int in
        release.wait(timeout: .seconds(30))
        return 1
      }
    }
    // Returned before the body did: a correctness bound (the body holds on for up to 30 s).
    #expect(value == nil)
    #expect(!release.opened)
    #expect(ContinuousClock.now - start < .seconds(30))
    release.open()
  }

  @Test func theSynchronousVariantReturnsNilAtTheTimeoutWithoutWaitingForIt() throws {
    let release = TestGate()
    var value: Int? = -1
    withKnownIssue("the watchdog records the hang") {
      value = try withWatchdogSync(timeout: .milliseconds(200), "blocked body") { () -> Int in
        release.wait(timeout: .seconds(30))
        return 1
      }
    }
    #expect(value == nil)
    #expect(!release.opened)
    release.open()
    #expect(try withWatchdogSync(timeout: .seconds(10), "quick body") { 7 } == 7)
  }

  @Test func aBodyThatNeverEndsEndsTheProcessAfterTheGrace() async {
    let result = await #expect(processExitsWith: .exitCode(1), observing: [\.standardErrorContent]) {
      alarm(60)
      setenv("ASYNC_RUN_LOOP_HANG_GRACE", "1", 1)
      await withKnownIssue {
        _ = try await withWatchdog(timeout: .milliseconds(100), "endless body") { () async -> Int in
          TestGate().wait(timeout: .seconds(3600))
          return 0
        }
      }
      sleep(30)  // the reaper exits the process long before this ends
    }
    expectStandardError(of: result, mentions: "still hung")
  }
}
