import Glibc
import Testing

@testable import AsyncRunLoop

/// A source's cancel routine runs exactly once per schedule, however it moves or ends.
@Suite("A source's cancel routine runs exactly once per schedule, however it moves or ends", .timeLimit(.minutes(10)))
struct ScheduleCancelPairTests: MemberPromiseSettling, SharedTestLoops {
  /// What one round of `scheduleAndCancelPairUpWhenAMoveRacesInvalidationAndTheOldLoopsEnd` saw.
  struct MoveRaceRound: CustomStringConvertible {
    var schedules: [String: Int]
    var cancels: [String: Int]
    var accepted: [Int]
    var delivered: [Int]
    var dropped: Int
    /// Whether the old loop's end had begun when `invalidate()` returned (sampled right after).
    var endHadBegun: Bool
    /// Whether the add to the new loop had returned before `invalidate()` was called.
    var wasOnNewLoop: Bool

    var description: String {
      "schedules \(schedules), cancels \(cancels), accepted \(accepted.count), delivered \(delivered.count), "
        + "dropped \(dropped), end had begun \(endHadBegun), added to the new loop first \(wasOnNewLoop)"
    }
  }

  /// InputSource: "schedule and cancel always come in pairs", cancel "exactly once per
  /// schedule", also when a move to another loop races the invalidation and the old loop's
  /// shutdown (or the drop of its last reference). CommandSource: every command accepted is
  /// delivered exactly once, except those the documented drop counts in `droppedCount`, which
  /// only a source invalidated while on no loop after the loop it was last on terminated makes:
  /// so a drop requires the old loop's end to have begun before the invalidation returned, and
  /// the add to the new loop not to have returned before the invalidation.
  @Test(arguments: [false, true])
  func scheduleAndCancelPairUpWhenAMoveRacesInvalidationAndTheOldLoopsEnd(drop: Bool) async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(40), "move vs invalidate vs end") {
      () -> [MoveRaceRound] in
      var results: [MoveRaceRound] = []
      try repeatRounds(30, budget: .milliseconds(800)) { round in
        let schedules = Guarded<[String: Int]>([:])
        let cancels = Guarded<[String: Int]>([:])
        let delivered = Guarded<[Int]>([])
        let accepted = Guarded<[Int]>([])
        let endHasBegun = Guarded(false)
        let addedToNewLoop = Guarded(false)
        let atInvalidation = Guarded((endHadBegun: false, wasOnNewLoop: false))
        let command = CommandSource<Int>(
          schedule: { _, loop, _ in schedules.withLock { $0[loop.name, default: 0] += 1 } },
          cancel: { _, loop in cancels.withLock { $0[loop.name, default: 0] += 1 } }
        ) { value in delivered.withLock { $0.append(value) } }
        let oldLoop = Guarded<RunLoopThread?>(try RunLoopThread(name: "old"))
        let newLoop = try RunLoopThread(name: "new")
        // The old loop's shared half (no handle: a dropped loop still ends on its own), to tell
        // when it has terminated.
        let oldShared = oldLoop.snapshot!.shared
        oldLoop.snapshot?.add(command.source)
        for value in 0..<20 where command.post(value) { accepted.withLock { $0.append(value) } }
        let mover: @Sendable () -> Void = {
          guard let old = oldLoop.snapshot else { return }
          old.remove(command.source)
          newLoop.add(command.source)
          addedToNewLoop.withLock { $0 = true }
        }
        let invalidator: @Sendable () -> Void = {
          for _ in 0..<(round % 5) { sched_yield() }
          let wasOnNewLoop = addedToNewLoop.snapshot
          command.source.invalidate()
          let endHadBegun = endHasBegun.snapshot
          atInvalidation.withLock { $0 = (endHadBegun, wasOnNewLoop) }
        }
        let ender: @Sendable () -> Void = {
          endHasBegun.withLock { $0 = true }
          if drop { oldLoop.withLock { $0 = nil } } else { oldLoop.snapshot?.shutdown() }
        }
        let poster: @Sendable () -> Void = {
          for value in 100..<150 where command.post(value) { accepted.withLock { $0.append(value) } }
        }
        race([mover, invalidator, ender, poster])
        oldLoop.snapshot?.shutdownAndWait()
        oldLoop.withLock { $0 = nil }
        try Self.settle(newLoop)
        newLoop.shutdownAndWait()
        // A dropped loop drains on its own thread, without anyone waiting for it (it may not even
        // have scheduled the source yet): wait until it has terminated (a queued add it applies
        // late schedules the source and cancels it at once, so pairs read in between differ),
        // then for its deliveries too.
        _ = waitUntil(timeout: .seconds(10), "the old loop to terminate") { oldShared.terminatedGate.isOpened }
        _ = waitUntil(timeout: .seconds(10), "cancels match schedules, every accepted command delivered") {
          cancels.snapshot == schedules.snapshot
            && delivered.snapshot.count + command.droppedCount == accepted.snapshot.count
        }
        let (endHadBegun, wasOnNewLoop) = atInvalidation.snapshot
        results.append(
          MoveRaceRound(
            schedules: schedules.snapshot, cancels: cancels.snapshot, accepted: accepted.snapshot,
            delivered: delivered.snapshot, dropped: command.droppedCount, endHadBegun: endHadBegun,
            wasOnNewLoop: wasOnNewLoop))
      }
      return results
    }
    for result in outcome ?? [] {
      #expect(result.schedules == result.cancels, "\(result)")
      #expect(Set(result.delivered).count == result.delivered.count, "a command delivered twice: \(result)")
      #expect(Set(result.delivered).isSubset(of: result.accepted), "a refused command delivered: \(result)")
      #expect(result.delivered.count + result.dropped == result.accepted.count, "\(result)")
      if result.dropped > 0 {
        #expect(result.endHadBegun, "dropped, although the old loop was running at the invalidation: \(result)")
        #expect(
          !result.wasOnNewLoop, "dropped, although it was added to the new loop before the invalidation: \(result)")
        #expect(result.schedules["new"] == nil, "dropped after joining a live loop: \(result)")
      }
    }
  }

  /// SPEC §3 and `InputSource`'s doc: cancel runs exactly once when the source leaves its loop —
  /// here it leaves loop A (removed from its last mode), joins loop B, and is invalidated; loop B
  /// applies its add and the invalidation before loop A applies the removal.
  @Test func cancelRunsOncePerLoopWhenAMovedSourceIsInvalidated() async throws {
    let loopA = try RunLoopThread(name: "review-move-a")
    let loopB = try RunLoopThread(name: "review-move-b")
    defer {
      loopA.shutdownAndWait()
      loopB.shutdownAndWait()
    }
    let schedules = Guarded<[String]>([])
    let cancels = Guarded<[String]>([])
    let source = InputSource(
      schedule: { _, loop, _ in schedules.withLock { $0.append(loop.name) } },
      cancel: { _, loop in cancels.withLock { $0.append(loop.name) } },
      perform: { _ in })
    loopA.add(source)
    _ = try loopA.performAndWait { 0 }  // scheduled on A
    let result = try await withWatchdogOnThread {
      // Hold loop A inside a block, so that its removal waits in its inbox.
      let release = blockLoop(loopA)
      loopA.remove(source)  // its last mode on A: free to move
      loopB.add(source)
      source.invalidate()
      _ = try loopB.performAndWait { 0 }  // B applied the add and the invalidation
      release.open()
      _ = try loopA.performAndWait { 0 }  // A applied the removal
      return (schedules.snapshot, cancels.snapshot)
    }
    guard let (scheduled, cancelled) = result else { return }
    #expect(scheduled.sorted() == ["review-move-a", "review-move-b"])
    // Every loop that scheduled the source calls cancel once when it leaves.
    #expect(cancelled.sorted() == ["review-move-a", "review-move-b"], "cancels: \(cancelled)")
  }

  /// `InputSource`: schedule and cancel "always come in pairs", once per loop joined. One thread
  /// moves the source (remove from its last mode, then add back here or to the other loop),
  /// others signal and invalidate it at once; the loops run meanwhile.
  @Test func scheduleAndCancelPairWhileMovedSignalledAndInvalidated() async throws {
    let loopA = try RunLoopThread(name: "rrec-pair-a")
    let loopB = try RunLoopThread(name: "rrec-pair-b")
    defer {
      loopA.shutdownAndWait()
      loopB.shutdownAndWait()
    }
    let outcome = try await withWatchdogOnThread(timeout: .seconds(60)) { () -> (unpaired: [String], leaked: Int) in
      let log = PairLog()
      var leaked = 0
      repeatRounds(400) { round in
        weak var weakSource: InputSource?
        do {
          let source = InputSource(
            schedule: { _, loop, _ in log.schedule(loop) }, cancel: { _, loop in log.cancel(loop) },
            perform: { _ in })
          weakSource = source
          let home = round % 2 == 0 ? loopA : loopB
          let other = round % 2 == 0 ? loopB : loopA
          home.add(source, to: .default)
          race([
            {
              home.remove(source, from: .default)
              (round % 3 == 0 ? home : other).add(source, to: .default)
              if round % 5 == 0 {
                (round % 3 == 0 ? home : other).remove(source, from: .default)
                home.add(source, to: RunLoopMode("rrec-m"))
              }
            },
            { source.signal() },
            {
              if round % 4 == 1 { sched_yield() }
              source.invalidate()
            },
          ])
        }
        _ = try? loopA.performAndWait { () }
        _ = try? loopB.performAndWait { () }
        _ = try? loopA.performAndWait { () }
        if weakSource != nil { leaked += 1 }
      }
      return (log.unpaired, leaked)
    }
    #expect(outcome?.unpaired == [])
    #expect(outcome?.leaked == 0)
  }

  /// `add(_: DescriptorSource)`: "From other threads, a failure that only epoll can detect
  /// invalidates the source and reports `[.error]` to its handler on the loop thread." Here the
  /// add to A (which epoll refuses: A watches the descriptor through another source already) is
  /// still queued when the caller removes the source again and adds it to B, where epoll accepts
  /// it. When A applies the stale add, it invalidates the source — now valid and watching on B —
  /// without reporting `[.error]` to its handler (the report is made on A, where the source is no
  /// longer bound, so the handler is skipped).
  @Test
  func failedAddOnOldLoopDoesNotSilentlyInvalidateMovedSource() async throws {
    let loopA = try RunLoopThread(name: "rrec-fd-a")
    let loopB = try RunLoopThread(name: "rrec-fd-b")
    defer {
      loopA.shutdownAndWait()
      loopB.shutdownAndWait()
    }
    let pipe = makePipe()
    defer {
      close(pipe.read)
      close(pipe.write)
    }
    let holder = DescriptorSource(descriptor: pipe.read) { _, _ in }
    try loopA.add(holder)  // A's epoll watches the descriptor now
    let errors = AtomicCounter()
    let source = DescriptorSource(descriptor: pipe.read) { _, events in
      if events.contains(.error) { errors.increment() }
    }
    let outcome = try await withWatchdogOnThread { () -> (valid: Bool, errors: Int)? in
      let release = blockLoop(loopA)
      guard (try? loopA.add(source)) != nil else { return nil }  // queued: epoll refuses it later
      loopA.remove(source)
      guard (try? loopB.add(source)) != nil else { return nil }
      release.open()
      _ = try? loopA.performAndWait { () }
      _ = try? loopB.performAndWait { () }
      return (source.isValid, errors.current)
    }
    holder.invalidate()
    source.invalidate()
    let result = try #require(outcome ?? nil)
    #expect(result.valid || result.errors == 1, "invalidated with no [.error] report: \(result)")
  }

  /// Promise (CommandSource, InputSource): a source removed from its last mode may be added to
  /// any loop at once, from any thread; cancel runs exactly once per schedule, per loop; the
  /// commands are delivered exactly once and in posting order per producer while a mover thread
  /// shuttles the source between two loops' `.common` modes.
  @Test func shuttlingBetweenTwoLoopsKeepsSchedulesPairedAndCommandsExact() async throws {
    let result = try await withWatchdogOnThread(timeout: .seconds(40), "shuttle between loops") {
      () throws -> (problems: [String], unpaired: [String], schedules: Int) in
      let loopA = try RunLoopThread(name: "A")
      let loopB = try RunLoopThread(name: "B")
      let pairs = PairLog()
      let ledger = CommandDeliveryLedger()
      let commands = CommandSource<Int>(
        schedule: { _, loop, _ in pairs.schedule(loop) }, cancel: { _, loop in pairs.cancel(loop) }
      ) { ledger.deliver($0) }
      loopA.add(commands.source, to: .common)
      let mover: @Sendable () -> Void = {
        for step in 0..<300 {
          let (from, to) = step % 2 == 0 ? (loopA, loopB) : (loopB, loopA)
          from.remove(commands.source, from: .common)
          to.add(commands.source, to: .common)
        }
      }
      let producers: [@Sendable () -> Void] = (0..<2).map { producer in
        { postAll(commands, ledger, producer: producer, count: 300) }
      }
      race([mover] + producers)
      commands.source.invalidate()
      _ = try loopA.performAndWait {}
      _ = try loopB.performAndWait {}
      loopA.shutdownAndWait()
      loopB.shutdownAndWait()
      let schedules = pairs.counts.snapshot.values.reduce(0) { $0 + $1.schedule }
      return (ledger.problems(unaccounted: commands.pendingCount + commands.droppedCount), pairs.unpaired, schedules)
    }
    guard let result else { return }
    #expect(result.problems == [])
    #expect(result.unpaired == [])
    #expect(result.schedules >= 1)
  }

  /// Promise (InputSource): cancel exactly once per schedule, also when the invalidation races
  /// removals from each of the source's modes (`.common`, two named ones) and a re-add; an
  /// invalidated source is never performed after the loop applied the invalidation.
  @Test func removalsFromEveryModeRacingInvalidateCancelOncePerSchedule() async throws {
    let failures = try await failuresOverRounds(300, budget: .seconds(3), "remove vs invalidate") { round, failures in
      let loop = Self.sharedLoop
      let (modeA, modeB) = (RunLoopMode("ra"), RunLoopMode("rb"))
      let schedules = AtomicCounter()
      let cancels = AtomicCounter()
      let source = InputSource(
        schedule: { _, _, _ in schedules.increment() }, cancel: { _, _ in cancels.increment() }
      ) { _ in }
      loop.add(source, to: .common)
      loop.add(source, to: modeA)
      loop.add(source, to: modeB)
      race([
        { loop.remove(source, from: modeA) },
        { loop.remove(source, from: .common) },
        {
          loop.remove(source, from: modeB)
          loop.add(source, to: modeB)
        },
        { source.invalidate() },
        { source.signal() },
      ])
      _ = try? loop.performAndWait {}
      if schedules.current != cancels.current || cancels.current < 1 {
        failures.append("round \(round): schedules \(schedules.current), cancels \(cancels.current)")
      }
    }
    #expect(failures == [])
  }

  /// Promise (CommandSource): a handler that moves the source to another loop keeps the order:
  /// the first loop finishes its batch, the new loop delivers later commands after it; each
  /// command exactly once; an invalidation from another thread at any moment still delivers every
  /// accepted command before `cancel`, and cancel pairs with schedule per loop.
  @Test func handlersMovingTheirSourceBetweenLoopsWhileInvalidated() async throws {
    let failures = try await failuresOverRounds(80, budget: .seconds(4), "handler moves") { round, failures in
      let loopA = Self.sharedLoop
      let loopB = Self.secondLoop
      let ledger = CommandDeliveryLedger()
      let pairs = PairLog()
      let holder = Guarded<InputSource?>(nil)
      let commands = CommandSource<Int>(
        schedule: { _, loop, _ in pairs.schedule(loop) }, cancel: { _, loop in pairs.cancel(loop) }
      ) { command in
        ledger.deliver(command)
        guard command % 7 == 0, let source = holder.snapshot else { return }
        let here = RunLoopThread.current
        let there = here === loopA ? loopB : loopA
        here.remove(source, from: .common)
        there.add(source, to: .common)
      }
      holder.withLock { $0 = commands.source }
      loopA.add(commands.source, to: .common)
      let producers: [@Sendable () -> Void] = (0..<2).map { producer in
        { postAll(commands, ledger, producer: producer, count: 120) }
      }
      race(
        producers + [
          {
            for _ in 0..<(round % 50) { sched_yield() }; commands.source.invalidate()
          }
        ])
      _ = waitUntil(timeout: .seconds(10), "every cancel") {
        let counts = pairs.counts.snapshot.values
        return counts.reduce(0) { $0 + $1.schedule } == counts.reduce(0) { $0 + $1.cancel }
      }
      _ = try? loopA.performAndWait {}
      _ = try? loopB.performAndWait {}
      for problem in ledger.problems(unaccounted: commands.pendingCount + commands.droppedCount) {
        failures.append("round \(round): \(problem)")
      }
      if !pairs.unpaired.isEmpty { failures.append("round \(round): \(pairs.unpaired)") }
      holder.withLock { $0 = nil }
    }
    #expect(failures == [])
  }

  /// Promise (InputSource): cancel exactly once per schedule, per loop, also when the schedule
  /// routine removes or invalidates its own source, and the cancel routine moves the (still
  /// valid) source to another loop, while another thread removes and re-adds it.
  @Test func routinesThatMoveRemoveOrInvalidateTheirOwnSource() async throws {
    let failures = try await failuresOverRounds(200, budget: .seconds(3), "self-changing routines") {
      round, failures in
      let loopA = Self.sharedLoop
      let loopB = Self.secondLoop
      let pairs = PairLog()
      let holder = Guarded<InputSource?>(nil)
      let moved = Guarded(false)
      let source = InputSource(
        schedule: { source, loop, _ in
          pairs.schedule(loop)
          switch round % 3 {
          case 0: loop.remove(source, from: .common)
          case 1: if loop === loopB { source.invalidate() }
          default: break
          }
        },
        cancel: { source, loop in
          pairs.cancel(loop)
          let first = moved.withLock { value in
            defer { value = true }
            return !value
          }
          if first, source.isValid, loop === loopA { loopB.add(source, to: .common) }
        }
      ) { _ in }
      holder.withLock { $0 = source }
      loopA.add(source, to: .common)
      race([
        {
          loopA.remove(source, from: .common)
          source.signal()
        },
        { loopA.wakeUp() },
      ])
      _ = try? loopA.performAndWait {}
      _ = try? loopB.performAndWait {}
      source.invalidate()
      waitUntil(timeout: .seconds(10), "every cancel") { pairs.unpaired.isEmpty }
      _ = try? loopA.performAndWait {}
      _ = try? loopB.performAndWait {}
      if !pairs.unpaired.isEmpty { failures.append("round \(round): \(pairs.unpaired)") }
      holder.withLock { $0 = nil }
    }
    #expect(failures == [])
  }

  /// A source moved around three loops from racing threads while one loop shuts down: every
  /// loop that scheduled it cancels it exactly once, and the routines are released.
  @Test
  func movesBetweenThreeLoopsWithShutdownPairAndRelease() async throws {
    let result = try await withWatchdogOnThread { () -> (unpaired: [String], leaked: Int, rounds: Int) in
      let pairs = PairLog()
      var leaked = 0
      let rounds = repeatRounds(60, budget: .milliseconds(600)) { round in
        let loops = (0..<3).compactMap { try? RunLoopThread(name: "move-\($0)") }
        var weakRefs: [() -> Bool] = []
        do {
          let capture = Capture()
          weak let weakCapture = capture
          weakRefs.append { weakCapture == nil }
          let source = InputSource(
            schedule: { _, loop, _ in
              withExtendedLifetime(capture) {}
              pairs.schedule(loop)
            }, cancel: { _, loop in pairs.cancel(loop) }, perform: { _ in })
          race([
            {
              for step in 0..<30 {
                let loop = loops[step % 3]
                loop.add(source, to: step % 2 == 0 ? .common : .default)
                loop.remove(source, from: step % 2 == 0 ? .common : .default)
              }
              loops[round % 3].add(source, to: .default)
            },
            { loops[(round + 1) % 3].shutdown() },
            { for _ in 0..<10 { source.signal() } },
          ])
          source.invalidate()
        }
        for loop in loops { loop.shutdownAndWait() }
        leaked += weakRefs.filter { !$0() }.count
      }
      return (pairs.unpaired, leaked, rounds)
    }
    #expect(result?.unpaired.isEmpty == true, "\(result?.unpaired ?? [])")
    #expect(result?.leaked == 0, "routines never released")
  }
}
