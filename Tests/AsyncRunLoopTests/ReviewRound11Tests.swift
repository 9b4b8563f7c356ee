import Glibc
import Testing

@testable import AsyncRunLoop

// Review round 11: the chunked inbox (blocks and changes in chunks of 1,024, blocks adopted after
// the lock is released, the change barrier and bounded passes), timers deferred as busy, exact
// delivery counts of command sources, and what members leave behind. Blocking work runs on threads
// of the tests' own; results are checked after the watchdog returns.

private let modeA: RunLoopMode = "r11-a"
private let modeB: RunLoopMode = "r11-b"

/// An object to watch with a weak reference (captured by a member's closure).
private final class R11Token: Sendable {}

@Suite("ReviewRound11: timers deferred as busy", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound11TimerTests {
  /// A repeating timer (one hour) due now fires on loop A; its callout moves it to loop B (both
  /// loops on one CPU, so waking B lets B run at once). Its grid point fired once: promised, it
  /// moves to the next point of its grid, an hour later, and does not fire again for this one.
  /// Between the callout's return (which clears "a callout is running" and re-times B's deferred
  /// entry) and `afterFire` (which advances the date) B can find the old date still due.
  @Test
  func aRepeatingTimerMovedToAnotherLoopInItsCalloutFiresOnceForItsDate() async throws {
    let doubled = try await Self.moveInCallout(repeating: true)
    #expect(doubled == [], "the timer fired again for the date it had just fired for")
  }

  /// The same with a one-shot timer: "a one-shot timer is done" after its fire (invalidated), yet
  /// B runs its handler a second time.
  @Test
  func aOneShotTimerMovedToAnotherLoopInItsCalloutFiresOnce() async throws {
    let doubled = try await Self.moveInCallout(repeating: false)
    #expect(doubled == [], "the one-shot timer fired twice")
  }

  /// A one-shot timer whose callout removes it from its only mode and adds it to the same loop
  /// again (a new record there): after its fire it is invalidated and that new record is detached
  /// too (nothing of it stays in a mode, it never fires again, its handler is released).
  @Test func aOneShotTimerReAddedToItsLoopInItsCalloutIsDoneAfterItsFire() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "one-shot re-added") {
      () -> (fires: Int, valid: Bool, modes: Int, released: Bool) in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      let fires = AtomicCounter()
      weak var weakToken: R11Token?
      let timer: LoopTimer
      do {
        let token = R11Token()
        weakToken = token
        timer = LoopTimer(fireAt: .now) { timer in
          withExtendedLifetime(token) {}
          fires.increment()
          RunLoopThread.current.remove(timer, from: modeA)  // its only mode: unbound
          RunLoopThread.current.add(timer, to: modeA)  // a new record on the same loop
        }
      }
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: modeA)
      loop.add(timer, to: modeA)
      _ = loop.run(mode: modeA, until: .now.advanced(by: .milliseconds(50)))
      // Records still on the loop besides `keep` (the binding of an invalidated timer names none).
      let outcome = (fires.current, timer.isValid, loop.core.modeTable.allRecords.count - 1, weakToken == nil)
      keep.invalidate()
      return outcome
    }
    #expect(outcome?.fires == 1)
    #expect(outcome?.valid == false)
    #expect(outcome?.modes == 0, "the new record stayed in the mode")
    #expect(outcome?.released == true)
  }

  /// Rounds of: a timer due now fires on A, its callout moves it to B (and, every other round,
  /// lets B make passes first, so B defers it as busy). Returns the rounds where it fired more
  /// than once.
  private static func moveInCallout(repeating: Bool) async throws -> [String]? {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "moved timer, one date") {
      () throws -> (rounds: Int, doubled: [String]) in
      var doubled: [String] = []
      let rounds = try repeatRounds(30, budget: .milliseconds(1500)) { round in
        let loopA = try RunLoopThread(name: "r11-move-a", cpu: 0)
        let loopB = try RunLoopThread(name: "r11-move-b", cpu: 0)
        defer {
          loopA.shutdownAndWait()
          loopB.shutdownAndWait()
        }
        let fires = Locked<[String]>([])
        let calloutDone = TestGate()
        let timer = LoopTimer(fireAt: .now, repeatingEvery: repeating ? .seconds(3600) : nil) { timer in
          let count = fires.withLock {
            $0.append(RunLoopThread.current.name)
            return $0.count
          }
          guard count == 1 else { return }
          loopA.remove(timer)  // its only mode here: unbound
          loopB.add(timer)  // due there at once: B finds its callout running (busy)
          if round % 2 == 0 {
            for _ in 0..<2 { _ = try? loopB.performAndWait {} }  // B made passes meanwhile
          }
          calloutDone.open()
        }
        loopA.add(timer)
        _ = calloutDone.wait(timeout: .seconds(10))
        for _ in 0..<3 {  // both loops settle: several passes each
          _ = try? loopA.performAndWait {}
          _ = try? loopB.performAndWait {}
          usleep(1_000)
        }
        let fired = fires.withLock { $0 }
        if fired.count != 1 { doubled.append("round \(round): fired on \(fired)") }
        timer.invalidate()
      }
      return (rounds, doubled)
    }
    print("moved timer (repeating: \(repeating)): \(outcome?.rounds ?? 0) rounds, \(outcome?.doubled ?? [])")
    return outcome?.doubled
  }
}

