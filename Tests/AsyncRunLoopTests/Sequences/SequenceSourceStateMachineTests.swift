import Testing

@testable import AsyncRunLoop

/// The source sequence's state machine as a plain value: waiters are string tokens, no threads.
@Suite("Sequence: source state machine")
struct SequenceSourceStateMachineTests {
  typealias Machine = SourceSequenceStateMachine<Int, String, String>

  /// Posts `values` and returns the results.
  static func post(_ values: [Int], to machine: inout Machine) -> [SourcePostResult] {
    values.map { value in
      switch machine.post(value) {
      case .accepted(let result, _, _): return result
      case .refused(let result): return result
      }
    }
  }

  /// Releases and takes one batch; returns its elements.
  static func releaseAndTake(_ machine: inout Machine) -> [Int] {
    _ = machine.release()
    var batch = ElementBatch<Int>()
    switch machine.take(into: &batch) {
    case .took: break
    case .suspend, .end: return []
    }
    var out: [Int] = []
    while let element = batch.popFirst() { out.append(element) }
    return out
  }

  @Test func theSourceIsSignalledOnlyWhenThePostedBufferWasEmpty() {
    var machine = Machine(buffering: .unbounded)
    var signals: [Bool] = []
    for value in 0..<3 {
      if case .accepted(_, let signal, _) = machine.post(value) { signals.append(signal) }
    }
    #expect(signals == [true, false, false])
    _ = machine.release()
    if case .accepted(_, let signal, _) = machine.post(3) { #expect(signal) }  // posted emptied again
  }

  @Test func elementsReachTheConsumerOnlyAfterTheLoopReleasesThem() {
    var machine = Machine(buffering: .unbounded)
    _ = Self.post([1, 2], to: &machine)
    var batch = ElementBatch<Int>()
    guard case .suspend = machine.take(into: &batch) else {
      Issue.record("took elements the loop had not released")
      return
    }
    guard case .suspended = machine.suspendConsumer("consumer") else {
      Issue.record("did not suspend")
      return
    }
    guard case .resumeConsumer(let consumer, _) = machine.release() else {
      Issue.record("release did not resume the waiting consumer")
      return
    }
    #expect(consumer == "consumer")
    guard case .took = machine.take(into: &batch) else {
      Issue.record("nothing to take after release")
      return
    }
    #expect(batch.count == 2)
  }

  @Test func aStaleReleaseDoesNotResumeTheConsumer() {
    var machine = Machine(buffering: .unbounded)
    _ = machine.suspendConsumer("consumer")
    guard case .none = machine.release() else {
      Issue.record("resumed with nothing to deliver")
      return
    }
  }

  @Test func elementsPostedBetweenTakeAndSuspendResumeAtOnce() {
    var machine = Machine(buffering: .unbounded)
    var batch = ElementBatch<Int>()
    guard case .suspend = machine.take(into: &batch) else { return }
    _ = Self.post([7], to: &machine)
    _ = machine.release()  // the loop fired before the consumer stored its continuation
    guard case .resume = machine.suspendConsumer("consumer") else {
      Issue.record("suspended although elements were released")
      return
    }
  }

  @Test func aBoundedBufferAnswersFullAndAdmitsWaitingProducersInOrder() {
    var machine = Machine(buffering: .bounded(2))
    #expect(Self.post([1, 2, 3], to: &machine) == [.enqueued, .enqueued, .full])
    let first = machine.makeProducerID()
    let second = machine.makeProducerID()
    guard case .suspended = machine.suspendProducer(id: first, element: 3, continuation: "p3", isCancelled: false),
      case .suspended = machine.suspendProducer(id: second, element: 4, continuation: "p4", isCancelled: false)
    else {
      Issue.record("producers did not wait on a full buffer")
      return
    }
    #expect(machine.waitingProducerCount == 2)
    _ = machine.release()
    var batch = ElementBatch<Int>()
    guard case .took(let effect) = machine.take(into: &batch) else {
      Issue.record("take failed")
      return
    }
    #expect(effect.producers == ["p3", "p4"])  // oldest producer first; both fit after the batch left
    #expect(effect.signalSource)
    #expect(batch.count == 2)
    #expect(machine.bufferedCount == 2)
    batch.removeAll()
    #expect(Self.releaseAndTake(&machine) == [3, 4])
  }

  @Test func aProducerCancelledBeforeItWaitedIsAnsweredFullAndNotTaken() {
    var machine = Machine(buffering: .bounded(1))
    _ = Self.post([1], to: &machine)
    let id = machine.makeProducerID()
    guard case .resume(.full, false) = machine.suspendProducer(id: id, element: 2, continuation: "p", isCancelled: true)
    else {
      Issue.record("a cancelled producer waited")
      return
    }
    #expect(machine.bufferedCount == 1)
  }

  @Test func aWaitingProducerThatIsCancelledLeavesTheQueueUntaken() {
    var machine = Machine(buffering: .bounded(1))
    _ = Self.post([1], to: &machine)
    let id = machine.makeProducerID()
    _ = machine.suspendProducer(id: id, element: 2, continuation: "p", isCancelled: false)
    guard case .resume(let producer) = machine.cancelProducer(id: id) else {
      Issue.record("cancel did not find the producer")
      return
    }
    #expect(producer.continuation == "p")
    guard case .none = machine.cancelProducer(id: id) else {
      Issue.record("a producer was resumed twice")
      return
    }
    #expect(Self.releaseAndTake(&machine) == [1])
  }

  @Test func dropOldestKeepsTheNewestAndCountsEveryDrop() {
    var machine = Machine(buffering: .dropOldest(3))
    let results = Self.post(Array(0..<10), to: &machine)
    #expect(results.filter { $0 == .enqueuedDroppingOldest }.count == 7)
    #expect(machine.droppedCount == 7)
    #expect(Self.releaseAndTake(&machine) == [7, 8, 9])
  }

  @Test func dropOldestDropsFromReleasedElementsFirst() {
    var machine = Machine(buffering: .dropOldest(3))
    _ = Self.post([0, 1], to: &machine)
    _ = machine.release()  // 0, 1 released; not taken yet
    _ = Self.post([2, 3, 4], to: &machine)  // 3 and 4 each drop the oldest: 0, then 1
    #expect(machine.droppedCount == 2)
    #expect(Self.releaseAndTake(&machine) == [2, 3, 4])
  }

  @Test func dropOldestDoesNotGrowWithoutBoundWhenNobodyReleases() {
    var machine = Machine(buffering: .dropOldest(2))
    var compactions = 0
    for value in 0..<10_000 {
      if case .accepted(_, _, let discard) = machine.post(value), discard != nil { compactions += 1 }
    }
    #expect(compactions > 0)
    #expect(machine.droppedCount == 9_998)
    #expect(Self.releaseAndTake(&machine) == [9_998, 9_999])
  }

  @Test func dropNewestKeepsTheOldestAndCountsEveryDrop() {
    var machine = Machine(buffering: .dropNewest(3))
    let results = Self.post(Array(0..<10), to: &machine)
    #expect(results == [.enqueued, .enqueued, .enqueued] + Array(repeating: .dropped, count: 7))
    #expect(machine.droppedCount == 7)
    #expect(Self.releaseAndTake(&machine) == [0, 1, 2])
  }

  @Test func invalidateRefusesPostsButDeliversWhatWasAccepted() {
    var machine = Machine(buffering: .unbounded)
    _ = Self.post([1, 2], to: &machine)
    guard machine.close() != nil else {
      Issue.record("invalidate did not ask to invalidate the source")
      return
    }
    guard machine.close() == nil else {
      Issue.record("second invalidate was not a no-op")
      return
    }
    #expect(Self.post([3], to: &machine) == [.terminated])
    guard case .end(nil, _) = machine.memberEnded() else {
      Issue.record("detach did not end the sequence")
      return
    }
    var batch = ElementBatch<Int>()
    guard case .took = machine.take(into: &batch) else {
      Issue.record("accepted elements were lost")
      return
    }
    #expect(batch.count == 2)
    batch.removeAll()
    guard case .end = machine.take(into: &batch) else {
      Issue.record("did not end after draining")
      return
    }
  }

  @Test func aWaitingConsumerIsWokenByTheDetachThatFollowsInvalidate() {
    var machine = Machine(buffering: .unbounded)
    _ = machine.suspendConsumer("consumer")
    _ = machine.close()
    guard case .end(let consumer, _) = machine.memberEnded() else {
      Issue.record("detach did not end")
      return
    }
    #expect(consumer == "consumer")
    guard case .none = machine.memberEnded() else {
      Issue.record("a second detach notice resumed again")
      return
    }
  }

  @Test func theLoopsShutdownEndsTheSequenceAfterWhatWasPosted() {
    var machine = Machine(buffering: .unbounded)
    _ = Self.post([1, 2, 3], to: &machine)
    _ = machine.memberEnded()  // shutdown: no invalidate() first
    #expect(Self.post([4], to: &machine) == [.terminated])
    #expect(Self.releaseAndTake(&machine) == [1, 2, 3])
  }

  @Test func invalidateAnswersWaitingProducersTerminated() {
    var machine = Machine(buffering: .bounded(1))
    _ = Self.post([1], to: &machine)
    let id = machine.makeProducerID()
    _ = machine.suspendProducer(id: id, element: 2, continuation: "p", isCancelled: false)
    guard let leftovers = machine.close() else { return }
    #expect(leftovers.producers.map(\.continuation) == ["p"])
    #expect(machine.waitingProducerCount == 0)
  }

  @Test func stoppingDiscardsEverythingResumesEveryoneOnceAndInvalidatesOnce() {
    var machine = Machine(buffering: .bounded(1))
    _ = Self.post([1], to: &machine)
    let id = machine.makeProducerID()
    _ = machine.suspendProducer(id: id, element: 2, continuation: "p", isCancelled: false)
    _ = machine.release()
    var batch = ElementBatch<Int>()
    _ = machine.take(into: &batch)  // 1 taken, producer admitted: 2 posted
    _ = machine.suspendConsumer("c")  // nothing released: the consumer waits
    guard case .stop(let consumer, let invalidate, let discarded) = machine.stopConsuming() else {
      Issue.record("stop did nothing")
      return
    }
    #expect(consumer == "c")
    #expect(invalidate)
    #expect(discarded.storages.map(\.count).reduce(0, +) >= 1)
    guard case .none = machine.stopConsuming() else {
      Issue.record("stopped twice")
      return
    }
    #expect(Self.post([3], to: &machine) == [.terminated])
    batch.removeAll()
    guard case .end = machine.take(into: &batch) else {
      Issue.record("a stopped sequence delivered")
      return
    }
  }

  @Test func stoppingAfterInvalidateDoesNotInvalidateAgain() {
    var machine = Machine(buffering: .unbounded)
    _ = machine.close()
    guard case .stop(_, false, _) = machine.stopConsuming() else {
      Issue.record("asked to invalidate twice")
      return
    }
  }

  @Test func onlyOneIteratorCanBeMade() {
    var machine = Machine(buffering: .unbounded)
    let first = machine.makeIterator()
    let second = machine.makeIterator()
    #expect(first)
    #expect(!second)
  }
}

/// `ElementBatch` as a plain value.
@Suite("Sequence: element batch")
struct SequenceElementBatchTests {
  @Test func moveAllSwapsWhenTheDestinationIsEmpty() {
    var source = ElementBatch<Int>()
    for value in 0..<5 { source.append(value) }
    var destination = ElementBatch<Int>()
    #expect(destination.moveAll(from: &source) == nil)
    #expect(destination.count == 5)
    #expect(source.isEmpty)
  }

  @Test func moveAllAppendsBehindUnconsumedElements() {
    var source = ElementBatch<Int>()
    source.append(3)
    var destination = ElementBatch<Int>()
    destination.append(1)
    destination.append(2)
    _ = destination.popFirst()
    _ = destination.moveAll(from: &source)
    var out: [Int] = []
    while let value = destination.popFirst() { out.append(value) }
    #expect(out == [2, 3])
  }

  @Test func compactionHandsBackTheOldStorage() {
    var batch = ElementBatch<Int>()
    for value in 0..<200 { batch.append(value) }
    for _ in 0..<150 { _ = batch.popFirst() }
    let old = batch.compactIfWasteful()
    #expect(old?.count == 200)
    #expect(batch.count == 50)
    #expect(batch.popFirst() == 150)
  }
}
