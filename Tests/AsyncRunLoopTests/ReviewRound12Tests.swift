import Glibc
import Testing

@testable import AsyncRunLoop

// Review round 12: timers whose callouts move them between loops (one-shot timers' records on the
// loop they were moved to, dates set during a deferred callout, shutdown of either loop), command
// sources whose closing drain waits for another loop's batch (what that wait can deadlock with),
// and the loop-thread fast path for adds and removals. Blocking work runs on threads of the tests'
// own; results are checked after the watchdog returns.

private let modeA: RunLoopMode = "r12-a"
private let modeB: RunLoopMode = "r12-b"

/// An object to watch with a weak reference (captured by a member's closure).
private final class R12Token: Sendable {}

/// The number of records `loop` holds, read on its thread (nil when it refused: shut down).
private func recordCount(_ loop: RunLoopThread) -> Int? {
  try? loop.performAndWait { loop.core.modeTable.allRecords.count }
}

@Suite("ReviewRound12: timers moved by their callouts", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound12TimerTests {
  /// A one-shot timer due now fires on A; its callout moves it to B and lets B apply the add (and,
  /// every other round, find it due: busy). After the fire it is done: invalidated, and promised
  /// (its doc: "a one-shot timer is done"; `invalidate()`: "the loop drops it from its modes") B
  /// holds nothing of it, and the timer and its handler are released.
  @Test
  func aOneShotTimerMovedToAnotherLoopInItsCalloutLeavesNothingOnThatLoop() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "one-shot moved, records") {
      () throws -> [String] in
      var wrong: [String] = []
      for round in 0..<4 {
        let loopA = try RunLoopThread(name: "r12-os-a")
        let loopB = try RunLoopThread(name: "r12-os-b")
        defer {
          loopA.shutdownAndWait()
          loopB.shutdownAndWait()
        }
        let fires = AtomicCounter()
        let calloutDone = TestGate()
        weak var weakTimer: LoopTimer?
        weak var weakCapture: R12Token?
        do {
          let capture = R12Token()
          weakCapture = capture
          let timer = LoopTimer(fireAt: .now) { timer in
            withExtendedLifetime(capture) {}
            fires.increment()
            loopA.remove(timer)
            loopB.add(timer)
            _ = try? loopB.performAndWait {}  // B applied the add (and found it due: busy)
            if round % 2 == 0 { _ = try? loopB.performAndWait {} }
            calloutDone.open()
          }
          weakTimer = timer
          loopA.add(timer)
          _ = calloutDone.wait(timeout: .seconds(10))
          _ = try? loopA.performAndWait {}
        }
        for _ in 0..<3 {
          _ = try? loopA.performAndWait {}
          _ = try? loopB.performAndWait {}
          usleep(1_000)
        }
        let onB = recordCount(loopB) ?? -1
        if fires.current != 1 || onB != 0 || weakTimer != nil || weakCapture != nil {
          wrong.append(
            "round \(round): \(fires.current) fires, \(onB) records on B, timer held \(weakTimer != nil), "
              + "handler's capture held \(weakCapture != nil)")
        }
      }
      return wrong
    }
    #expect(outcome == [])
  }

  /// The same with a `RunLoopThread.current` loop as B, run in its mode after the move: the timer
  /// that is done must not keep B's run alive (promised: a run "has nothing to watch" finishes).
  @Test
  func aOneShotTimerMovedToAnotherLoopDoesNotKeepThatLoopsRunAlive() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "one-shot moved, run") {
      () throws -> RunLoopRunResult in
      let loopA = try RunLoopThread(name: "r12-os2-a")
      defer { loopA.shutdownAndWait() }
      let loopB = RunLoopThread.current
      defer { loopB.shutdown() }
      let calloutDone = TestGate()
      let timer = LoopTimer(fireAt: .now) { timer in
        loopA.remove(timer)
        loopB.add(timer, to: modeA)
        calloutDone.open()
        usleep(20_000)  // B applies the add (its run below) while this callout runs
      }
      loopA.add(timer)
      _ = calloutDone.wait(timeout: .seconds(10))
      // Applies the add, finds the timer due (busy, or invalid once the callout ended), then has
      // nothing left to watch.
      return loopB.run(mode: modeA, until: .now.advanced(by: .seconds(1)))
    }
    #expect(outcome == .finished, "B's run ended \(String(describing: outcome))")
  }
}

