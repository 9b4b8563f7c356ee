import Glibc
import Testing

@testable import AsyncRunLoop

/// What a test sees of one take: the batch as an array.
enum TakenBatch<Element, Effect> {
  case took([Element], Effect)
  case suspend
  case end
}

extension SingleConsumerStateMachine {
  /// Takes one batch into a fresh `ElementBatch` and returns its elements (test helper).
  mutating func takeBatch() -> TakenBatch<Element, TakeEffect> {
    var batch = ElementBatch<Element>()
    switch take(into: &batch) {
    case .took(let effect):
      var elements: [Element] = []
      while let element = batch.popFirst() { elements.append(element) }
      return .took(elements, effect)
    case .suspend:
      return .suspend
    case .end:
      return .end
    }
  }
}

/// The lifecycle every sequence shares, as a plain value: waiters are string tokens, no threads.
@Suite("Sequence: shared consumer lifecycle")
struct SequenceLifecycleTests {
  typealias Lifecycle = ConsumerLifecycle<String>

  static func make() -> Lifecycle { Lifecycle(sequenceName: "TestSequence") }

  @Test func onlyTheFirstIteratorIsAllowed() {
    var lifecycle = Self.make()
    let first = lifecycle.makeIterator()
    let second = lifecycle.makeIterator()
    #expect(first)
    #expect(!second)
  }

  @Test func theConsumerSuspendsOnlyWhenNothingIsBuffered() {
    var lifecycle = Self.make()
    guard case .suspend = lifecycle.take(hasElements: false), case .take = lifecycle.take(hasElements: true) else {
      Issue.record("take did not follow the buffer")
      return
    }
    guard case .resume = lifecycle.suspend("c", hasElements: true) else {
      Issue.record("suspended although something arrived before it stored its continuation")
      return
    }
    guard case .suspended = lifecycle.suspend("c", hasElements: false) else {
      Issue.record("did not suspend on an empty buffer")
      return
    }
    #expect(lifecycle.isAccepting)  // waiting still accepts
  }

  @Test func aDeliveryResumesAWaitingConsumerOnceAndOnlyWithSomethingToTake() {
    var lifecycle = Self.make()
    #expect(lifecycle.delivered(hasElements: true) == nil)  // nobody waits: it takes when it asks
    _ = lifecycle.suspend("c", hasElements: false)
    #expect(lifecycle.delivered(hasElements: false) == nil)  // a stale notice keeps it waiting
    #expect(lifecycle.delivered(hasElements: true) == "c")
    #expect(lifecycle.delivered(hasElements: true) == nil)  // handed over already
    guard case .take = lifecycle.take(hasElements: true) else {
      Issue.record("the resumed consumer could not take")
      return
    }
  }

  @Test func theEndDrainsWhatIsBufferedThenEnds() {
    var lifecycle = Self.make()
    guard case .end(nil) = lifecycle.end() else {
      Issue.record("the end did not end")
      return
    }
    #expect(!lifecycle.isAccepting)
    guard case .take = lifecycle.take(hasElements: true), case .end = lifecycle.take(hasElements: false) else {
      Issue.record("did not drain, then end")
      return
    }
    guard case .none = lifecycle.end() else {
      Issue.record("a second end notice did something")
      return
    }
  }

  @Test func theEndWakesAWaitingConsumer() {
    var lifecycle = Self.make()
    _ = lifecycle.suspend("c", hasElements: false)
    guard case .end("c") = lifecycle.end(), case .end = lifecycle.take(hasElements: false) else {
      Issue.record("the waiting consumer was not ended")
      return
    }
  }

  @Test func closingRefusesProducersAndKeepsTheConsumerWaitingForTheDetach() {
    var lifecycle = Self.make()
    _ = lifecycle.suspend("c", hasElements: false)
    let closed = lifecycle.close()
    let closedAgain = lifecycle.close()
    #expect(closed)
    #expect(!closedAgain)
    #expect(!lifecycle.isAccepting)
    #expect(lifecycle.delivered(hasElements: false) == nil)  // still waiting
    #expect(lifecycle.delivered(hasElements: true) == "c")  // a last release before the detach
    guard case .suspend = lifecycle.take(hasElements: false),
      case .suspended = lifecycle.suspend("c2", hasElements: false)
    else {
      Issue.record("a closing sequence did not wait for its detach")
      return
    }
    guard case .end("c2") = lifecycle.end() else {
      Issue.record("the detach did not wake the consumer")
      return
    }
  }

