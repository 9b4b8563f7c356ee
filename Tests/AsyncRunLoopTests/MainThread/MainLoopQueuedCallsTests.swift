import Glibc
import Testing

@testable import AsyncRunLoop

// MARK: - The main thread

/// Main-thread ordering, checked in a fixture process whose main thread runs the main loop.
@Suite("The main loop in a real process: calls queued before it runs", .serialized)
struct MainLoopQueuedCallsTests {
  /// Calls queued from another thread before the main loop runs (runOnMain, MainActor tasks and
  /// DispatchQueue.main blocks, interleaved) run in call order on the main thread once it runs;
  /// runOnMain on the main thread runs inline ahead of them (also in a main-loop timer's callout).
  @Test func callsQueuedBeforeTheMainLoopRunsRunInCallOrderAndMainCallsRunInline() throws {
    try expectScenarioPasses("main-queued-before-run")
  }
}