/// What a moved batch's scenario shares with its two halves: the loops, the command source (held
/// only here: dropping it invalidates the source), its buffer, notes, and a gate the handler may
/// wait on.
private final class MovedBatch: Sendable {
  let loopA: RunLoopThread
  let loopB: RunLoopThread
  let loopC: RunLoopThread
  let command = Locked<CommandSource<Int>?>(nil)
  let source = Locked<InputSource?>(nil)
  let buffer = Locked<CommandBuffer<Int>?>(nil)
  let notes = Locked<[String]>([])
  let leave = TestGate()

  init(_ name: String) throws {
    loopA = try RunLoopThread(name: "\(name)-a")
    loopB = try RunLoopThread(name: "\(name)-b")
    loopC = try RunLoopThread(name: "\(name)-c")
  }

  func note(_ text: String) { notes.withLock { $0.append(text) } }

  /// Whether B's closing drain waits for A's batch now.
  var closingDrainWaits: Bool {
    guard let buffer = buffer.withLock({ $0 }) else { return false }
    return buffer.lock.withLock { !buffer.closingWaiters.isEmpty }
  }

  func waitForClosingDrain() -> Bool {
    let deadline = ContinuousClock.now.advanced(by: .seconds(10))
    while !closingDrainWaits {
      if ContinuousClock.now >= deadline { return false }
      usleep(200)
    }
    return true
  }
}

/// What a moved batch delivered.
private struct MovedOutcome: Sendable {
  var delivered: [Int]
  var accepted: [Int]
  var cancels: Int
  /// Commands delivered after the last (second) cancel.
  var afterLastCancel: Int
  var notes: [String]
  var captureGone: Bool
}

