import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

/// The activity sequence's state machine as a value.
@Suite("Sequence: activity state machine")
struct SequenceActivityStateMachineTests {
  typealias Machine = ActivitySequenceStateMachine<String>

  static func event(_ nanoseconds: Int64) -> LoopActivityEvent {
    LoopActivityEvent(activity: .beforeWaiting, instant: LoopClock.Instant(nanoseconds: nanoseconds))
  }

  @Test func aConsumerThatFallsBehindLosesTheOldestEventsCounted() {
    var machine = Machine(bufferLimit: 3)
    for index in 0..<10 { _ = machine.observed(Self.event(Int64(index))) }
    #expect(machine.droppedCount == 7)
    var batch = ElementBatch<LoopActivityEvent>()
    guard case .took = machine.take(into: &batch) else {
      Issue.record("nothing to take")
      return
    }
    var instants: [Int64] = []
    while let event = batch.popFirst() { instants.append(event.instant.nanoseconds) }
    #expect(instants == [7, 8, 9])
  }

  @Test func aWaitingConsumerIsResumedByTheNextActivity() {
    var machine = Machine(bufferLimit: 8)
    _ = machine.suspendConsumer("c")
    guard machine.observed(Self.event(1)) == "c" else {
      Issue.record("not resumed")
      return
    }
  }

  @Test func invalidationDeliversWhatWasRecordedThenEnds() {
    var machine = Machine(bufferLimit: 8)
    _ = machine.observed(Self.event(1))
    _ = machine.memberEnded()
    var batch = ElementBatch<LoopActivityEvent>()
    guard case .took = machine.take(into: &batch) else {
      Issue.record("the recorded event was lost")
      return
    }
    batch.removeAll()
    guard case .end = machine.take(into: &batch) else {
      Issue.record("did not end")
      return
    }
  }
}

/// Activity sequences on real loops.
@Suite("Sequence: activity sequences on a loop")
struct SequenceActivityTests {
  @Test func wakeUpsAreObservedInOrderWithTimestamps() async throws {
    let loop = try RunLoopThread(name: "seq-activity")
    defer { loop.shutdownAndWait() }
    // Room for every event even if the consumer stalls for minutes (under a sanitizer, beside
    // other tests, it stalled 5 s while the loop woke 500 times a second: the default 4,096
    // dropped the oldest, and the first event left was an afterWaiting after an afterWaiting).
    let activities = loop.activities([.beforeWaiting, .afterWaiting], bufferLimit: 1_000_000)
    let waking = Atomic<Bool>(true)
    let waker = SequenceTestThread.start {
      // A wake-up that finds the loop awake is coalesced (no sleep, no afterWaiting): keep waking.
      while waking.load(ordering: .relaxed) {
        usleep(2_000)
        loop.wakeUp()
      }
    }
    let events = try await withWatchdog(timeout: .seconds(10), "activities") { () async -> [LoopActivityEvent] in
      var events: [LoopActivityEvent] = []
      for await event in activities {  // consumed off the loop: no feedback
        events.append(event)
        if events.filter({ $0.activity == .afterWaiting }).count == 5 { break }
      }
      return events
    }
    waking.store(false, ordering: .relaxed)
    waker.join()
    let observed = try #require(events)
    #expect(activities.droppedCount == 0)
    for (earlier, later) in zip(observed, observed.dropFirst()) {
      #expect(earlier.instant <= later.instant)
      #expect(earlier.activity != later.activity, "sleep and wake alternate: \(observed)")
    }
    #expect(!activities.observer.isValid)  // breaking out invalidated the observer
  }

  @Test func cancelInvalidateAndShutdownEachEndAWaitingConsumer() async throws {
    for ending in SequenceEnding.allCases {
      let loop = try RunLoopThread(name: "seq-activity-\(ending)")
      let activities = loop.activities(.entry)  // the owned loop's run has started already
      let consumer = Task { () async -> Int in
        var count = 0
        for await _ in activities { count += 1 }
        return count
      }
      _ = try await ending.end(consumer, invalidate: activities.invalidate, loop: loop, "activity consumer")
      await eventually("observer invalidated after \(ending)") { !activities.observer.isValid }
      loop.shutdownAndWait()
    }
  }
}
