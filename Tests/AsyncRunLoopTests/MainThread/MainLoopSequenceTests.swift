import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

/// Round 6 on the real main thread (the `MainLoopFixture` scenarios named `round6-…`; see
/// `MainLoopProcessTests`).
@Suite("The main loop in a real process: sequences and runOnMain", .serialized)
struct MainLoopSequenceTests {
  /// Sequences on the main loop, consumed from `@MainActor` code and from a task preferring the
  /// main loop, with producers on plain threads: every element once, in per-producer order, on
  /// the main thread.
  @Test func mainLoopSequencesDeliverEveryElementOnTheMainThread() throws {
    try expectScenarioPasses("main-sequences")
  }

  /// `await runOnMain` from a task preferring a worker loop, and from an actor on it, comes back
  /// to the worker loop.
  @Test func awaitRunOnMainComesBackToTheCallersLoop() throws {
    try expectScenarioPasses("run-on-main-returns")
  }

}
