import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

/// The readiness sequence's state machine as a value.
@Suite("Sequence: readiness state machine")
struct SequenceReadinessStateMachineTests {
  typealias Machine = ReadinessSequenceStateMachine<String>

  @Test func aSecondEventBeforeTheConsumerReadsPausesTheRegistration() {
    var machine = Machine()
    guard case .recorded = machine.ready(.readable) else {
      Issue.record("the first event was not just recorded")
      return
    }
    guard case .pauseRegistration = machine.ready(.readable) else {
      Issue.record("a repeat while unread did not pause")
      return
    }
    guard case .took([.readable], true) = machine.takeBatch() else {
      Issue.record("taking did not ask to resume the registration")
      return
    }
    let resume = machine.registrationCheck()
    #expect(resume)
  }

  @Test func theRegistrationStaysPausedWhileAnElementWaitsAgain() {
    var machine = Machine()
    _ = machine.ready(.readable)
    _ = machine.ready(.readable)
    _ = machine.takeBatch()
    _ = machine.ready(.writable)  // arrived (a mode switch re-armed it) before the resume ran
    let stillPaused = !machine.registrationCheck()
    #expect(stillPaused)
    guard case .took([.writable], true) = machine.takeBatch() else {
      Issue.record("the next take did not resume the registration")
      return
    }
  }

  @Test func aWaitingConsumerGetsTheEventsAtOnce() {
    var machine = Machine()
    _ = machine.suspendConsumer("c")
    guard case .resumeConsumer("c") = machine.ready([.readable, .hangUp]),
      case .took([[.readable, .hangUp]], false) = machine.takeBatch()
    else {
      Issue.record("the events were not handed over")
      return
    }
  }

  @Test func invalidationDeliversWhatWasSeenThenEnds() {
    var machine = Machine()
    _ = machine.ready(.error)
    _ = machine.memberEnded()
    guard case .took([.error], false) = machine.takeBatch(), case .end = machine.takeBatch() else {
      Issue.record("did not drain, then end")
      return
    }
    let stillPaused = !machine.registrationCheck()
    #expect(stillPaused)
  }
}

/// Readiness sequences on real loops, with pipes and socket pairs.
@Suite("Sequence: readiness sequences on a loop")
struct SequenceReadinessTests {
  @Test func aPipeBecomingReadableIsDeliveredAndTheConsumerReadsIt() async throws {
    let loop = try RunLoopThread(name: "seq-ready")
    defer { loop.shutdownAndWait() }
    let (readEnd, writeEnd) = makePipe()
    defer {
      close(readEnd)
      close(writeEnd)
    }
    let readiness = try loop.readiness(of: readEnd, events: .readable)
    let writer = SequenceTestThread.start {
      for _ in 0..<3 {
        usleep(5_000)
        writeByte(writeEnd)
      }
    }
    let bytes = try await withWatchdog(timeout: .seconds(10), "three bytes") {
      await consumeOnLoop(loop) { () async -> Int in
        var bytes = 0
        for await events in readiness {
          #expect(events.contains(.readable))
          bytes += drainDescriptor(readEnd)
          if bytes == 3 { break }
        }
        return bytes
      }
    }
    writer.join()
    #expect(bytes == 3)
    #expect(!readiness.source.isValid)  // breaking out deregistered the descriptor
  }

  @Test func aSocketIsWritableAtOnce() async throws {
    let loop = try RunLoopThread(name: "seq-writable")
    defer { loop.shutdownAndWait() }
    var pair: [Int32] = [0, 0]
    try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0, &pair) == 0)
    defer {
      close(pair[0])
      close(pair[1])
    }
    let readiness = try loop.readiness(of: pair[0], events: .writable)
    let events = try await withWatchdog(timeout: .seconds(10), "writable") { () async -> DescriptorEvents? in
      for await events in readiness { return events }
      return nil
    }
    #expect(events??.contains(.writable) == true)
  }

  @Test func anOffLoopConsumerThatHasNotReadDoesNotMakeTheLoopSpin() async throws {
    let loop = try RunLoopThread(name: "seq-nospin")
    defer { loop.shutdownAndWait() }
    let (readEnd, writeEnd) = makePipe()
    defer {
      close(readEnd)
      close(writeEnd)
    }
    let passes = Atomic<Int>(0)
    let observer = LoopObserver(activities: .afterWaiting) { _, _ in
      passes.wrappingAdd(1, ordering: .relaxed)  // counting only
    }
    loop.add(observer, to: .common)
    defer { observer.invalidate() }
    let readiness = try loop.readiness(of: readEnd)
    writeByte(writeEnd)
    let first = try await withWatchdog(timeout: .seconds(10), "first event") { () async -> Bool in
      var iterator = readiness.makeAsyncIterator()
      guard await iterator.next() != nil else { return false }
      // Do not read for a while: the descriptor stays readable.
      let before = passes.load(ordering: .relaxed)
      try? await Task.sleep(for: .milliseconds(100))
      let spun = passes.load(ordering: .relaxed) - before
      #expect(spun < 20, "the loop woke \(spun) times for a descriptor nobody read")
      _ = drainDescriptor(readEnd)
      writeByte(writeEnd)
      guard await iterator.next() != nil else { return false }  // resumed after the take
      return true
    }
    #expect(first == true)
  }

  @Test func cancelInvalidateAndShutdownEachEndAWaitingConsumer() async throws {
    for ending in SequenceEnding.allCases {
      let loop = try RunLoopThread(name: "seq-ready-\(ending)")
      let (readEnd, writeEnd) = makePipe()
      let readiness = try loop.readiness(of: readEnd)
      let consumer = Task { () async -> Int in
        var count = 0
        for await _ in readiness { count += 1 }
        return count
      }
      let count = try await ending.end(consumer, invalidate: readiness.invalidate, loop: loop, "readiness consumer")
      #expect(count == 0, "\(ending)")
      await eventually("deregistered after \(ending)") { !readiness.source.isValid }
      loop.shutdownAndWait()
      close(readEnd)
      close(writeEnd)
    }
  }

  @Test func aClosedDescriptorIsRefusedWithEBADF() throws {
    let loop = try RunLoopThread(name: "seq-ready-bad")
    defer { loop.shutdownAndWait() }
    // A number at the descriptor limit can never be open (a closed pipe's number could be reused
    // at once by a test running in parallel).
    let neverOpen = Int32(clamping: sysconf(Int32(_SC_OPEN_MAX)))
    #expect(throws: SystemCallError.self) { _ = try loop.readiness(of: neverOpen) }
  }
}