extension ReviewRound11TimerTests {
  /// The callout moves the timer to B (where it is due: B defers it as busy) and then waits while
  /// a third thread calls `invalidateAndWait()`. That call returns only after the callout
  /// returned, and from then on no callout runs anywhere: not on A, not on B's deferred entry.
  @Test func invalidateAndWaitFromAThirdThreadWhileTheCalloutRunsEndsEveryFire() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "invalidateAndWait, moved") {
      () throws -> (rounds: Int, wrong: [String]) in
      var wrong: [String] = []
      let rounds = try repeatRounds(20, budget: .milliseconds(800)) { round in
        let loopA = try RunLoopThread(name: "r11-iaw-a")
        let loopB = try RunLoopThread(name: "r11-iaw-b")
        defer {
          loopA.shutdownAndWait()
          loopB.shutdownAndWait()
        }
        let fires = AtomicCounter()
        let inCallout = Locked(false)
        let moved = TestGate()
        let timer = LoopTimer(fireAt: .now, repeatingEvery: .milliseconds(1)) { timer in
          inCallout.withLock { $0 = true }
          defer { inCallout.withLock { $0 = false } }
          guard fires.increment() == 1 else { return }
          loopA.remove(timer)
          loopB.add(timer)
          timer.setFireDate(.now)
          _ = try? loopB.performAndWait {}
          moved.open()
          // invalidateAndWait invalidates and starts waiting in one critical section.
          let deadline = ContinuousClock.now.advanced(by: .seconds(10))
          while timer.isValid && ContinuousClock.now < deadline { usleep(200) }
          usleep(2_000)  // still inside when the waiter is released would be the bug
        }
        loopA.add(timer)
        _ = moved.wait(timeout: .seconds(10))
        let early = Locked(false)
        let waiter = startThread {
          try? timer.invalidateAndWait()
          if inCallout.withLock({ $0 }) { early.withLock { $0 = true } }
        }
        joinThread(waiter)
        if early.withLock({ $0 }) { wrong.append("round \(round): returned while the callout ran") }
        let firesAtReturn = fires.current
        for _ in 0..<3 {
          _ = try? loopA.performAndWait {}
          _ = try? loopB.performAndWait {}
          usleep(2_000)
        }
        if fires.current != firesAtReturn || firesAtReturn != 1 {
          wrong.append("round \(round): \(firesAtReturn) fires at return, \(fires.current) later")
        }
      }
      return (rounds, wrong)
    }
    #expect(outcome?.wrong == [])
  }

  /// A repeating 2 ms timer moves between two loops in every callout (A to B, B to A), with
  /// nested runs on the way; an observer counts passes. Promised: callouts never overlap, none
  /// runs after `invalidateAndWait()` returns, the timer keeps firing (no fire lost forever:
  /// each due date fires once its callout returns) and no loop spins while the timer waits.
  @Test func aTimerBouncingBetweenLoopsKeepsFiringWithoutOverlapOrSpin() async throws {
    let loopA = try RunLoopThread(name: "r11-bounce-a")
    let loopB = try RunLoopThread(name: "r11-bounce-b")
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "bouncing timer") {
      () -> (fires: Int, overlapped: Bool, passes: Int, after: Int) in
      defer {
        loopA.shutdownAndWait()
        loopB.shutdownAndWait()
      }
      let passes = AtomicCounter()
      for loop in [loopA, loopB] {
        loop.add(LoopObserver(activities: [.beforeTimers]) { _, _ in passes.increment() }, to: .common)
      }
      let fires = AtomicCounter()
      let inside = Locked(0)
      let overlapped = Locked(false)
      let timer = LoopTimer(after: .milliseconds(2), repeatingEvery: .milliseconds(2)) { timer in
        let depth = inside.withLock {
          $0 += 1
          return $0
        }
        if depth > 1 { overlapped.withLock { $0 = true } }
        defer { inside.withLock { $0 -= 1 } }
        let fire = fires.increment()
        let here = RunLoopThread.current
        let there = here === loopA ? loopB : loopA
        here.remove(timer, from: .common)
        here.remove(timer, from: modeA)  // (a no-op unless it was there)
        if fire % 3 == 0 { there.add(timer, to: modeA) }  // several modes there
        there.add(timer, to: .common)
        if fire % 4 == 0 { _ = here.run(mode: modeB, until: .now.advanced(by: .milliseconds(1))) }
        if fire % 5 == 0 { timer.setFireDate(.now) }
      }
      loopA.add(timer, to: .common)
      // (Scaled: under ThreadSanitizer, with the review suites alongside, 400 ms saw 12 fires.)
      let deadline = ContinuousClock.now.advanced(by: .milliseconds(400 * watchdogScale))
      while ContinuousClock.now < deadline && fires.current < 60 { usleep(2_000) }
      let passesBefore = passes.current
      try? timer.invalidateAndWait()
      let after = fires.current
      usleep(20_000)
      return (after, overlapped.withLock { $0 }, passesBefore, fires.current - after)
    }
    guard let outcome else { return }
    #expect(outcome.fires >= 20, "the bouncing timer stopped firing: \(outcome.fires) fires")
    #expect(!outcome.overlapped, "two callouts of the timer ran at once")
    #expect(outcome.after == 0, "a callout ran after invalidateAndWait returned")
    // No spin: a loop that waits for a 2 ms timer makes a few passes per fire, not thousands.
    #expect(outcome.passes < 200 * max(outcome.fires, 1), "\(outcome.passes) passes for \(outcome.fires) fires")
    print("bouncing timer: \(outcome.fires) fires, \(outcome.passes) passes")
  }

  /// The callout moves the timer to B, B defers it as busy, and B shuts down while the callout
  /// still runs. The callout returns without a crash or hang; the timer is invalid (B's shutdown
  /// invalidated it) and it and its handler are released.
  @Test func theOtherLoopShutsDownWhileItHoldsTheTimerDeferred() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "deferred, then shutdown") {
      () throws -> (fires: Int, valid: Bool, timerGone: Bool, captureGone: Bool) in
      let loopA = try RunLoopThread(name: "r11-sd-a")
      let loopB = try RunLoopThread(name: "r11-sd-b")
      defer { loopA.shutdownAndWait() }
      let fires = AtomicCounter()
      let calloutDone = TestGate()
      weak var weakTimer: LoopTimer?
      weak var weakCapture: R11Token?
      var valid = true
      do {
        let capture = R11Token()
        weakCapture = capture
        let timer = LoopTimer(fireAt: .now, repeatingEvery: .milliseconds(5)) { timer in
          withExtendedLifetime(capture) {}
          guard fires.increment() == 1 else { return }
          loopA.remove(timer)
          loopB.add(timer)
          _ = try? loopB.performAndWait {}
          _ = try? loopB.performAndWait {}
          loopB.shutdownAndWait()
          calloutDone.open()
        }
        weakTimer = timer
        loopA.add(timer)
        _ = calloutDone.wait(timeout: .seconds(10))
        _ = try? loopA.performAndWait {}
        usleep(20_000)
        valid = timer.isValid
      }
      _ = try? loopA.performAndWait {}
      return (fires.current, valid, weakTimer == nil, weakCapture == nil)
    }
    #expect(outcome?.fires == 1)
    #expect(outcome?.valid == false)
    #expect(outcome?.timerGone == true, "the timer is still held")
    #expect(outcome?.captureGone == true, "the timer's handler is still held")
  }
}