  @Test func stoppingDetachesTheMemberOnlyWhileItIsOnItsLoop() {
    var open = Self.make()
    _ = open.suspend("c", hasElements: false)
    guard case .stop("c", true) = open.stop(), case .none = open.stop() else {
      Issue.record("stop was not once, or did not detach")
      return
    }
    guard case .end = open.take(hasElements: true), case .resume = open.suspend("c", hasElements: false) else {
      Issue.record("a stopped consumer went on")
      return
    }
    var closing = Self.make()
    _ = closing.close()
    guard case .stop(nil, false) = closing.stop() else {
      Issue.record("a closed sequence was detached twice")
      return
    }
    var ended = Self.make()
    _ = ended.end()
    guard case .stop(nil, false) = ended.stop(), case .none = ended.end() else {
      Issue.record("an ended sequence was detached again")
      return
    }
  }

  @Test func aStoppedSequenceIgnoresDeliveries() {
    var lifecycle = Self.make()
    _ = lifecycle.stop()
    #expect(!lifecycle.isAccepting)
    #expect(lifecycle.delivered(hasElements: true) == nil)
    let closed = lifecycle.close()
    #expect(!closed)
  }

  @Test func aConcurrentNextTraps() async {
    await #expect(processExitsWith: .failure) {
      var lifecycle = ConsumerLifecycle<String>(sequenceName: "TestSequence")
      _ = lifecycle.suspend("first", hasElements: false)
      _ = lifecycle.take(hasElements: false)
    }
  }
}

/// The five sequences share one iterator type; each still names it `Iterator`, and explicit
/// iteration reads as before.
@Suite("Sequence: every sequence's iterator")
struct SequenceIteratorTests {
  @Test func everySequenceKeepsItsIteratorNameAndEndsAfterInvalidate() async throws {
    let loop = try RunLoopThread(name: "seq-iterators")
    defer { loop.shutdownAndWait() }
    let (readEnd, writeEnd) = makePipe()
    defer {
      close(readEnd)
      close(writeEnd)
    }
    // The thread is in its run before the activity sequence observes `.entry` (a thread that
    // started late, under load, reported its run's entry to the sequence, which then delivered it
    // before ending).
    try loop.performAndWait {}
    let source = loop.sourceSequence(of: Int.self)
    let signals = loop.signalSequence()
    let ticks = loop.timer(every: .seconds(3600))
    let readiness = try loop.readiness(of: readEnd)
    let activities = loop.activities([.entry])
    _ = source.post(1)
    source.invalidate()
    signals.invalidate()
    ticks.invalidate()
    readiness.invalidate()
    activities.invalidate()
    let ended = try await withWatchdog(timeout: .seconds(10), "iterators end") { () async -> Bool in
      var sourceIterator: SourceSequence<Int>.Iterator = source.makeAsyncIterator()
      var signalIterator: SignalSequence.Iterator = signals.makeAsyncIterator()
      var timerIterator: TimerSequence.Iterator = ticks.makeAsyncIterator()
      var readinessIterator: ReadinessSequence.Iterator = readiness.makeAsyncIterator()
      var activityIterator: ActivitySequence.Iterator = activities.makeAsyncIterator()
      let first = await sourceIterator.next()
      let afterFirst = await sourceIterator.next()
      let signalEnd = await signalIterator.next()
      let tickEnd = await timerIterator.next(isolation: nil)
      let readinessEnd = await readinessIterator.next()
      let activityEnd = await activityIterator.next()
      return first == 1 && afterFirst == nil && signalEnd == nil && tickEnd == nil && readinessEnd == nil
        && activityEnd == nil
    }
    #expect(ended == true)
  }
}
