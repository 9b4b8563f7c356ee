import Testing

@testable import AsyncRunLoop

/// `LoopInbox` as a plain value: who wakes the loop, how, and what is refused after shutdown.
/// (Each event's action is bound first: `#expect` cannot call a mutating method.)
@Suite("LoopInbox state machine")
struct LoopInboxTests {
  static func request() -> PerformRequest { PerformRequest(modes: [.common], block: {}) }

  @Test func anAwakeLoopIsNeverWoken() {
    var inbox = LoopInbox()
    let afterPerform = inbox.perform(Self.request())
    let afterSignal = inbox.signal(MemberRecord())
    let afterWakeUp = inbox.wakeUp()
    #expect(afterPerform == LoopInbox.WakeAction.none)
    #expect(afterSignal == .none)
    #expect(afterWakeUp == .none)
  }

  @Test func onlyTheFirstProducerAfterTheLoopSleepsWakesIt() {
    var inbox = LoopInbox()
    let slept = inbox.prepareToSleep(on: .epoll)
    let first = inbox.perform(Self.request())
    let second = inbox.perform(Self.request())
    let stop = inbox.stop()
    inbox.didWake()
    let afterWaking = inbox.wakeUp()
    #expect(slept)
    #expect(first == .wakeLoop(.epoll))
    #expect(second == LoopInbox.WakeAction.none)  // coalesced: a wake-up is on its way
    #expect(stop == .none)
    #expect(afterWaking == .none)
    #expect(inbox.performs.count == 2)
  }

  @Test func theWakeUpUsesTheWayTheLoopSleeps() {
    var inbox = LoopInbox()
    let sleptOnFutex = inbox.prepareToSleep(on: .futex)
    let futexWake = inbox.signal(MemberRecord())
    inbox.signalled.removeAll()
    inbox.didWake()
    let sleptInEpoll = inbox.prepareToSleep(on: .epoll)
    let epollWake = inbox.wakeUp()
    #expect(sleptOnFutex && sleptInEpoll)
    #expect(futexWake == .wakeLoop(.futex))
    #expect(epollWake == .wakeLoop(.epoll))
  }

  @Test func theLoopDoesNotSleepWhileAnythingWaits() {
    var inbox = LoopInbox()
    _ = inbox.perform(Self.request())
    let sleptWithABlockWaiting = inbox.prepareToSleep(on: .futex)
    let producerAfterRefusal = inbox.wakeUp()  // the loop is still awake: producers stay silent
    inbox.performs.removeAll()
    inbox.wakeRequested = false
    _ = inbox.stop()
    let sleptWithAStopWaiting = inbox.prepareToSleep(on: .futex)
    #expect(!sleptWithABlockWaiting)
    #expect(producerAfterRefusal == .none)
    #expect(!sleptWithAStopWaiting)
  }

  @Test func shutdownRefusesBlocksKeepsControlsAndEndsWhenIdle() {
    var inbox = LoopInbox()
    let first = inbox.beginShutdown().first
    let second = inbox.beginShutdown().first
    let blockWhileDraining = inbox.perform(Self.request())
    let controlWhileDraining = inbox.control(.custom { _ in })
    #expect(first && !second)  // twice: a no-op
    #expect(blockWhileDraining == nil)
    #expect(controlWhileDraining != nil)
    let finishedWithAControlWaiting = inbox.finishDrain(force: false)
    #expect(!finishedWithAControlWaiting, "a waiting control must keep the loop draining")
    inbox.controls.removeAll()
    let finishedWhenIdle = inbox.finishDrain(force: false)
    #expect(finishedWhenIdle, "an idle inbox must finish its drain")
    let leftover = inbox.terminate()
    let controlAfterTermination = inbox.control(.custom { _ in })
    let signalAfterTermination = inbox.signal(MemberRecord())
    #expect(leftover.isEmpty)
    #expect(controlAfterTermination == nil)
    #expect(signalAfterTermination == .none)
    #expect(inbox.signalled.isEmpty)
  }

  /// The drain's time cap (`refusesChangesFrom`): while shutting down, a change that arrives before
  /// it is accepted, one that arrives at or after it is refused (its sender fails it), and a
  /// change accepted before the cap passed stays waiting: refusing later ones drops nothing.
  @Test func theDrainCapRefusesOnlyChangesArrivingAfterIt() {
    var inbox = LoopInbox()
    inbox.refusesChangesFrom = LoopClock.monotonicNanoseconds() - 1  // not shutting down: ignored
    let whileActive = inbox.control(.applied)
    _ = inbox.beginShutdown()
    inbox.refusesChangesFrom = LoopClock.monotonicNanoseconds() + 3_600_000_000_000
    let beforeTheCap = inbox.control(.applied)
    inbox.refusesChangesFrom = LoopClock.monotonicNanoseconds()
    let afterTheCap = inbox.control(.applied)
    #expect(whileActive != nil)
    #expect(beforeTheCap != nil)
    #expect(afterTheCap == nil)
    #expect(inbox.controls.count == 2)
    let finished = inbox.finishDrain(force: false)
    #expect(!finished, "the accepted changes must keep the loop draining")
  }

  /// A burst of changes fills fixed chunks (no array that grows, and is copied, under the lock);
  /// taken together they keep the order the changes arrived in.
  @Test func aBurstOfChangesFillsChunksInArrivalOrder() {
    var inbox = LoopInbox()
    let capacity = ChunkedQueue<SequencedChange>.chunkCapacity
    let count = 2 * capacity + capacity / 2
    for _ in 0..<count { _ = inbox.control(.applied) }
    let chunkSizes = inbox.controls.fullChunks.map(\.count)
    let tailSize = inbox.controls.tail.count
    let waiting = inbox.hasWork()
    var taken: [[SequencedChange]] = []
    var spare: [SequencedChange] = []
    inbox.controls.takeAll(appendingTo: &taken, spare: &spare)
    let sequences = taken.flatMap { $0.map(\.sequence) }
    #expect(chunkSizes == [capacity, capacity])
    #expect(tailSize == capacity / 2)
    #expect(waiting)
    #expect(taken.map(\.count) == [capacity, capacity, capacity / 2])
    #expect(sequences == Array(1...UInt64(count)))
    #expect(inbox.controls.isEmpty && !inbox.hasWork())
  }

  /// The same for blocks: the loop takes them in the order they arrived.
  @Test func aBurstOfBlocksKeepsItsOrder() {
    var inbox = LoopInbox()
    let count = 3 * ChunkedQueue<PerformRequest>.chunkCapacity + 7
    for _ in 0..<count { _ = inbox.perform(Self.request()) }
    let sequences = inbox.performs.elements.map(\.sequence)
    let matches = inbox.performs.contains { $0.sequence == UInt64(count) }
    #expect(inbox.performs.count == count)
    #expect(sequences == Array(1...UInt64(count)))
    #expect(matches)
  }
}
