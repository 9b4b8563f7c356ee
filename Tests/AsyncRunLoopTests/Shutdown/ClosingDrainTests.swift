import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("A closing drain waiting for another loop's batch finishes", .serialized, .timeLimit(.minutes(10)))
struct ClosingDrainTests {
  /// A command source gets a batch of 100 on A; the handler of command 0 moves it to B (B joins
  /// it and finds A delivering), then runs `inHandler` on A's thread; the test thread posts 50 more
  /// and runs `fromTest`. Returns what was delivered, once both loops are done.
  private static func movedBatch(
    _ name: String, inHandler: @escaping @Sendable (MovedBatch) -> Void,
    onValue: @escaping @Sendable (Int, MovedBatch) -> Void = { _, _ in },
    fromTest: @escaping @Sendable (MovedBatch) -> Void
  ) async throws -> MovedOutcome? {
    try await withWatchdogOnThread(timeout: .seconds(30), name) { () throws -> MovedOutcome in
      let scenario = try MovedBatch(name)
      defer {
        scenario.loopA.shutdownAndWait()
        scenario.loopB.shutdownAndWait()
        scenario.loopC.shutdownAndWait()
      }
      let delivered = Locked<[Int]>([])
      let cancels = AtomicCounter()
      let cancelsAtDelivery = Locked<[Int]>([])
      let moved = TestGate()
      weak var weakCapture: WeaklyObservedObject?
      var accepted: [Int] = []
      do {
        let capture = WeaklyObservedObject()
        weakCapture = capture
        let command = CommandSource<Int>(cancel: { _, _ in cancels.increment() }) { value in
          withExtendedLifetime(capture) {}
          delivered.withLock { $0.append(value) }
          cancelsAtDelivery.withLock { $0.append(cancels.current) }
          onValue(value, scenario)
          guard value == 0, let source = scenario.source.withLock({ $0 }) else { return }
          RunLoopThread.current.remove(source)  // its last mode on A: A's cancel runs now
          scenario.loopB.add(source)
          _ = try? scenario.loopB.performAndWait {}  // B joined it and found A delivering
          moved.open()
          inHandler(scenario)
        }
        scenario.command.withLock { $0 = command }
        scenario.source.withLock { $0 = command.source }
        scenario.buffer.withLock { $0 = command.buffer }
        let release = blockLoop(scenario.loopA)
        scenario.loopA.add(command.source)
        for value in 0..<100 where command.post(value) { accepted.append(value) }  // one batch on A
        release.open()
      }
      _ = moved.wait(timeout: .seconds(10))
      if let command = scenario.command.withLock({ $0 }) {
        for value in 100..<150 where command.post(value) { accepted.append(value) }
      }
      fromTest(scenario)
      scenario.source.withLock { $0 }?.invalidate()
      scenario.command.withLock { $0 = nil }
      scenario.leave.open()
      let deadline = ContinuousClock.now.advanced(by: .seconds(10))
      while cancels.current < 2 && ContinuousClock.now < deadline { usleep(500) }
      scenario.loopB.shutdownAndWait()
      _ = try? scenario.loopA.performAndWait {}
      scenario.source.withLock { $0 = nil }
      scenario.buffer.withLock { $0 = nil }
      let afterLast = cancelsAtDelivery.withLock { $0 }.filter { $0 >= 2 }.count
      return MovedOutcome(
        delivered: delivered.withLock { $0 }, accepted: accepted, cancels: cancels.current,
        afterLastCancel: afterLast, notes: scenario.notes.withLock { $0 }, captureGone: weakCapture == nil)
    }
  }

