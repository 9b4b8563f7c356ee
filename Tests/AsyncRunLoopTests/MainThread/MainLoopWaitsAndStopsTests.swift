import Glibc
import Testing

@testable import AsyncRunLoop

/// Round 9 on the real main thread (the `MainLoopFixture` scenarios named `round9-…`; see
/// `MainLoopProcessTests`).
@Suite("The main loop in a real process: waits, stops and shutdown", .serialized, .timeLimit(.minutes(10)))
struct MainLoopWaitsAndStopsTests {
  @Test func waitingCallersRacingStopMainLoopRunOnceOrAreRefused() throws {
    try expectScenarioPasses("main-wait-vs-stop")
  }

  @Test func aNestedRunInAPinnedActorsJobRunsNoOtherJobOfTheLoop() throws {
    try expectScenarioPasses("main-pinned-nested-run")
  }

  @Test func stackedModalRunsFromTheMainActorUnwindInOrder() throws {
    try expectScenarioPasses("main-modal-stack")
  }

  @Test func aModeJoiningTheCommonModesLateServesTheMainQueueAndCommonTimers() throws {
    try expectScenarioPasses("main-late-common-mode")
  }

  @Test func shutdownRacingWaitingCallersAndPinnedJobsLosesNothing() throws {
    try expectScenarioPasses("main-shutdown-waiters")
  }

  @Test func sleepsOnTheMainLoopAtItsShutdownEndAsDocumented() throws {
    try expectScenarioPasses("main-shutdown-sleeps")
  }

}