@Suite("ReviewRound11: blocks, changes and the barrier", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound11BlockTests {
  /// Three threads each add 1,500 sources to a blocked loop (some 4,500 changes: several chunks,
  /// many bounded passes of 256) and, every 200 adds, perform a block that checks that every add
  /// its thread sent before it was applied (its schedule routine ran). Promised: a block runs only
  /// once every change sent before it was applied.
  @Test func blocksAfterManyChangesSeeThemAllAppliedAcrossChunksAndPasses() async throws {
    let loop = try RunLoopThread(name: "r11-barrier")
    let outcome = await execOnNewThread { () -> (ran: Int, wrong: [String], scheduled: [Int]) in
      let scheduled = (0..<3).map { _ in AtomicCounter() }
      let wrong = Locked<[String]>([])
      let ran = AtomicCounter()
      let sources = Locked<[InputSource]>([])
      let release = blockLoop(loop)
      race(
        (0..<3).map { thread in
          {
            var own: [InputSource] = []
            for index in 0..<1_500 {
              let source = InputSource(schedule: { _, _, _ in scheduled[thread].increment() }) { _ in }
              own.append(source)
              loop.add(source, to: index % 2 == 0 ? .default : modeA)
              if index % 200 == 199 {
                let expected = index + 1
                let modes: [RunLoopMode] = index % 400 == 199 ? [.default] : [.common]
                loop.perform(inModes: modes) {
                  ran.increment()
                  let seen = scheduled[thread].current
                  if seen < expected { wrong.withLock { $0.append("thread \(thread): \(seen) of \(expected)") } }
                }
              }
            }
            sources.withLock { $0 += own }
          }
        })
      release.open()
      _ = try? loop.performAndWait {}
      let result = (ran.current, wrong.withLock { $0 }, scheduled.map(\.current))
      loop.shutdownAndWait()
      return result
    }
    #expect(outcome.wrong == [], "a block ran before a change sent before it was applied")
    #expect(outcome.ran == 21)
    #expect(outcome.scheduled == [1_500, 1_500, 1_500])
  }

  /// Jobs too: a task that prefers the loop, started after 1,000 adds from the same thread into a
  /// blocked loop, runs after they are applied.
  @Test func aJobAfterManyChangesSeesThemApplied() async throws {
    let loop = try RunLoopThread(name: "r11-barrier-job")
    let scheduled = AtomicCounter()
    let sources = Locked<[InputSource]>([])
    let release = await execOnNewThread { () -> TestGate in
      let release = blockLoop(loop)
      for _ in 0..<1_000 {
        let source = InputSource(schedule: { _, _, _ in scheduled.increment() }) { _ in }
        sources.withLock { $0.append(source) }
        loop.add(source)
      }
      return release
    }
    let task = Task(executorPreference: loop) { scheduled.current }
    release.open()
    let seen = await task.value
    #expect(seen == 1_000, "the job ran before the adds sent before it were applied")
    await execShutdown(loop)
  }

  /// Three threads perform 3,000 blocks each (in `.default`, in `modeA` or in `.common`, in
  /// turn) while the loop runs nested: some blocks run the loop in `modeA` or `.default`, a timer
  /// runs it in `modeA`, a source's handler runs it in `.default`. Every block runs exactly once,
  /// in one of its modes, and each thread's blocks for the same modes run in the order performed.
  @Test func burstsOfBlocksWhileTheLoopRunsNestedRunEachOnceInOrderInTheirModes() async throws {
    let loop = try RunLoopThread(name: "r11-burst")
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "bursts of blocks") {
      () -> (counts: [Int], wrongMode: Int, outOfOrder: Int, nested: Int) in
      let modeStack = Locked<[RunLoopMode]>([.default])
      let runs = Locked<[[Int]]>(Array(repeating: [], count: 9))  // per thread and mode kind
      let wrongMode = AtomicCounter()
      let nested = AtomicCounter()
      let perThread = 3_000
      @Sendable func runNested(_ mode: RunLoopMode) {
        modeStack.withLock { $0.append(mode) }
        let keep = LoopTimer(after: .seconds(3600)) { _ in }
        loop.add(keep, to: mode)
        _ = loop.run(mode: mode, until: .now.advanced(by: .microseconds(300)))
        keep.invalidate()
        modeStack.withLock { _ = $0.popLast() }
        nested.increment()
      }
      let ticker = LoopTimer(after: .milliseconds(1), repeatingEvery: .milliseconds(1)) { _ in runNested(modeA) }
      loop.add(ticker)
      let kick = Locked<InputSource?>(nil)
      let source = InputSource { _ in runNested(.default) }
      kick.withLock { $0 = source }
      loop.add(source)
      _ = try? loop.performAndWait {}
      let kinds: [[RunLoopMode]] = [[.default], [modeA], [.common]]
      race(
        (0..<3).map { thread in
          {
            for index in 0..<perThread {
              let kind = index % 3
              loop.perform(inModes: kinds[kind]) {
                let mode = modeStack.withLock { $0.last! }
                let allowed = kind == 0 ? mode == .default : kind == 1 ? mode == modeA : mode == .default
                if !allowed { wrongMode.increment() }
                runs.withLock { $0[thread * 3 + kind].append(index) }
                if index % 250 == 0 { runNested(index % 500 == 0 ? modeA : .default) }
              }
              if index % 400 == 0 { source.signal() }
            }
          }
        })
      // modeA blocks run only in nested runs in modeA: keep them coming until every block ran.
      let deadline = ContinuousClock.now.advanced(by: .seconds(10))
      while runs.withLock({ $0.map(\.count).reduce(0, +) }) < 3 * perThread && ContinuousClock.now < deadline {
        usleep(2_000)
      }
      ticker.invalidate()
      source.invalidate()
      _ = try? loop.performAndWait {}
      let all = runs.withLock { $0 }
      var outOfOrder = 0
      for list in all where list != list.sorted() || Set(list).count != list.count { outOfOrder += 1 }
      let result = (all.map(\.count), wrongMode.current, outOfOrder, nested.current)
      loop.shutdownAndWait()
      return result
    }
    guard let outcome else { return }
    #expect(outcome.counts == Array(repeating: 1_000, count: 9), "blocks ran \(outcome.counts) times")
    #expect(outcome.wrongMode == 0, "blocks ran outside their modes")
    #expect(outcome.outOfOrder == 0, "lists out of order")
    print("bursts of blocks: \(outcome.nested) nested runs")
  }

  /// `performAndWait` from a thread returns only after the blocks that thread performed before it
  /// (for the same mode) ran, and after the changes it sent before it were applied, also when
  /// they are more than a chunk and a pass.
  @Test func performAndWaitComesAfterTheThreadsOwnBlocksAndChanges() async throws {
    let loop = try RunLoopThread(name: "r11-paw")
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "performAndWait order") {
      () -> [String] in
      var wrong: [String] = []
      let sources = Locked<[InputSource]>([])
      for round in 0..<20 {
        let ran = AtomicCounter()
        let scheduled = AtomicCounter()
        let count = 300 + round * 97
        for index in 0..<count {
          loop.perform { ran.increment() }
          if index % 2 == 0 {
            let source = InputSource(schedule: { _, _, _ in scheduled.increment() }) { _ in }
            sources.withLock { $0.append(source) }
            loop.add(source)
          }
        }
        let seen = try? loop.performAndWait { (ran.current, scheduled.current) }
        if seen?.0 != count || seen?.1 != (count + 1) / 2 {
          wrong.append("round \(round): \(String(describing: seen)) of \(count)")
        }
      }
      loop.shutdownAndWait()
      return wrong
    }
    #expect(outcome == [])
  }

  /// Shutdown while thousands of blocks and changes wait in a blocked loop (three threads keep
  /// performing through the shutdown). Every block that `perform` accepted runs exactly once,
  /// none after `shutdownAndWait` returns, refused ones never; every added source is cancelled
  /// once; nothing hangs.
  @Test func shutdownWhileThousandsOfBlocksAndChangesWaitRunsEachAcceptedBlockOnce() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "shutdown with waiting work") {
      () throws -> [String] in
      var wrong: [String] = []
      for round in 0..<4 {
        let loop = try RunLoopThread(name: "r11-sd")
        let accepted = AtomicCounter()
        let ran = Locked<[Int: Int]>([:])
        let refused = Locked<Set<Int>>([])
        let schedules = AtomicCounter()
        let cancels = AtomicCounter()
        let returned = Locked(false)
        let lateRuns = AtomicCounter()
        let release = blockLoop(loop)
        let sources = Locked<[InputSource]>([])
        race(
          (0..<3).map { thread in
            {
              for index in 0..<2_500 {
                let id = thread * 10_000 + index
                let modes: [RunLoopMode] = index % 2 == 0 ? [.default] : [modeB]  // modeB never runs
                let took = loop.perform(inModes: modes) {
                  if returned.withLock({ $0 }) { lateRuns.increment() }
                  ran.withLock { $0[id, default: 0] += 1 }
                }
                if took { accepted.increment() } else { refused.withLock { _ = $0.insert(id) } }
                if index % 3 == 0 {
                  let source = InputSource(
                    schedule: { _, _, _ in schedules.increment() }, cancel: { _, _ in cancels.increment() }
                  ) { _ in }
                  sources.withLock { $0.append(source) }
                  loop.add(source)
                }
                if thread == 0 && index == 1_200 + round * 300 {
                  loop.shutdown()
                  release.open()
                }
              }
            }
          })
        loop.shutdownAndWait()
        returned.withLock { $0 = true }
        usleep(5_000)
        let runs = ran.withLock { $0 }
        let twice = runs.values.filter { $0 != 1 }.count
        let refusedRan = refused.withLock { $0 }.filter { runs[$0] != nil }.count
        if runs.count != accepted.current || twice != 0 || refusedRan != 0 || lateRuns.current != 0 {
          wrong.append(
            "round \(round): accepted \(accepted.current), ran \(runs.count), twice \(twice), refused ran "
              + "\(refusedRan), late \(lateRuns.current)")
        }
        if schedules.current != cancels.current {
          wrong.append("round \(round): \(schedules.current) schedules, \(cancels.current) cancels")
        }
      }
      return wrong
    }
    #expect(outcome == [])
  }
}

