import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

/// The main-thread promises, in a real process whose main thread runs the main loop (the
/// `MainLoopFixture` scenarios named `round3-…`; see `MainLoopProcessTests`).
@Suite("The main loop in a real process: the main actor's nested and modal runs", .serialized)
struct MainActorOnTheMainLoopTests {
  /// A `@MainActor` job or main-queue block that runs the main loop nested has no other main-actor
  /// job start inside it, and the nested run does not spin on the main queue's wake-up.
  @Test func noMainActorJobStartsInsideAnotherThatRunsTheLoopNested() throws {
    try expectScenarioPasses("main-actor-nested-run")
  }

  /// `runModal` from `@MainActor` code leaves the main actor free for other work, and cancelling
  /// the task ends the modal run with `.stopped`.
  @Test func aModalRunFromTheMainActorLetsMainActorWorkRunAndEndsOnCancellation() throws {
    try expectScenarioPasses("main-actor-modal")
  }

  /// In a mode outside the common set a modal run from `@MainActor` code does not serve the main
  /// queue (other main-actor work waits until it ends); in a common mode it does.
  @Test func aModalRunFromTheMainActorServesMainActorWorkOnlyInACommonMode() throws {
    try expectScenarioPasses("main-actor-private-modal")
  }

  /// `RunLoopThread.main.shutdownAndWait()` from another thread returns; late jobs of an actor on
  /// the main loop run on the fallback, isolated.
  @Test func lateJobsOfAnActorOnTheShutDownMainLoopRunOnTheFallback() throws {
    try expectScenarioPasses("main-shutdown-late-jobs")
  }

}