  private static func expectExactDelivery(
    _ outcome: MovedOutcome, sourceLocation: SourceLocation = #_sourceLocation
  ) {
    let exact = outcome.delivered == outcome.accepted
    print(
      "moved batch: accepted \(outcome.accepted.count), delivered \(outcome.delivered.count), notes \(outcome.notes)")
    #expect(
      exact, "accepted \(outcome.accepted.count), delivered \(outcome.delivered.count); same order: \(exact)",
      sourceLocation: sourceLocation)
    #expect(outcome.cancels == 2, "\(outcome.cancels) cancels", sourceLocation: sourceLocation)
    #expect(outcome.afterLastCancel == 0, "delivered after the last cancel", sourceLocation: sourceLocation)
  }

  /// A's handler (its source moved to B) shuts B down and waits for it (`shutdownAndWait`, "any
  /// thread except the loop's own"). B's shutdown invalidates the source, and its closing drain
  /// would wait for A's batch, which waits for B. The handler's wait is in the loops' wait-for
  /// graph, so B sees the cycle and delivers at once (documented: the rest of A's batch then
  /// comes after B's cancel). Promised here: nothing hangs, and every accepted command is
  /// delivered exactly once. (Found as a deadlock in review round 12.)
  @Test
  func aHandlerShuttingDownTheLoopItMovedItsSourceToDoesNotDeadlock() async throws {
    let outcome = try await Self.movedBatch(
      "sd",
      inHandler: { scenario in scenario.loopB.shutdownAndWait() }, fromTest: { _ in })
    guard let outcome else { return }
    let once = outcome.delivered.sorted() == outcome.accepted.sorted()
    #expect(once, "accepted \(outcome.accepted.count), delivered \(outcome.delivered.count)")
  }

  /// The same wait, but where the loops cannot see it: the handler waits on a gate that another
  /// thread opens once B's `shutdownAndWait` returns. B's closing drain gives up after its limit
  /// (a second) and delivers at once; nothing hangs and every accepted command comes once.
  @Test
  func aHandlerWaitingForTheMovedToLoopInAnUnseenWayIsNotHungForGood() async throws {
    let outcome = try await Self.movedBatch(
      "sd2",
      inHandler: { scenario in
        let done = TestGate()
        startThread(detached: true) {
          scenario.loopB.shutdownAndWait()
          done.open()
        }
        if !done.wait(timeout: .seconds(20)) { scenario.note("B's shutdown did not end while the handler waited") }
      }, fromTest: { _ in })
    guard let outcome else { return }
    #expect(outcome.notes == [])
    let once = outcome.delivered.sorted() == outcome.accepted.sorted()
    #expect(once, "accepted \(outcome.accepted.count), delivered \(outcome.delivered.count)")
  }

  /// A's handler waits (bounded) for a block it performed on B, while B's closing drain (the test
  /// invalidated the source) waits for A's batch. Documented: B's thread waits for the batch, so
  /// the block cannot run meanwhile (a plain `perform` is not in the wait-for graph); once the
  /// handler gives up, everything is delivered once, in order, before the last cancel, and the
  /// block runs.
  @Test func aHandlerWaitingForABlockOnTheWaitingLoopOnlyDelaysIt() async throws {
    let ran = TestGate()
    let outcome = try await Self.movedBatch(
      "blk",
      inHandler: { scenario in
        guard scenario.waitForClosingDrain() else { return scenario.note("B's closing drain never waited") }
        scenario.loopB.perform { ran.open() }
        if ran.wait(timeout: .milliseconds(300)) { scenario.note("the block ran while B's drain waited") }
      },
      fromTest: { scenario in
        scenario.source.withLock { $0 }?.invalidate()
      })
    guard let outcome else { return }
    print("block on the waiting loop: \(outcome.notes)")
    #expect(!outcome.notes.contains("B's closing drain never waited"))
    #expect(ran.wait(timeout: .seconds(10)), "the block never ran")
    Self.expectExactDelivery(outcome)
  }

  /// Three loops: B's closing drain waits for A's batch; A's handler waits for C
  /// (`performAndWait`), whose block waits for B (`performAndWait`): the last wait closes the
  /// cycle A → C → B → A and is refused with `wouldDeadlock`; nothing hangs, and every command
  /// comes once, in order, before the last cancel.
  @Test func aThreeLoopCycleThroughTheClosingDrainIsRefusedNotHung() async throws {
    let outcome = try await Self.movedBatch(
      "cyc3",
      inHandler: { scenario in
        guard scenario.waitForClosingDrain() else { return scenario.note("B's closing drain never waited") }
        let loopB = scenario.loopB
        do {
          try scenario.loopC.performAndWait { try loopB.performAndWait {} }
          scenario.note("C's wait for B was not refused")
        } catch RunLoopError.wouldDeadlock {
        } catch {
          scenario.note("C's wait for B threw \(error)")
        }
      },
      fromTest: { scenario in
        scenario.source.withLock { $0 }?.invalidate()
      })
    guard let outcome else { return }
    #expect(outcome.notes == [])
    Self.expectExactDelivery(outcome)
  }

  /// The `CommandSource` is dropped (its deinit invalidates the source) while A delivers the batch
  /// and the source is on B: B's closing drain waits for A, then delivers the rest and cancels.
  /// Every command once, in order, before the last cancel; the handler's capture is released.
  @Test func aCommandSourceDroppedWhileMovedMidBatchDeliversEverythingInOrder() async throws {
    let outcome = try await Self.movedBatch(
      "drop",
      inHandler: { scenario in
        _ = scenario.leave.wait(timeout: .seconds(10))
      },
      fromTest: { scenario in
        scenario.command.withLock { $0 = nil }  // the last reference: deinit invalidates
        if !scenario.waitForClosingDrain() { scenario.note("B's closing drain never waited") }
      })
    guard let outcome else { return }
    #expect(outcome.notes == [])
    Self.expectExactDelivery(outcome)
    #expect(outcome.captureGone, "the dropped command source's handler is still held")
  }

  /// A's handler invalidates the source itself (it is on B by now) at command 50 of its batch; B's
  /// closing drain waits, and the test shuts B down meanwhile. Posts after the invalidation are
  /// refused; every accepted one is delivered once, in order, before the last cancel.
  @Test func aHandlerInvalidatingItsMovedSourceWhileTheNewLoopShutsDown() async throws {
    let outcome = try await Self.movedBatch(
      "inv",
      inHandler: { _ in },
      onValue: { value, scenario in
        if value == 50 { scenario.source.withLock { $0 }?.invalidate() }
        if value == 51 {
          if !scenario.waitForClosingDrain() { scenario.note("B's closing drain never waited") }
          _ = scenario.leave.wait(timeout: .seconds(10))
        }
      },
      fromTest: { scenario in
        _ = scenario.waitForClosingDrain()
        scenario.loopB.shutdown()
      })
    guard let outcome else { return }
    #expect(outcome.notes == [])
    Self.expectExactDelivery(outcome)
  }
}
