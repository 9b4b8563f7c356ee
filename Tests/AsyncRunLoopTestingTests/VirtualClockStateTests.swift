import Testing

@testable import AsyncRunLoop

/// The virtual clock's state machine as a plain value: time jumps only to a wake-up within the
/// granted time (or any, with auto-advance), never goes back, and idle releases the waiters.
@Suite("VirtualClockState")
struct VirtualClockStateTests {
  @Test func withoutGrantedTimeTheLoopSleepsAndTimeStands() {
    var state = VirtualClockState<Int>(now: 100, autoAdvances: false)
    state.nextWake = 150
    let (sleeps, idle) = state.loopWouldSleep()
    #expect(sleeps && idle.isEmpty)
    #expect(state.now == 100)
  }

  @Test func grantedTimeIsWalkedWakeUpByWakeUpThenIdleReleasesWaiters() {
    var state = VirtualClockState<Int>(now: 100, autoAdvances: false)
    let accepted1 = state.requestIdle(grantingUpTo: 300, 1)
    #expect(accepted1)
    state.nextWake = 150
    let decision1 = state.loopWouldSleep()
    #expect(!decision1.sleeps)
    #expect(state.now == 150)
    state.nextWake = 150  // the pass has not fired it yet: poll, no jump
    let decision2 = state.loopWouldSleep()
    #expect(!decision2.sleeps)
    #expect(state.now == 150)
    state.nextWake = 400  // after the granted time
    let (sleeps, idle) = state.loopWouldSleep()
    #expect(!sleeps && idle == [1])
    #expect(state.now == 300)
    let decision3 = state.loopWouldSleep()  // nobody waits: sleep
    #expect(decision3.sleeps)
  }

  @Test func timeNeverGoesBack() {
    var state = VirtualClockState<Int>(now: 100, autoAdvances: false)
    let accepted2 = state.requestIdle(grantingUpTo: 50, 1)
    #expect(accepted2)
    state.nextWake = nil
    let decision4 = state.loopWouldSleep()
    #expect(decision4.idle == [1])
    #expect(state.now == 100)
  }

  @Test func autoAdvanceJumpsToAnyWakeUp() {
    var state = VirtualClockState<Int>(now: 100, autoAdvances: true)
    state.nextWake = 1_000_000
    let decision5 = state.loopWouldSleep()
    #expect(!decision5.sleeps)
    #expect(state.now == 1_000_000)
    state.nextWake = nil
    let decision6 = state.loopWouldSleep()
    #expect(decision6.sleeps)
  }

  @Test func anEndedLoopAnswersAtOnce() {
    var state = VirtualClockState<Int>(now: 100, autoAdvances: false)
    let accepted3 = state.requestIdle(grantingUpTo: 200, 1)
    #expect(accepted3)
    let ended = state.loopEnded()
    #expect(ended == [1])
    let accepted4 = state.requestIdle(grantingUpTo: 300, 2)
    #expect(!accepted4)
  }
}