@Suite("ReviewRound11: command sources", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound11CommandTests {
  /// Delivering a batch on A, the handler (at the batch's first command) moves the source to B;
  /// commands posted meanwhile reach B, which leaves them pending while A finishes, then the
  /// source is invalidated from another thread. Promised: every accepted command is delivered
  /// exactly once, in posting order, before the `cancel` that follows the invalidation. B's closing
  /// drain used to deliver the later commands at once, while A still had most of its batch to
  /// deliver (A delivered it after that cancel); it now waits for A's batch to end.
  @Test
  func aCommandSourceMovedAwayMidBatchThenInvalidatedDeliversInOrderBeforeCancel() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "moved mid-batch, invalidated") {
      () throws -> (delivered: [Int], cancelsBeforeLast: Int, accepted: Int) in
      let loopA = try RunLoopThread(name: "r11-cmd-a")
      let loopB = try RunLoopThread(name: "r11-cmd-b")
      defer {
        loopA.shutdownAndWait()
        loopB.shutdownAndWait()
      }
      let delivered = Locked<[Int]>([])
      let cancels = AtomicCounter()
      let cancelsAtDelivery = Locked<[Int]>([])
      let box = Locked<InputSource?>(nil)
      let moved = TestGate()
      let command = CommandSource<Int>(cancel: { _, _ in cancels.increment() }) { value in
        delivered.withLock { $0.append(value) }
        cancelsAtDelivery.withLock { $0.append(cancels.current) }
        guard value == 0, let source = box.withLock({ $0 }) else { return }
        RunLoopThread.current.remove(source)  // its last mode on A: A's cancel runs now
        loopB.add(source)
        moved.open()
        // Until the invalidation's cancel on B, which (fixed) waits for this batch to end: bounded,
        // long enough for a cancel that does not wait to come first.
        let deadline = ContinuousClock.now.advanced(by: .milliseconds(300))
        while cancels.current < 2 && ContinuousClock.now < deadline { usleep(500) }
      }
      box.withLock { $0 = command.source }
      var accepted = 0
      let release = blockLoop(loopA)
      loopA.add(command.source)
      for value in 0..<100 where command.post(value) { accepted += 1 }  // one batch on A
      release.open()
      _ = moved.wait(timeout: .seconds(10))
      for value in 100..<200 where command.post(value) { accepted += 1 }
      _ = try? loopB.performAndWait {}  // B joined it and found A still delivering
      command.source.invalidate()
      _ = waitUntil("the last cancel") { cancels.current >= 2 }
      _ = try? loopA.performAndWait {}
      _ = try? loopB.performAndWait {}
      let last = cancelsAtDelivery.withLock { $0 }.filter { $0 >= 2 }.count
      return (delivered.withLock { $0 }, last, accepted)
    }
    guard let outcome else { return }
    #expect(outcome.accepted == 200)
    let inOrder = outcome.delivered == Array(0..<200)
    #expect(inOrder, "delivered \(outcome.delivered.count) commands; in order: \(inOrder)")
    #expect(outcome.cancelsBeforeLast == 0, "\(outcome.cancelsBeforeLast) commands delivered after the last cancel")
  }

  /// The same, but A's handler, while B's closing drain waits for A's batch, waits for B in turn
  /// (`performAndWait`): that wait would close a cycle, so it throws `wouldDeadlock` instead of
  /// hanging both loops, and every command still comes once, in order, before the last cancel.
  @Test func aHandlerWaitingForTheLoopThatWaitsForItsBatchIsRefusedNotHung() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "closing drain cycle") {
      () throws -> (delivered: [Int], afterLastCancel: Int, refused: Bool) in
      let loopA = try RunLoopThread(name: "r11-cyc-a")
      let loopB = try RunLoopThread(name: "r11-cyc-b")
      defer {
        loopA.shutdownAndWait()
        loopB.shutdownAndWait()
      }
      let delivered = Locked<[Int]>([])
      let cancels = AtomicCounter()
      let cancelsAtDelivery = Locked<[Int]>([])
      let refused = Locked(false)
      let box = Locked<CommandSource<Int>?>(nil)
      let moved = TestGate()
      let command = CommandSource<Int>(cancel: { _, _ in cancels.increment() }) { value in
        delivered.withLock { $0.append(value) }
        cancelsAtDelivery.withLock { $0.append(cancels.current) }
        guard value == 0, let command = box.withLock({ $0 }) else { return }
        RunLoopThread.current.remove(command.source)  // its last mode on A
        loopB.add(command.source)
        moved.open()
        let buffer = command.buffer
        _ = waitUntil("B's closing drain waiting for this batch") {
          buffer.lock.withLock { !buffer.closingWaiters.isEmpty }
        }
        do {
          try loopB.performAndWait {}
        } catch RunLoopError.wouldDeadlock {
          refused.withLock { $0 = true }
        } catch {}
      }
      box.withLock { $0 = command }
      let release = blockLoop(loopA)
      loopA.add(command.source)
      for value in 0..<100 { command.post(value) }  // one batch on A
      release.open()
      _ = moved.wait(timeout: .seconds(10))
      for value in 100..<200 { command.post(value) }
      _ = try? loopB.performAndWait {}  // B joined it
      command.source.invalidate()  // B's closing drain waits for A's batch
      _ = waitUntil("the last cancel") { cancels.current >= 2 }
      box.withLock { $0 = nil }
      let afterLast = cancelsAtDelivery.withLock { $0 }.filter { $0 >= 2 }.count
      return (delivered.withLock { $0 }, afterLast, refused.withLock { $0 })
    }
    guard let outcome else { return }
    let inOrder = outcome.delivered == Array(0..<200)
    #expect(inOrder, "delivered \(outcome.delivered.count) commands; in order: \(inOrder)")
    #expect(outcome.afterLastCancel == 0)
    #expect(outcome.refused, "the handler's wait for B was not refused")
  }

  /// The same move without the invalidation: A finishes its batch, then B delivers what was posted
  /// meanwhile. Every command once, in order; one cancel per loop once invalidated; the handler's
  /// captures are released.
  @Test func aCommandSourceMovedAwayMidBatchDeliversEveryCommandOnceInOrder() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "moved mid-batch") {
      () throws -> (delivered: [Int], cancels: Int, captureGone: Bool) in
      let loopA = try RunLoopThread(name: "r11-cmd2-a")
      let loopB = try RunLoopThread(name: "r11-cmd2-b")
      defer {
        loopA.shutdownAndWait()
        loopB.shutdownAndWait()
      }
      let delivered = Locked<[Int]>([])
      let cancels = AtomicCounter()
      weak var weakCapture: R11Token?
      do {
        let capture = R11Token()
        weakCapture = capture
        let box = Locked<InputSource?>(nil)
        let moved = TestGate()
        let leave = TestGate()
        let command = CommandSource<Int>(cancel: { _, _ in cancels.increment() }) { value in
          withExtendedLifetime(capture) {}
          delivered.withLock { $0.append(value) }
          guard value == 0, let source = box.withLock({ $0 }) else { return }
          RunLoopThread.current.remove(source)
          loopB.add(source)
          moved.open()
          _ = leave.wait(timeout: .seconds(5))
        }
        box.withLock { $0 = command.source }
        let release = blockLoop(loopA)
        loopA.add(command.source)
        for value in 0..<100 { command.post(value) }
        release.open()
        _ = moved.wait(timeout: .seconds(10))
        for value in 100..<200 { command.post(value) }
        _ = try? loopB.performAndWait {}
        leave.open()
        _ = waitUntil("every command") { delivered.withLock { $0.count } >= 200 }
        command.source.invalidate()
        box.withLock { $0 = nil }
        _ = try? loopB.performAndWait {}
        _ = try? loopA.performAndWait {}
      }
      return (delivered.withLock { $0 }, cancels.current, weakCapture == nil)
    }
    guard let outcome else { return }
    let inOrder = outcome.delivered == Array(0..<200)
    #expect(inOrder, "delivered \(outcome.delivered.count) commands; in order: \(inOrder)")
    #expect(outcome.cancels == 2)
    #expect(outcome.captureGone, "the invalidated command source's handler is still held")
  }

  /// Three producers post 3,000 commands each while the handler runs the loop nested (every 500th
  /// command), a consumer-side thread invalidates the source partway. Every accepted post is
  /// delivered exactly once, in order per producer, none after cancel; refused posts are never
  /// delivered; cancel runs once.
  @Test func producersRacingInvalidationWhileTheHandlerRunsNestedDeliverEachAcceptedPostOnce() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "producers vs invalidate") {
      () throws -> [String] in
      var wrong: [String] = []
      for round in 0..<6 {
        let loop = try RunLoopThread(name: "r11-cmd3")
        let delivered = Locked<[[Int]]>([[], [], []])
        let afterCancel = AtomicCounter()
        let cancels = AtomicCounter()
        let command = CommandSource<(Int, Int)>(cancel: { _, _ in cancels.increment() }) { producer, value in
          if cancels.current > 0 { afterCancel.increment() }
          delivered.withLock { $0[producer].append(value) }
          if value % 500 == 499 {
            let keep = LoopTimer(after: .seconds(3600)) { _ in }
            RunLoopThread.current.add(keep, to: modeA)
            _ = RunLoopThread.current.run(
              mode: round % 2 == 0 ? .default : modeA, until: .now.advanced(by: .microseconds(200)))
            keep.invalidate()
          }
        }
        loop.add(command.source)
        loop.add(command.source, to: modeA)
        let accepted = Locked<[[Int]]>([[], [], []])
        let producers: [@Sendable () -> Void] = (0..<3).map { producer in
          {
            for value in 0..<3_000 where command.post((producer, value)) {
              accepted.withLock { $0[producer].append(value) }
            }
          }
        }
        let delay = UInt32(200 + round * 300)
        race(
          producers + [
            {
              usleep(delay); command.source.invalidate()
            }
          ])
        _ = waitUntil("cancel") { cancels.current >= 1 }
        loop.shutdownAndWait()
        let got = delivered.withLock { $0 }
        let sent = accepted.withLock { $0 }
        for producer in 0..<3 where got[producer] != sent[producer] {
          wrong.append(
            "round \(round) producer \(producer): accepted \(sent[producer].count), delivered \(got[producer].count)")
        }
        if cancels.current != 1 || afterCancel.current != 0 {
          wrong.append("round \(round): \(cancels.current) cancels, \(afterCancel.current) after cancel")
        }
      }
      return wrong
    }
    #expect(outcome == [])
  }
}

