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

  @Test func aBodyPastItsTimeoutIsRecordedAndReturnsNilOnceItEnds() async throws {
    let release = TestGate()
    var value: Int? = -1
    // The body outlives its timeout, then ends: the hang is recorded, and the watchdog returns
    // only after the body ended (the test's clean-up never runs under it).
    startThread(detached: true) {
      usleep(UInt32(1_000_000 * watchdogScale))
      release.open()
    }
    await withKnownIssue("the watchdog records the hang") {
      value = try await withWatchdog(timeout: .milliseconds(200), "blocked body") { () async -> Int in
        release.wait(timeout: .seconds(30))
        return 1
      }
    }
    #expect(value == nil)
    #expect(release.opened)
  }

  @Test func theSynchronousVariantRecordsABodyPastItsTimeout() throws {
    let release = TestGate()
    var value: Int? = -1
    startThread(detached: true) {
      usleep(UInt32(1_000_000 * watchdogScale))
      release.open()
    }
    withKnownIssue("the watchdog records the hang") {
      value = try withWatchdogSync(timeout: .milliseconds(200), "blocked body") { () -> Int in
        release.wait(timeout: .seconds(30))
        return 1
      }
    }
    #expect(value == nil)
    #expect(release.opened)
    #expect(try withWatchdogSync(timeout: .seconds(10), "quick body") { 7 } == 7)
  }

  /// The alarm that bounds every exit test's child ends a hung child. (Swift Testing starts the
  /// child with SIGALRM unblocked today; the fixtures, started by `Process`, have it blocked, and
  /// `FoundationBridgeProcessTests` proves the alarm there.)
  @Test func aHungChildProcessIsEndedByItsAlarm() async {
    await #expect(processExitsWith: .signal(SIGALRM)) {
      armChildAlarm(1)
      while true { pause() }
    }
  }

  /// Swift Testing waits for an exit test's child with no limit: every child arms an alarm before
  /// its body runs (CTestHarness), so one that blocks instead of exiting fails instead of holding
  /// the run. (`alarm(0)` returns the seconds left of a pending alarm, and cancels it.)
  @Test func anExitTestsChildStartsWithAnAlarmArmed() async {
    await #expect(processExitsWith: .success) {
      exit(alarm(0) > 0 ? 0 : 1)
    }
  }

  @Test func aBodyThatNeverEndsEndsTheProcessAfterTheGrace() async {
    let result = await #expect(processExitsWith: .exitCode(1), observing: [\.standardErrorContent]) {
      armChildAlarm(60)
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
