import Testing

/// An `async` main on `AsyncRunLoopExecutorFactory` keeps the main actor on the main loop: checked
/// in real processes (the `AsyncMainFixture` executable, one scenario per launch, and the
/// `AsyncMainExample` program), since the main executor is a per-program choice and Swift Testing
/// never runs tests on the main thread. Each fixture scenario checks with `gettid() == getpid()`
/// where bodies run, prints what it checked and exits 0, or prints "FAIL: …" and exits 1; a
/// watchdog alarm turns a hang into a failure.
@Suite("Async main on the main loop", .serialized)
struct AsyncMainOnMainLoopTests {
  @Test func oneThreadsRunOnMainMainActorAndMainQueueCallsRunOnTheMainThreadInCallOrder() throws {
    try expectAsyncMainScenarioPasses("call-order")
  }

  @Test func theMainThreadAndOnlyItIsIsolatedToTheMainActor() throws {
    try expectAsyncMainScenarioPasses("isolation")
  }

  @Test func mainLoopTimersPerformsAndWaitingCallersAreServedOnTheMainThread() throws {
    try expectAsyncMainScenarioPasses("members")
  }

  @Test func nestedAndModalRunsAndTheExecutorsNestedRunReturnControlToMain() throws {
    try expectAsyncMainScenarioPasses("nested-and-modal")
  }

  @Test func everyRunOnMainBodyAcceptedBeforeStopMainLoopRunsBeforeAwaitRunMainLoopReturns() throws {
    try expectAsyncMainScenarioPasses("stop-keeps-accepted-work")
  }

  @Test func sleepsOnTheMainActorResumeOnTheMainThread() throws {
    try expectAsyncMainScenarioPasses("sleep")
  }

  @Test func threadsStartedFirstThingInMainWaitForTheMainLoopInsteadOfThrowing() throws {
    try expectAsyncMainScenarioPasses("wait-from-early-thread")
  }

  @Test func shuttingTheMainLoopDownEndsTheProcessAfterTheDrainAndSaysSo() throws {
    let run = try ChildProcess.run(ChildProcess.sibling("AsyncMainFixture"), arguments: ["shutdown"])
    #expect(run.exitCode == 0, "\(run)")
    for drained in ["a performed block", "a main-queue block", "a main-actor job", "a runOnMain body"] {
      #expect(run.standardOutput.contains("\(drained) ran in the drain"), "\(run)")
    }
    #expect(!run.standardOutput.contains("shutdown ok"), "main got control back: \(run)")
    #expect(run.standardError.contains("RunLoopThread.main was shut down in an async main"), "\(run)")
  }

  @Test func theAsyncMainExampleRunsOnTheMainLoopAndExitsCleanly() throws {
    let run = try ChildProcess.run(ChildProcess.sibling("AsyncMainExample"), arguments: [])
    #expect(run.exitCode == 0, "\(run)")
    #expect(
      run.standardOutput.contains("ticks: 5, delegate totals: [1, 3, 6, 10, 15], all on the main thread"), "\(run)")
    #expect(run.standardOutput.contains("stopMainLoop() ended await runMainLoop()"), "\(run)")
    #expect(run.standardOutput.hasSuffix("clean exit\n"), "\(run)")
  }
}

/// The main loop's start and stop in a synchronous main (`MainLoopFixture`).
@Suite("Main loop start and stop in a real process", .serialized)
struct MainLoopStartAndStopTests {
  @Test func everyRunOnMainBodyAcceptedBeforeStopMainLoopRunsBeforeRunMainLoopReturns() throws {
    try expectScenarioPasses("stop-keeps-accepted-work")
  }

  @Test func everyMainQueueBlockAcceptedBeforeAShutdownOnTheMainThreadRunsBeforeRunMainLoopReturns() throws {
    try expectScenarioPasses("shutdown-keeps-accepted-work")
  }

  @Test func aStopRememberedBeforeRunMainLoopDoesNotSkipTheDrainOfALaterShutdown() throws {
    try expectScenarioPasses("stop-then-shutdown")
  }

  @Test func callersStartedBeforeTheMainLoopRunsWaitForItToStart() throws {
    try expectScenarioPasses("early-waiters")
  }

  @Test func afterDispatchMainRunOnMainSaysOnceHowToStayOnTheMainThread() throws {
    let run = try ChildProcess.run(ChildProcess.sibling("MainLoopFixture"), arguments: ["lost-main-queue"])
    #expect(run.exitCode == 0, "\(run)")
    #expect(run.standardOutput.contains("runOnMainAndWait refused"), "\(run)")
    #expect(run.standardOutput.contains("lost-main-queue ok"), "\(run)")
    let diagnostics = run.standardError.split(separator: "\n").filter { $0.contains("cannot reach the main thread") }
      .count
    #expect(diagnostics == 1, "\(run)")
    #expect(run.standardError.contains("typealias DefaultExecutorFactory = AsyncRunLoopExecutorFactory"), "\(run)")
  }
}

/// Runs one `AsyncMainFixture` scenario and expects it to pass.
func expectAsyncMainScenarioPasses(_ scenario: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
  let run = try ChildProcess.run(ChildProcess.sibling("AsyncMainFixture"), arguments: [scenario])
  #expect(run.exitCode == 0, "\(run)", sourceLocation: sourceLocation)
  #expect(run.standardOutput.contains("\(scenario) ok"), "\(run)", sourceLocation: sourceLocation)
  #expect(!run.standardError.contains("FAIL"), "\(run)", sourceLocation: sourceLocation)
}