@Suite("ReviewRound12: a closing drain waiting for another loop's batch", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound12CommandTests {
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
      weak var weakCapture: R12Token?
      var accepted: [Int] = []
      do {
        let capture = R12Token()
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
      "r12-sd",
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
      "r12-sd2",
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
      "r12-blk",
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
      "r12-cyc3",
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
      "r12-drop",
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
      "r12-inv",
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

extension ReviewRound12TimerTests {
  /// A repeating timer (one hour) due now fires on A; its callout moves it to B (B defers it as
  /// busy), then a third thread calls `setFireDate(now + 20 ms)` while the callout still runs.
  /// Promised: a date set during the callout wins over the grid; B fires it once at (not before)
  /// that date, and never again for an hour. Callouts never overlap; no spin on B meanwhile.
  @Test func aDateSetFromAThirdThreadDuringADeferredCalloutFiresOnceThere() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "deferred, set date") {
      () throws -> (fires: [String], early: Bool, overlapped: Bool, passesB: Int) in
      let loopA = try RunLoopThread(name: "r12-sfd-a")
      let loopB = try RunLoopThread(name: "r12-sfd-b")
      defer {
        loopA.shutdownAndWait()
        loopB.shutdownAndWait()
      }
      let passesB = AtomicCounter()
      loopB.add(LoopObserver(activities: [.beforeTimers]) { _, _ in passesB.increment() }, to: .common)
      let fires = Locked<[String]>([])
      let inside = Locked(0)
      let overlapped = Locked(false)
      let early = Locked(false)
      let target = Locked<LoopClock.Instant?>(nil)
      let timer = LoopTimer(fireAt: .now, repeatingEvery: .seconds(3600)) { timer in
        let depth = inside.withLock {
          $0 += 1
          return $0
        }
        if depth > 1 { overlapped.withLock { $0 = true } }
        defer { inside.withLock { $0 -= 1 } }
        if let date = target.withLock({ $0 }), LoopClock.Instant.now < date { early.withLock { $0 = true } }
        let count = fires.withLock {
          $0.append(RunLoopThread.current.name)
          return $0.count
        }
        guard count == 1 else { return }
        loopA.remove(timer)
        loopB.add(timer)
        _ = try? loopB.performAndWait {}  // B found it due: busy
        let setter = startThread {
          let date = LoopClock.Instant.now.advanced(by: .milliseconds(20))
          target.withLock { $0 = date }
          timer.setFireDate(date)
        }
        joinThread(setter)
        usleep(5_000)
      }
      loopA.add(timer)
      _ = waitUntil("the second fire") { fires.withLock { $0.count } >= 2 }
      let passes = passesB.current
      usleep(50_000)
      for _ in 0..<2 {
        _ = try? loopA.performAndWait {}
        _ = try? loopB.performAndWait {}
      }
      timer.invalidate()
      return (fires.withLock { $0 }, early.withLock { $0 }, overlapped.withLock { $0 }, passes)
    }
    guard let outcome else { return }
    #expect(outcome.fires == ["r12-sfd-a", "r12-sfd-b"])
    #expect(!outcome.early, "fired before the date set during the callout")
    #expect(!outcome.overlapped)
    #expect(outcome.passesB < 200, "B made \(outcome.passesB) passes while the timer was deferred")
    print("deferred timer with a date set: \(outcome.fires), B passes \(outcome.passesB)")
  }

  /// A one-shot timer's callout moves it to B and sets a new date: it keeps that date (it fires
  /// again then, as in CF) on B, once; after that fire it is done on B (B holds nothing of it).
  @Test func aOneShotTimerMovedWithANewDateFiresOnceMoreThereAndIsDone() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "one-shot moved with a date") {
      () throws -> (fires: [String], valid: Bool, onB: Int?) in
      let loopA = try RunLoopThread(name: "r12-osd-a")
      let loopB = try RunLoopThread(name: "r12-osd-b")
      defer {
        loopA.shutdownAndWait()
        loopB.shutdownAndWait()
      }
      let fires = Locked<[String]>([])
      let timer = LoopTimer(fireAt: .now) { timer in
        let count = fires.withLock {
          $0.append(RunLoopThread.current.name)
          return $0.count
        }
        guard count == 1 else { return }
        loopA.remove(timer)
        loopB.add(timer)
        _ = try? loopB.performAndWait {}
        timer.setFireDate(.now.advanced(by: .milliseconds(5)))
      }
      loopA.add(timer)
      _ = waitUntil("the second fire") { fires.withLock { $0.count } >= 2 }
      usleep(20_000)
      for _ in 0..<2 {
        _ = try? loopA.performAndWait {}
        _ = try? loopB.performAndWait {}
      }
      return (fires.withLock { $0 }, timer.isValid, recordCount(loopB))
    }
    guard let outcome else { return }
    #expect(outcome.fires == ["r12-osd-a", "r12-osd-b"])
    #expect(!outcome.valid)
    #expect(outcome.onB == 0, "B still holds the finished one-shot timer")
  }

  /// A repeating 3 ms timer's first callout moves it to B and shuts down its own loop A from inside
  /// the callout. The timer is B's now: it keeps firing there (A's shutdown does not invalidate a
  /// timer that left it), callouts never overlap, and `invalidateAndWait()` ends it.
  @Test func aCalloutShuttingDownItsOwnLoopAfterMovingTheTimerLeavesItFiringThere() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "callout shuts down its loop") {
      () throws -> (onB: Int, valid: Bool, overlapped: Bool, after: Int) in
      let loopA = try RunLoopThread(name: "r12-own-a")
      let loopB = try RunLoopThread(name: "r12-own-b")
      defer {
        loopA.shutdownAndWait()
        loopB.shutdownAndWait()
      }
      let onB = AtomicCounter()
      let first = AtomicCounter()
      let inside = Locked(0)
      let overlapped = Locked(false)
      let timer = LoopTimer(fireAt: .now, repeatingEvery: .milliseconds(3)) { timer in
        let depth = inside.withLock {
          $0 += 1
          return $0
        }
        if depth > 1 { overlapped.withLock { $0 = true } }
        defer { inside.withLock { $0 -= 1 } }
        if RunLoopThread.current === loopB {
          onB.increment()
          return
        }
        guard first.increment() == 1 else { return }
        loopA.remove(timer)
        loopB.add(timer, to: .common)
        loopA.shutdown()
        usleep(10_000)  // B finds it due meanwhile: busy
      }
      loopA.add(timer)
      _ = waitUntil("fires on B") { onB.current >= 5 }
      loopA.shutdownAndWait()
      let before = onB.current
      _ = waitUntil("more fires on B after A finished") { onB.current >= before + 3 }
      let valid = timer.isValid
      try? timer.invalidateAndWait()
      let after = onB.current
      usleep(20_000)
      return (onB.current, valid, overlapped.withLock { $0 }, onB.current - after)
    }
    guard let outcome else { return }
    #expect(outcome.valid, "A's shutdown invalidated a timer that had moved to B")
    #expect(!outcome.overlapped)
    #expect(outcome.after == 0)
  }

  /// A one-shot timer's callout removes it from its only mode, adds it back in another mode of the
  /// same loop and runs that mode nested (the new record is due: busy there, never run inside its
  /// own callout). After the fire it is done: one fire, nothing left in any mode, released.
  @Test func aOneShotTimerReAddedInAnotherModeAndRunNestedFiresOnceAndIsDone() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "one-shot, other mode, nested") {
      () -> (fires: Int, nestedPasses: Int, records: Int, released: Bool) in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      let fires = AtomicCounter()
      let nestedPasses = AtomicCounter()
      loop.add(LoopObserver(activities: [.beforeTimers]) { _, _ in nestedPasses.increment() }, to: modeB)
      weak var weakTimer: LoopTimer?
      do {
        let timer = LoopTimer(fireAt: .now) { timer in
          fires.increment()
          RunLoopThread.current.remove(timer, from: modeA)
          RunLoopThread.current.add(timer, to: modeB)
          _ = RunLoopThread.current.run(mode: modeB, until: .now.advanced(by: .milliseconds(20)))
        }
        weakTimer = timer
        let keep = LoopTimer(after: .seconds(3600)) { _ in }
        loop.add(keep, to: modeA)
        loop.add(timer, to: modeA)
        _ = loop.run(mode: modeA, until: .now.advanced(by: .milliseconds(40)))
        _ = loop.run(mode: modeB, until: .now.advanced(by: .milliseconds(10)))
        keep.invalidate()
        _ = loop.run(mode: modeA, until: .now.advanced(by: .milliseconds(1)))
      }
      // Only the observer is left.
      return (fires.current, nestedPasses.current, loop.core.modeTable.allRecords.count - 1, weakTimer == nil)
    }
    guard let outcome else { return }
    #expect(outcome.fires == 1)
    #expect(outcome.records == 0, "records left in the modes")
    #expect(outcome.released)
    // No spin: 20 ms of nested run with the busy timer parked makes a few passes, not thousands.
    #expect(outcome.nestedPasses < 200, "\(outcome.nestedPasses) passes")
  }
}