@Suite("ReviewRound11: sequences and what they leave behind", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound11SequenceTests {
  /// Three producer threads post 2,000 elements each into a source sequence while the loop shuts
  /// down partway. Promised: every accepted element is delivered exactly once and in order per
  /// producer, then the sequence ends; `onCancel` runs once; afterwards the sequence and what its
  /// `onCancel` captured are released.
  @Test func producersRacingShutdownDeliverEachAcceptedElementOnceAndLeaveNothingBehind() async throws {
    var wrong: [String] = []
    for round in 0..<4 {
      let loop = try RunLoopThread(name: "r11-seq")
      let cancels = AtomicCounter()
      weak var weakSequence: SourceSequence<Int>?
      weak var weakCapture: R11Token?
      var got: [[Int]] = []
      var sent: [[Int]] = []
      do {
        let capture = R11Token()
        weakCapture = capture
        let sequence = loop.sourceSequence(
          of: Int.self,
          onCancel: { _ in
            withExtendedLifetime(capture) {}
            cancels.increment()
          })
        weakSequence = sequence
        let consumer = Task { () -> [[Int]] in
          var got: [[Int]] = [[], [], []]
          for await element in sequence { got[element / 10_000].append(element % 10_000) }
          return got
        }
        sent = await execOnNewThread { () -> [[Int]] in
          let accepted = Locked<[[Int]]>([[], [], []])
          let producers: [@Sendable () -> Void] = (0..<3).map { producer in
            {
              for value in 0..<2_000 {
                switch sequence.post(producer * 10_000 + value) {
                case .enqueued, .enqueuedDroppingOldest: accepted.withLock { $0[producer].append(value) }
                default: break
                }
              }
            }
          }
          let delay = UInt32(100 + round * 400)
          race(
            producers + [
              {
                usleep(delay); loop.shutdown()
              }
            ])
          loop.shutdownAndWait()
          return accepted.withLock { $0 }
        }
        got = await consumer.value
      }
      if got != sent {
        wrong.append("round \(round): sent \(sent.map(\.count)), got \(got.map(\.count))")
      }
      if cancels.current != 1 { wrong.append("round \(round): onCancel ran \(cancels.current) times") }
      // The finished consumer task lets go of its closure shortly after handing its value over.
      for _ in 0..<2_000 where weakSequence != nil || weakCapture != nil { try await Task.sleep(for: .milliseconds(1)) }
      if weakSequence != nil || weakCapture != nil {
        wrong.append("round \(round): sequence held \(weakSequence != nil), capture held \(weakCapture != nil)")
      }
    }
    #expect(wrong == [])
  }

  /// Members removed or invalidated from another thread while the loop is blocked (more than a
  /// chunk and a pass of changes), and members left on a loop that shuts down: once the loop has
  /// applied the changes (or finished), every member and every closure it held is released.
  @Test func membersAndTheirClosuresAreReleasedAfterBurstsOfRemovalsAndShutdown() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "released members") {
      () throws -> (members: Int, captures: Int, cancels: Int, schedules: Int) in
      let loop = try RunLoopThread(name: "r11-leak")
      let cancels = AtomicCounter()
      let schedules = AtomicCounter()
      let weakMembers = Locked<[() -> Bool]>([])
      let weakCaptures = Locked<[() -> Bool]>([])
      do {
        var keep: [InputSource] = []
        var timers: [LoopTimer] = []
        let release = blockLoop(loop)
        for index in 0..<1_200 {
          let capture = R11Token()
          weak let weakCapture = capture
          let source = InputSource(
            schedule: { _, _, _ in schedules.increment() },
            cancel: { _, _ in
              withExtendedLifetime(capture) {}
              cancels.increment()
            }
          ) { _ in }
          weak let weakSource = source
          weakMembers.withLock { $0.append { weakSource == nil } }
          weakCaptures.withLock { $0.append { weakCapture == nil } }
          loop.add(source, to: index % 2 == 0 ? .default : modeA)
          switch index % 3 {
          case 0: loop.remove(source, from: index % 2 == 0 ? .default : modeA)
          case 1: source.invalidate()
          default: keep.append(source)  // left for the shutdown
          }
          if index % 4 == 0 {
            let timerCapture = R11Token()
            weak let weakTimerCapture = timerCapture
            let timer = LoopTimer(after: .seconds(3600)) { _ in withExtendedLifetime(timerCapture) {} }
            weak let weakTimer = timer
            weakMembers.withLock { $0.append { weakTimer == nil } }
            weakCaptures.withLock { $0.append { weakTimerCapture == nil } }
            loop.add(timer, to: .common)
            if index % 8 == 0 { timer.invalidate() } else { timers.append(timer) }
          }
        }
        release.open()
        _ = try? loop.performAndWait {}
        loop.shutdownAndWait()
        withExtendedLifetime((keep, timers)) {}
      }
      let members = weakMembers.withLock { $0 }.filter { !$0() }.count
      let captures = weakCaptures.withLock { $0 }.filter { !$0() }.count
      return (members, captures, cancels.current, schedules.current)
    }
    #expect(outcome?.members == 0, "members still held")
    #expect(outcome?.captures == 0, "closures' captures still held")
    #expect(outcome?.schedules == 1_200)
    #expect(outcome?.cancels == 1_200)
  }
}
