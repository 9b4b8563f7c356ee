import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

/// The coalescing signal sequence's state machine as a value.
@Suite("Sequence: signal state machine")
struct SequenceSignalStateMachineTests {
  typealias Machine = SignalSequenceStateMachine<String>

  @Test func manySignalsBecomeOneElementCountingThem() {
    var machine = Machine()
    var actions: [Bool] = []
    for _ in 0..<5 {
      if case .signalSource = machine.signal() { actions.append(true) } else { actions.append(false) }
    }
    #expect(actions == [true, false, false, false, false])  // only the first signals the source
    _ = machine.release()
    guard case .took([5], _) = machine.takeBatch() else {
      Issue.record("five signals did not become one element of 5")
      return
    }
    guard case .suspend = machine.takeBatch() else {
      Issue.record("an element without a signal")
      return
    }
  }

  @Test func aSignalAfterTheLoopFiredSignalsTheSourceAgain() {
    var machine = Machine()
    _ = machine.signal()
    _ = machine.release()
    guard case .signalSource = machine.signal() else {
      Issue.record("a signal after the release was lost")
      return
    }
  }

  @Test func signalsAreHeldUntilTheLoopReleasesThem() {
    var machine = Machine()
    _ = machine.signal()
    guard case .suspend = machine.takeBatch(), case .suspended = machine.suspendConsumer("c") else {
      Issue.record("took signals the loop had not released")
      return
    }
    guard machine.release() == "c", case .took([1], _) = machine.takeBatch() else {
      Issue.record("the release did not hand the signal over")
      return
    }
  }

  @Test func invalidateDeliversTheSignalsMadeThenEnds() {
    var machine = Machine()
    _ = machine.signal()
    _ = machine.signal()
    guard machine.close() != nil, case .refused = machine.signal() else {
      Issue.record("signals after invalidate were taken")
      return
    }
    _ = machine.memberEnded()
    guard case .took([2], _) = machine.takeBatch(), case .end = machine.takeBatch() else {
      Issue.record("did not drain, then end")
      return
    }
  }

  @Test func stoppingResumesTheConsumerOnceAndInvalidatesOnce() {
    var machine = Machine()
    _ = machine.suspendConsumer("c")
    guard case .stop("c", true, _) = machine.stopConsuming(), case .none = machine.stopConsuming() else {
      Issue.record("stop was not once")
      return
    }
    guard case .refused = machine.signal(), case .end = machine.takeBatch() else {
      Issue.record("a stopped sequence went on")
      return
    }
  }
}

/// Signal sequences on real loops.
@Suite("Sequence: signal sequences on a loop")
struct SequenceSignalTests {
  @Test func everySignalIsCountedAndTheLastOneIsAlwaysDelivered() async throws {
    let loop = try RunLoopThread(name: "seq-signal")
    defer { loop.shutdownAndWait() }
    let signals = loop.signalSequence()
    let total = 200_000 * stressFactor
    let threads = (0..<2).map { _ in
      SequenceTestThread.start {
        for index in 0..<total / 2 {
          #expect(signals.signal())
          if index % 1_000 == 0 { usleep(50) }  // bursts with gaps: some elements stand for one signal
        }
      }
    }
    let outcome = try await withWatchdog(timeout: .seconds(60), "all signals delivered") {
      await consumeOnLoop(loop) { () async -> (sum: Int, elements: Int) in
        var sum = 0
        var elements = 0
        for await count in signals {
          #expect(count >= 1)
          sum += count
          elements += 1
          if sum == total { break }  // ends only if the signals after the last element arrive
        }
        return (sum, elements)
      }
    }
    threads.forEach { $0.join() }
    #expect(outcome?.sum == total)
    #expect((outcome?.elements ?? 0) <= total)
  }

  /// A signal sent while the consumer waits, after it took every signal before, is an element of
  /// its own. (Each signal waits for the consumer to catch up: a fixed pause between them let two
  /// signals fold into one element on a loaded machine, and a consumer counting elements waited
  /// for a third that never came.)
  @Test func aSignalAfterAQuietPeriodIsDelivered() async throws {
    let loop = try RunLoopThread(name: "seq-signal-quiet")
    defer { loop.shutdownAndWait() }
    let signals = loop.signalSequence()
    let received = Guarded<[Int]>([])
    let consumer = Task(executorPreference: loop) {
      for await count in signals {
        let total = received.withLock { counts in
          counts.append(count)
          return counts.reduce(0, +)
        }
        if total >= 3 { break }
      }
    }
    for sent in 0..<3 {
      let caughtUp = await pollAsync(timeout: .seconds(20) * watchdogScale) {
        received.withLock { $0.reduce(0, +) } == sent
      }
      #expect(caughtUp, "the consumer took \(received.withLock { $0 }) for \(sent) signals sent")
      try await Task.sleep(for: .milliseconds(10))  // the consumer waits again
      signals.signal()
    }
    try await withWatchdog(timeout: .seconds(10), "three separate signals") { await consumer.value }
    #expect(received.withLock { $0 } == [1, 1, 1])
  }

  @Test func cancelInvalidateAndShutdownEachEndAWaitingConsumer() async throws {
    for ending in SequenceEnding.allCases {
      let loop = try RunLoopThread(name: "seq-signal-\(ending)")
      let cancels = SequenceCallLog()
      let signals = loop.signalSequence(onCancel: { cancelLoop in
        cancels.record(onLoopThread: cancelLoop.isOnLoopThread)
      })
      let consumer = Task { () async -> Int in
        var sum = 0
        for await count in signals { sum += count }
        return sum
      }
      signals.signal()
      let sum = try await ending.end(consumer, invalidate: signals.invalidate, loop: loop, "signal consumer")
      #expect(sum == 1, "\(ending)")
      #expect(!signals.signal(), "\(ending)")
      await eventually("cancel routine after \(ending)") { cancels.count == 1 }
      #expect(cancels.allOnLoopThread)
      loop.shutdownAndWait()
    }
  }

  @Test func aSecondIteratorTraps() async {
    await #expect(processExitsWith: .failure) {
      let loop = try RunLoopThread(name: "seq-signal-trap")
      let signals = loop.signalSequence()
      _ = signals.makeAsyncIterator()
      _ = signals.makeAsyncIterator()
    }
  }
}