@Suite("ReviewRound12: the loop-thread fast path", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound12FastPathTests {
  /// A block on the loop waits while another thread sends a change (add to a mode, or a removal),
  /// then signals it; the block then makes the opposite change on the loop thread, sometimes from
  /// a nested run. Promised: the loop-thread call comes after every change sent before it, so the
  /// routines pair up in order and each source ends as the block left it.
  @Test func aLoopThreadChangeAfterACrossThreadOneWithHappensBeforeComesAfterIt() async throws {
    let loop = try RunLoopThread(name: "r12-fast")
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "fast path order") {
      () -> (wrong: [String], rounds: Int) in
      defer { loop.shutdownAndWait() }
      let wrong = Locked<[String]>([])
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: modeA)
      let rounds = repeatRounds(300, budget: .milliseconds(600)) { round in
        let log = EventLog()
        let source = InputSource(
          schedule: { _, _, mode in log.add("schedule \(mode)") }, cancel: { _, _ in log.add("cancel") }
        ) { _ in }
        let sent = TestGate()
        let done = TestGate()
        let addsFirst = round % 2 == 0
        if !addsFirst { loop.add(source, to: modeA) }
        loop.perform {
          _ = sent.wait(timeout: .seconds(10))
          let change: @Sendable () -> Void = {
            if addsFirst {
              loop.remove(source, from: modeA)  // after the add sent from the other thread
            } else {
              loop.add(source, to: modeA)  // after the removal sent from the other thread
            }
          }
          if round % 3 == 0 {
            loop.perform(inModes: [modeA]) { change() }
            _ = loop.run(mode: modeA, until: .now.advanced(by: .milliseconds(1)))
          } else {
            change()
          }
          done.open()
        }
        if addsFirst { loop.add(source, to: modeA) } else { loop.remove(source, from: modeA) }
        sent.open()
        _ = done.wait(timeout: .seconds(10))
        _ = try? loop.performAndWait {}
        let expected =
          addsFirst ? ["schedule \(modeA)", "cancel"] : ["schedule \(modeA)", "cancel", "schedule \(modeA)"]
        let bound = source.isBound(to: loop.shared)
        if log.snapshot != expected || bound != !addsFirst {
          wrong.withLock { $0.append("round \(round): \(log.snapshot), bound \(bound)") }
        }
        source.invalidate()
      }
      keep.invalidate()
      return (wrong.withLock { $0 }, rounds)
    }
    guard let outcome else { return }
    #expect(outcome.wrong == [])
    print("fast path order: \(outcome.rounds) rounds")
  }
}
