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
}
