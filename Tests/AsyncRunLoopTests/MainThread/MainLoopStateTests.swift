import Testing

@testable import AsyncRunLoop

/// The main loop's cross-thread state machine, as a plain value (no threads).
@Suite("MainLoop state machine")
struct MainLoopStateTests {
  typealias State = MainLoopState<String>

  @Test func servingStartsOnceAndNestedServingIsRefused() {
    var state = State()
    #expect(!state.isRunning)
    let first = state.beginServing()
    #expect(first == .serve)
    #expect(state.isRunning)
    let nested = state.beginServing()
    #expect(nested == .alreadyServing)
    let abandoned = state.endServing()
    #expect(abandoned.isEmpty)
    #expect(!state.isRunning)
  }

  @Test func aStopBeforeServingIsRememberedAndConsumedOnce() {
    var state = State()
    let stop = state.requestStop()
    #expect(stop == .remembered)
    let first = state.beginServing()
    #expect(first == .returnAtOnce)
    let second = state.beginServing()
    #expect(second == .serve)
  }

  @Test func aStopWhileServingStopsTheLoopAndEndsServingOnce() {
    var state = State()
    _ = state.beginServing()
    let afterOtherStop = state.continueServing()
    #expect(afterOtherStop, "a run that ended for another reason is run again")
    let stop = state.requestStop()
    #expect(stop == .stopLoop)
    let afterStop = state.continueServing()
    #expect(!afterStop)
    let afterConsumed = state.continueServing()
    #expect(afterConsumed, "the stop was consumed")
  }

  @Test func waitersWaitForTheFirstRunAndAreRefusedOnceTheLoopStopped() {
    var state = State()
    let early = state.register("early, before the main loop ever ran")
    #expect(early != nil)
    state.runEntered()
    let duringRawRun = state.register("during a raw run")
    #expect(duringRawRun != nil)
    _ = state.runExited()
    let afterStop = state.register("after the main loop ran and stopped")
    #expect(afterStop == nil)
  }

  @Test func waitersAreAbandonedWhenTheLastRawRunEnds() {
    var state = State()
    state.runEntered()
    state.runEntered()
    let ticket = state.register("waiter")
    #expect(ticket != nil)
    guard case .none = state.runExited() else {
      Issue.record("an inner run's exit abandoned the waiter")
      return
    }
    guard case .abandon(let waiters) = state.runExited() else {
      Issue.record("the outermost run's exit kept the waiter")
      return
    }
    #expect(waiters == ["waiter"])
    #expect(state.waiters.isEmpty)
  }

  @Test func waitersSurviveTheGapsBetweenRunsOfRunMainLoop() {
    var state = State()
    _ = state.beginServing()
    state.runEntered()
    _ = state.register("waiter")
    guard case .none = state.runExited() else {
      Issue.record("a gap between runMainLoop's runs abandoned the waiter")
      return
    }
    #expect(state.waiters.count == 1)
    let abandoned = state.endServing()
    #expect(abandoned == ["waiter"])
  }

  @Test func unregisteredWaitersAreNotAbandoned() {
    var state = State()
    _ = state.beginServing()
    let ticket = state.register("waiter")!
    let removed = state.unregister(ticket)
    #expect(removed == "waiter")
    let abandoned = state.endServing()
    #expect(abandoned.isEmpty)
  }

  @Test func aPendingStopUnwindsNestedRuns() {
    var state = State()
    _ = state.beginServing()
    state.runEntered()
    state.runEntered()
    let sleepsBeforeStop = state.aboutToSleep()
    #expect(!sleepsBeforeStop)
    let stop = state.requestStop()
    #expect(stop == .stopLoop)
    guard case .stopEnclosingRun = state.runExited() else {
      Issue.record("the inner run's exit did not stop the enclosing run")
      return
    }
    let mustStop = state.aboutToSleep()
    #expect(mustStop, "a run about to sleep with a stop pending must stop")
    guard case .none = state.runExited() else {
      Issue.record("the outermost run's exit asked for more")
      return
    }
    let keepServing = state.continueServing()
    #expect(!keepServing)
  }

  // MARK: A host that runs again soon (`RunLoop.main.run(mode:before:)` in a loop)

  @Test func aHostRunThatRunsAgainKeepsTheMainLoopServedUntilItsNextRun() {
    var state = State()
    state.hostingBegan()
    let waiting = state.register("blocked during the host run")
    #expect(waiting != nil)
    let atExit = state.hostingEnded(holdingBetweenRuns: true)
    #expect(atExit.isEmpty, "between two host runs nobody is released")
    #expect(state.isRunning)
    #expect(state.register("blocked between two host runs") != nil)
    state.hostingBegan()  // the next run takes the hold over
    #expect(!state.isHeldBetweenHostRuns)
    let released = state.hostingEnded()  // a host that does not run again
    #expect(released.count == 2)
    #expect(!state.isRunning)
  }

  @Test func aHostRunNestedInOurOwnRunsHoldsNothing() {
    var state = State()
    _ = state.beginServing()  // runMainLoop()
    state.runEntered()
    state.hostingBegan()  // RunLoop.main.run(...) in one of our callouts
    _ = state.hostingEnded(holdingBetweenRuns: true)
    #expect(!state.isHeldBetweenHostRuns)
    _ = state.register("blocked while runMainLoop() runs")
    _ = state.runExited()
    let released = state.endServing()  // runMainLoop() returns
    #expect(released == ["blocked while runMainLoop() runs"])
    #expect(!state.isRunning)
  }

  @Test func runMainLoopReturningAtOnceEndsAHoldAndReleasesItsWaiters() {
    var state = State()
    state.hostingBegan()
    _ = state.hostingEnded(holdingBetweenRuns: true)
    _ = state.register("blocked between host runs")
    #expect(state.requestStop() == .remembered)
    #expect(state.beginServing() == .returnAtOnce)
    let released = state.endServing()
    #expect(released == ["blocked between host runs"])
    #expect(!state.isRunning)
  }

  @Test func aRunOfOurOwnTakesAHoldOverAndItsEndReleasesTheWaiters() {
    var state = State()
    state.hostingBegan()
    _ = state.hostingEnded(holdingBetweenRuns: true)
    _ = state.register("blocked between host runs")
    state.runEntered()
    #expect(!state.isHeldBetweenHostRuns)
    let exit = state.runExited()
    guard case .abandon(let released) = exit else {
      Issue.record("the last run's end must release the waiters: \(exit)")
      return
    }
    #expect(released == ["blocked between host runs"])
  }

  @Test func shuttingTheMainLoopDownEndsAHoldAndReleasesItsWaiters() {
    var state = State()
    state.hostingBegan()
    _ = state.hostingEnded(holdingBetweenRuns: true)
    _ = state.register("blocked between host runs")
    let released = state.shutDown()
    #expect(released == ["blocked between host runs"])
    #expect(!state.isRunning)
    state.hostingBegan()
    _ = state.hostingEnded(holdingBetweenRuns: true)
    #expect(!state.isHeldBetweenHostRuns, "a shut-down main loop is not held")
  }
}
