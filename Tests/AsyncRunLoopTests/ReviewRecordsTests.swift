import Glibc
import Testing

@testable import AsyncRunLoop

/// Review of "member records travel with the changes" (d548760) and the 4-ary timer heap
/// (54de07b): races between removal, re-add, moves, invalidation, signals and shutdown, with exact
/// counts. The review found three bugs (a set-aside timer entry put back after its membership was
/// replaced, or read after its record was freed; a stale failed descriptor add); each test here
/// failed before its fix.
@Suite("ReviewRecords")
struct ReviewRecordsTests {

  // MARK: Timers: the pass's set-aside entries

  /// SPEC §4: a timer "fires only while its loop runs in one of the timer's modes". A timer whose
  /// entry in mode X is an extra entry (its first mode is Y) is scheduled by a callout of the pass
  /// (so step 9 sets its entry aside), then removed from X and added back by a later callout of
  /// the same pass. The pass puts the old, set-aside entry back into X's heap next to the new one:
  /// an orphan entry that no membership owns. Removing the timer from X afterwards leaves the
  /// orphan in X's heap, and the next pass in X fires the timer although it is not in X.
  @Test
  func setAsideEntryOfReplacedMembershipIsNotPutBack() async throws {
    let loop = try RunLoopThread(name: "rrec-aside")
    defer { loop.shutdownAndWait() }
    let modeX = RunLoopMode("rrec-x")
    let modeY = RunLoopMode("rrec-y")
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (inX: [RunLoopMode], fires: Int) in
        let fires = AtomicCounter()
        let made = Guarded<LoopTimer?>(nil)
        let start = LoopClock.Instant.now
        let first = LoopTimer(fireAt: start.advanced(by: .milliseconds(-30))) { _ in
          let timer = LoopTimer(fireAt: start.advanced(by: .milliseconds(-20)), repeatingEvery: .seconds(3600)) { _ in
            fires.increment()
          }
          loop.add(timer, to: modeY)  // its record is its entry in Y
          loop.add(timer, to: modeX)  // an extra entry in X, scheduled by this pass: set aside
          made.withLock { $0 = timer }
        }
        let second = LoopTimer(fireAt: start.advanced(by: .milliseconds(-10))) { _ in
          guard let timer = made.snapshot else { return }
          loop.remove(timer, from: modeX)  // still in Y: the binding stays bound
          loop.add(timer, to: modeX)  // a new extra entry in X
        }
        let keeper = InputSource(perform: { _ in })  // mode X is never empty (SPEC §1: no pass)
        loop.add(keeper, to: modeX)
        defer { keeper.invalidate() }
        loop.add(first, to: modeX)
        loop.add(second, to: modeX)
        loop.run(mode: modeX, until: .now)  // one pass
        guard let timer = made.snapshot else { return ([], -1) }
        loop.remove(timer, from: modeX)  // the timer is in Y only now
        let modes = loop.core.modes(of: timer)
        let before = fires.current
        loop.run(mode: modeX, until: .now)  // one more pass in X
        loop.run(mode: modeX, until: .now)
        let inX = fires.current - before
        timer.invalidate()
        return (modes, inX)
      }
    }
    #expect(result?.inX == [modeY])
    #expect(result?.fires == 0, "the timer fired in a mode it is not in (an orphan entry stayed in the heap)")
  }

  /// The same set-aside path with the timer invalidated by a later callout of the pass: its
  /// record is freed (its binding and the registry let go), and the set-aside extra entry's
  /// `unowned(unsafe)` record is read afterwards (`entry.element.record.isIn(contents)`):
  /// a use after free (AddressSanitizer: heap-use-after-free).
  @Test
  func setAsideEntryOfInvalidatedTimerIsNotReadAfterFree() async throws {
    let loop = try RunLoopThread(name: "rrec-aside-uaf")
    defer { loop.shutdownAndWait() }
    let modeX = RunLoopMode("rrec-x")
    let modeY = RunLoopMode("rrec-y")
    let fires = try await withWatchdogOnThread {
      try loop.performAndWait { () -> Int in
        let fires = AtomicCounter()
        let made = Guarded<LoopTimer?>(nil)
        let start = LoopClock.Instant.now
        let first = LoopTimer(fireAt: start.advanced(by: .milliseconds(-30))) { _ in
          let timer = LoopTimer(fireAt: start.advanced(by: .milliseconds(-20))) { _ in fires.increment() }
          loop.add(timer, to: modeY)
          loop.add(timer, to: modeX)
          made.withLock { $0 = timer }
        }
        let second = LoopTimer(fireAt: start.advanced(by: .milliseconds(-10))) { _ in
          made.snapshot?.invalidate()
        }
        let keeper = InputSource(perform: { _ in })  // mode X is never empty (SPEC §1: no pass)
        loop.add(keeper, to: modeX)
        defer { keeper.invalidate() }
        loop.add(first, to: modeX)
        loop.add(second, to: modeX)
        for _ in 0..<3 { loop.run(mode: modeX, until: .now) }
        return fires.current
      }
    }
    #expect(fires == 0)
  }

  // MARK: InputSource: schedule and cancel pair per loop

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

  // MARK: CommandSource: every accepted command exactly once

  /// `CommandSource`: "every command that post accepted (returned true for) is delivered exactly
  /// once". Posters race a mover (remove from the last mode, add here or to the other loop) and an
  /// invalidation.
  @Test func commandSourceDeliversEveryAcceptedCommandOnceWhileMoved() async throws {
    let loopA = try RunLoopThread(name: "rrec-cmd-a")
    let loopB = try RunLoopThread(name: "rrec-cmd-b")
    defer {
      loopA.shutdownAndWait()
      loopB.shutdownAndWait()
    }
    let outcome = try await withWatchdogOnThread(timeout: .seconds(60)) { () -> [String] in
      var problems: [String] = []
      repeatRounds(300) { round in
        let delivered = Guarded<[Int: Int]>([:])
        let accepted = Guarded<Set<Int>>([])
        let cancelled = TestGate()
        let commands = CommandSource<Int>(
          cancel: { _, _ in cancelled.open() }, handler: { value in delivered.withLock { $0[value, default: 0] += 1 } })
        let home = round % 2 == 0 ? loopA : loopB
        let other = round % 2 == 0 ? loopB : loopA
        home.add(commands.source, to: .default)
        let poster: @Sendable (Int) -> Void = { base in
          for index in 0..<20 where commands.post(base + index) {
            accepted.withLock { _ = $0.insert(base + index) }
          }
        }
        race([
          { poster(0) },
          { poster(1000) },
          {
            home.remove(commands.source, from: .default)
            other.add(commands.source, to: .default)
            if round % 3 == 0 {
              other.remove(commands.source, from: .default)
              home.add(commands.source, to: .default)
            }
          },
          {
            sched_yield()
            commands.source.invalidate()
          },
        ])
        _ = cancelled.wait(timeout: .seconds(10))
        _ = try? loopA.performAndWait { () }
        _ = try? loopB.performAndWait { () }
        let got = delivered.snapshot
        let want = accepted.snapshot
        let twice = got.filter { $0.value != 1 }.keys.sorted()
        let missing = want.subtracting(got.keys).sorted()
        let extra = Set(got.keys).subtracting(want).sorted()
        if !twice.isEmpty || !missing.isEmpty || !extra.isEmpty {
          problems.append("round \(round): missing \(missing), twice \(twice), unaccepted \(extra)")
        }
      }
      return problems
    }
    #expect(outcome == [])
  }

  // MARK: `.common` members that leave their last mode while bound

  /// A source added to `.common`, then removed from `.default` (its record leaves its last mode,
  /// its binding stays bound), then added to another mode, signalled, invalidated: schedule and
  /// cancel pair, a signal made while in no mode fires once it is in a running mode, and the
  /// source and its routines are freed once dropped. A mode joining the common set afterwards
  /// gets nothing of it.
  @Test func commonMemberRemovedFromDefaultThenReadded() async throws {
    let other = RunLoopMode("rrec-common-m")
    let outcome = try await withWatchdogOnThread { () -> [String] in
      var problems: [String] = []
      repeatRounds(100) { round in
        // A loop per round: a mode added to the common set stays there (and a `.common` member
        // added later joins it, so removing it from `.default` would not empty it).
        guard let loop = try? RunLoopThread(name: "rrec-common") else { return }
        defer { loop.shutdownAndWait() }
        let log = PairLog()
        let performs = AtomicCounter()
        weak var weakSource: InputSource?
        weak var weakTimer: LoopTimer?
        do {
          let source = InputSource(
            schedule: { _, loop, _ in log.schedule(loop) }, cancel: { _, loop in log.cancel(loop) },
            perform: { _ in performs.increment() })
          let timer = LoopTimer(after: .seconds(3600), repeatingEvery: .seconds(3600)) { _ in }
          weakSource = source
          weakTimer = timer
          loop.add(source, to: .common)
          loop.add(timer, to: .common)
          if round % 2 == 0 { _ = try? loop.performAndWait { () } }
          loop.remove(source, from: .default)  // its last mode: the record is detached
          loop.remove(timer, from: .default)
          source.signal()  // kept on the source: it is in no mode
          loop.add(source, to: .default)  // the same record attaches again (the binding is bound)
          loop.add(timer, to: other)
          let fired = waitUntil(timeout: .seconds(5), "perform") { performs.current == 1 }
          if !fired { problems.append("round \(round): the signal made in no mode never fired") }
          let modes = (try? loop.performAndWait { loop.core.modes(of: timer) }) ?? []
          if modes != [other] { problems.append("round \(round): timer modes \(modes)") }
          source.invalidate()
          if round % 2 == 1 { timer.invalidate() }
        }
        loop.addModeToCommonModes(RunLoopMode("rrec-common-late-\(round)"))
        _ = try? loop.performAndWait { () }
        if !log.unpaired.isEmpty { problems.append("round \(round): \(log.unpaired)") }
        if weakSource != nil { problems.append("round \(round): the source leaked") }
        if round % 2 == 1 && weakTimer != nil { problems.append("round \(round): the timer leaked") }
        if performs.current != 1 { problems.append("round \(round): \(performs.current) performs") }
      }
      return problems
    }
    #expect(outcome == [])
  }

  // MARK: Signals racing removal and re-add

  /// "Signals that arrive before the source is added to a loop are kept and fire once it is",
  /// and a valid, signalled source in a running mode fires. A signal made while the removal from
  /// the last mode is queued (and the re-add behind it) is carried by the old record: the loop
  /// skips it, and the new record must pick it up. The loop is held while the changes queue.
  @Test func signalMadeWhileRemovalIsQueuedFiresAfterReadd() async throws {
    let loopA = try RunLoopThread(name: "rrec-sig-a")
    let loopB = try RunLoopThread(name: "rrec-sig-b")
    defer {
      loopA.shutdownAndWait()
      loopB.shutdownAndWait()
    }
    let outcome = try await withWatchdogOnThread(timeout: .seconds(60)) { () -> [String] in
      var problems: [String] = []
      repeatRounds(300) { round in
        let performs = Guarded<[String]>([])
        let source = InputSource(perform: { _ in
          performs.withLock { $0.append(RunLoopThread.currentIfExists?.name ?? "?") }
        })
        loopA.add(source, to: .default)
        _ = try? loopA.performAndWait { () }
        let release = round % 2 == 0 ? blockLoop(loopA) : nil
        let target = round % 3 == 0 ? loopB : loopA
        race([
          {
            loopA.remove(source, from: .default)
            target.add(source, to: .default)
          },
          { source.signal() },
        ])
        release?.open()
        let fired = waitUntil(timeout: .seconds(5), "perform") { performs.snapshot.count >= 1 }
        _ = try? loopA.performAndWait { () }
        _ = try? loopB.performAndWait { () }
        let got = performs.snapshot
        if !fired || got.count != 1 { problems.append("round \(round): performs \(got)") }
        source.invalidate()
      }
      return problems
    }
    #expect(outcome == [])
  }

  /// A source removed from its last mode by a change applied before a later signal must not
  /// fire: the loop applied the removal, so the old record it carried is skipped, and the
  /// binding (unbound) keeps the signal for the next add.
  @Test func signalAfterAppliedRemovalDoesNotFire() async throws {
    let loop = try RunLoopThread(name: "rrec-sig-removed")
    defer { loop.shutdownAndWait() }
    let outcome = try await withWatchdogOnThread { () -> [String] in
      var problems: [String] = []
      repeatRounds(300) { round in
        let performs = AtomicCounter()
        let source = InputSource(perform: { _ in performs.increment() })
        loop.add(source, to: .default)
        loop.remove(source, from: .default)
        _ = try? loop.performAndWait { () }  // the removal is applied
        source.signal()
        _ = try? loop.performAndWait { () }
        _ = try? loop.performAndWait { () }
        if performs.current != 0 { problems.append("round \(round): fired \(performs.current) after removal") }
        loop.add(source, to: RunLoopMode("rrec-other"))  // kept for the next add: fires once it runs there
        let fired =
          (try? loop.performAndWait { () -> Int in
            loop.run(mode: RunLoopMode("rrec-other"), until: .now)
            return performs.current
          }) ?? -1
        if fired != 1 { problems.append("round \(round): \(fired) performs after the re-add") }
        source.invalidate()
      }
      return problems
    }
    #expect(outcome == [])
  }

  // MARK: Timers in several modes

  /// A repeating timer in `.default` and two other modes; other threads remove it from and add it
  /// back to the other modes and move its fire date to the past: the timer (in `.default` all
  /// along, which the loop runs) fires, and the loop never traps on a stale heap entry. After the
  /// churn, one one-shot fire date fires exactly once.
  @Test func multiModeTimerChurnKeepsHeapsConsistent() async throws {
    let loop = try RunLoopThread(name: "rrec-timer-churn")
    defer { loop.shutdownAndWait() }
    let modeX = RunLoopMode("rrec-tx")
    let modeY = RunLoopMode("rrec-ty")
    let outcome = try await withWatchdogOnThread(timeout: .seconds(60)) { () -> [String] in
      var problems: [String] = []
      repeatRounds(200) { round in
        let fires = AtomicCounter()
        let timer = LoopTimer(after: .seconds(3600)) { _ in fires.increment() }
        let first = round % 2 == 0 ? modeX : .default
        loop.add(timer, to: first)  // the record's own entry in `first`
        loop.add(timer, to: .default)
        loop.add(timer, to: modeY)
        race([
          {
            for _ in 0..<5 {
              loop.remove(timer, from: modeX)
              loop.add(timer, to: modeX)
            }
          },
          {
            for _ in 0..<5 {
              loop.remove(timer, from: modeY)
              loop.add(timer, to: modeY)
            }
          },
          { for _ in 0..<5 { timer.setFireDate(.now.advanced(by: .seconds(3600))) } },
        ])
        timer.setFireDate(.now.advanced(by: .milliseconds(-1)))
        let fired = waitUntil(timeout: .seconds(5), "the one-shot fire") { fires.current >= 1 }
        // One pass in each of the other modes: the one-shot timer is invalid now.
        _ = try? loop.performAndWait { () in
          loop.run(mode: modeX, until: .now)
          loop.run(mode: modeY, until: .now)
        }
        if !fired || fires.current != 1 { problems.append("round \(round): \(fires.current) fires") }
        if timer.isValid { problems.append("round \(round): a one-shot timer is still valid after firing") }
        timer.invalidate()
      }
      return problems
    }
    #expect(outcome == [])
  }

  // MARK: Readiness sources

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

  /// A readiness source whose add epoll refuses on the loop thread throws there, and stays valid
  /// (a thrown error means the add did not happen); one refused from another thread reports
  /// `[.error]` once and is invalid. Its records hold nothing afterwards (the source and its
  /// handler are freed).
  @Test func refusedDescriptorAddsReportOnceAndLeakNothing() async throws {
    let loop = try RunLoopThread(name: "rrec-fd-refused")
    defer { loop.shutdownAndWait() }
    let pipe = makePipe()
    defer {
      close(pipe.read)
      close(pipe.write)
    }
    let holder = DescriptorSource(descriptor: pipe.read) { _, _ in }
    try loop.add(holder)
    final class Sentinel: Sendable {}
    let outcome = try await withWatchdogOnThread { () -> [String] in
      var problems: [String] = []
      repeatRounds(200) { round in
        let errors = AtomicCounter()
        weak var weakSource: DescriptorSource?
        weak var weakSentinel: Sentinel?
        do {
          let sentinel = Sentinel()
          weakSentinel = sentinel
          let source = DescriptorSource(descriptor: pipe.read) { _, events in
            withExtendedLifetime(sentinel) {}
            if events.contains(.error) { errors.increment() }
          }
          weakSource = source
          if round % 2 == 0 {
            let threw =
              (try? loop.performAndWait { () -> Bool in
                do {
                  try loop.add(source, to: .default)
                  return false
                } catch { return true }
              }) ?? false
            if !threw { problems.append("round \(round): the loop-thread add did not throw") }
            if errors.current != 0 { problems.append("round \(round): a throwing add also reported") }
            if !source.isValid { problems.append("round \(round): a throwing add invalidated the source") }
          } else {
            try? loop.add(source, to: .default)
            try? loop.add(source, to: RunLoopMode("rrec-fd-m"))  // a second add with the same record
            _ = try? loop.performAndWait { () }
            if errors.current != 1 { problems.append("round \(round): \(errors.current) error reports") }
            if source.isValid { problems.append("round \(round): still valid") }
          }
        }
        _ = try? loop.performAndWait { () }
        if weakSource != nil || weakSentinel != nil { problems.append("round \(round): leaked") }
      }
      return problems
    }
    holder.invalidate()
    #expect(outcome == [])
  }

  // MARK: Shutdown

  /// Shutdown (`shutdown()`, `shutdownAndWait()`, or dropping the last handle) racing posts,
  /// a move (remove from the last mode, add back) and an invalidation: schedule and cancel pair,
  /// every accepted command is delivered at most once and the undelivered ones are still counted
  /// by `pendingCount`, or by `droppedCount` once the source is invalidated (the documented drop:
  /// the loop it was last on terminated), and the source,
  /// its routines and what they capture are freed.
  @Test func shutdownRacingMovesPostsAndInvalidation() async throws {
    final class Sentinel: Sendable {}
    let outcome = try await withWatchdogOnThread(timeout: .seconds(60)) { () -> [String] in
      var problems: [String] = []
      repeatRounds(150) { round in
        let log = PairLog()
        let delivered = Guarded<[Int: Int]>([:])
        let accepted = AtomicCounter()
        weak var weakSentinel: Sentinel?
        weak var weakSource: InputSource?
        var pendingAtEnd = 0
        do {
          guard let loop = try? RunLoopThread(name: "rrec-shut") else { return }
          let sentinel = Sentinel()
          weakSentinel = sentinel
          let commands = CommandSource<Int>(
            schedule: { _, loop, _ in log.schedule(loop) },
            cancel: { _, loop in log.cancel(loop) },
            handler: { value in
              withExtendedLifetime(sentinel) {}
              delivered.withLock { $0[value, default: 0] += 1 }
            })
          weakSource = commands.source
          loop.add(commands.source, to: .common)
          let timer = LoopTimer(after: .zero, repeatingEvery: .milliseconds(1)) { _ in withExtendedLifetime(sentinel) {}
          }
          loop.add(timer, to: .default)
          race([
            { for index in 0..<30 where commands.post(index) { accepted.increment() } },
            {
              loop.remove(commands.source, from: .common)
              loop.add(commands.source, to: .default)
              loop.remove(timer, from: .default)
              loop.add(timer, to: RunLoopMode("rrec-shut-m"))
            },
            {
              switch round % 3 {
              case 0: loop.shutdown()
              case 1: loop.shutdownAndWait()
              default: break  // the handle is dropped below
              }
            },
            { if round % 4 == 0 { commands.source.invalidate() } },
          ])
          if round % 3 == 1 { loop.shutdownAndWait() }
          if round % 3 == 0 { loop.shutdownAndWait() }
          // A terminated loop's members are final now; a dropped handle's loop delivers the rest.
          if round % 3 != 2 { pendingAtEnd = commands.pendingCount + commands.droppedCount }
        }
        // The dropped handle's loop drains on its own thread: wait for the sentinel to go.
        _ = waitUntil(timeout: .seconds(5), "the members are freed") { weakSentinel == nil && weakSource == nil }
        let got = delivered.snapshot
        if !log.unpaired.isEmpty { problems.append("round \(round): \(log.unpaired)") }
        if got.values.contains(where: { $0 != 1 }) { problems.append("round \(round): a command delivered twice") }
        if got.count + pendingAtEnd != accepted.current {
          problems.append(
            "round \(round): accepted \(accepted.current), delivered \(got.count), pending \(pendingAtEnd)")
        }
        if weakSentinel != nil || weakSource != nil { problems.append("round \(round): leaked") }
      }
      return problems
    }
    #expect(outcome == [])
  }
}
