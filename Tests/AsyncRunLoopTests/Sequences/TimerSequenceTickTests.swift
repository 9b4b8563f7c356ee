import Dispatch
import Glibc
import Testing

@testable import AsyncRunLoop

// MARK: - Timer sequences

@Suite("Timer sequences tick on their grid", .serialized, .timeLimit(.minutes(10)))
struct TimerSequenceTickTests {
  /// Promised (`.burst`): one tick per missed due instant, back to back, then the grid goes on:
  /// after the loop was held for 40 ms, 25 ticks of a 2 ms timer are consecutive grid points
  /// (exactly one interval apart), none folded.
  @Test func burstTicksAreConsecutiveGridPointsAfterTheLoopWasHeld() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "burst") { () async throws -> [LoopTick] in
      let loop = try RunLoopThread(name: "burst")
      let sequence = loop.timer(every: .milliseconds(2), missedTicks: .burst)
      await execOnNewThread {
        let release = blockLoop(loop)
        usleep(40_000)
        release.open()
      }
      var ticks: [LoopTick] = []
      for await tick in sequence {
        ticks.append(tick)
        if ticks.count == 25 { break }
      }
      await execShutdown(loop)
      return ticks
    }
    guard let outcome else { return }
    #expect(outcome.count == 25)
    let gaps = zip(outcome.dropFirst(), outcome).map { $0.scheduled.nanoseconds - $1.scheduled.nanoseconds }
    #expect(gaps.allSatisfy { $0 == 2_000_000 }, "gaps between ticks: \(gaps)")
    #expect(outcome.allSatisfy { $0.skipped == 0 })
  }

  /// Promised (`.skip`): one tick stands for the missed due instants (`skipped` counts them) and
  /// the timer stays on its grid: each tick's successor is due exactly `1 + skipped` intervals
  /// after it, whatever the loop and the consumer did.
  @Test func skipTicksAccountForEveryGridPoint() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "skip") { () async throws -> [LoopTick] in
      let loop = try RunLoopThread(name: "skip")
      let sequence = loop.timer(every: .milliseconds(2), missedTicks: .skip)
      var ticks: [LoopTick] = []
      for await tick in sequence {
        ticks.append(tick)
        if ticks.count == 3 {
          await execOnNewThread {
            let release = blockLoop(loop)
            usleep(20_000)
            release.open()
          }
        }
        if ticks.count == 6 { try await Task.sleep(for: .milliseconds(15)) }  // the consumer falls behind
        if ticks.count == 10 { break }
      }
      await execShutdown(loop)
      return ticks
    }
    guard let outcome else { return }
    for (next, tick) in zip(outcome.dropFirst(), outcome) {
      #expect(
        next.scheduled.nanoseconds - tick.scheduled.nanoseconds == Int64(1 + tick.skipped) * 2_000_000,
        "\(tick) then \(next)")
    }
  }

  /// Promised: a one-shot timer at an instant already past ticks once, as soon as possible, then
  /// the sequence ends; its tick carries the instant asked for.
  @Test func aOneShotTimerInThePastTicksOnceThenEnds() async throws {
    let deadline = LoopClock.Instant.now.advanced(by: .milliseconds(-50))
    let outcome = try await withWatchdog(timeout: .seconds(20), "one-shot") { () async throws -> [LoopTick] in
      let loop = try RunLoopThread(name: "once")
      var ticks: [LoopTick] = []
      for await tick in loop.timer(at: deadline) { ticks.append(tick) }
      await execShutdown(loop)
      return ticks
    }
    guard let outcome else { return }
    #expect(outcome.map(\.scheduled) == [deadline])
  }

  /// Promised: `invalidate()` delivers the ticks the loop has already fired and the consumer has
  /// not taken, then the sequence ends: a burst run the loop fired while the consumer slept is
  /// delivered in full after the invalidation.
  @Test func invalidateDeliversTheBurstTicksAlreadyFired() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "burst then invalidate") {
      () async throws -> (count: Int, gaps: [Int64]) in
      let loop = try RunLoopThread(name: "binv")
      let sequence = loop.timer(every: .milliseconds(1), missedTicks: .burst)
      var iterator = sequence.makeAsyncIterator()
      guard let first = await iterator.next() else { return (0, []) }
      // The loop goes on firing while the consumer sleeps; the ticks pile up as one run.
      try await Task.sleep(for: .milliseconds(30))
      sequence.invalidate()
      var ticks = [first]
      while let tick = await iterator.next() { ticks.append(tick) }
      // Ended: the machine ignores fires from now on, so this is the due instant it stopped at.
      let ready = sequence.lock.withLock { sequence.machine.schedule.nextDue ?? 0 }
      await execShutdown(loop)
      let gaps = zip(ticks.dropFirst(), ticks).map { $0.scheduled.nanoseconds - $1.scheduled.nanoseconds }
      // Every grid point before the next due instant the machine had reached was delivered.
      let expected = Int((ready - first.scheduled.nanoseconds) / 1_000_000)
      return (ticks.count - expected, gaps)
    }
    guard let outcome else { return }
    #expect(outcome.count == 0, "\(outcome.count) ticks more (or fewer) than fired")
    #expect(outcome.gaps.allSatisfy { $0 == 1_000_000 }, "\(outcome.gaps)")
  }
}

@Suite("Ticks, activity drops, cancelled sleeps", .serialized, .timeLimit(.minutes(10)))
struct TicksActivityDropsAndCancelledSleepsTests {
  /// Promised (`MissedTickPolicy`): ticks stay on the timer's grid; `.burst` hands out every grid
  /// point in turn (`skipped` 0), `.skip` folds missed ones into `skipped` (the next tick is the
  /// grid point after them), `.delay` restarts the period from a late fire. No tick reaches the
  /// consumer before its instant. The consumer stalls now and then.
  @Test(arguments: [MissedTickPolicy.skip, .burst, .delay])
  func ticksStayOnTheGridAndNeverArriveEarly(policy: MissedTickPolicy) async throws {
    let interval: Int64 = 2_000_000
    let outcome = try await withWatchdog(timeout: .seconds(30), "ticks \(policy)") {
      () async throws -> (ticks: [LoopTick], early: Int, first: Int64) in
      let loop = try RunLoopThread(name: "grid")
      let before = LoopClock.Instant.now.nanoseconds
      let timer = loop.timer(every: .nanoseconds(interval), missedTicks: policy)
      var ticks: [LoopTick] = []
      var early = 0
      for await tick in timer {
        if LoopClock.Instant.now < tick.scheduled { early += 1 }
        ticks.append(tick)
        if ticks.count % 3 == 0 { try await Task.sleep(for: .milliseconds(7)) }
        if ticks.count == 12 { break }
      }
      await execShutdown(loop)
      return (ticks, early, before)
    }
    guard let outcome else { return }
    #expect(outcome.early == 0)
    let ticks = outcome.ticks
    #expect(ticks.count == 12)
    guard let first = ticks.first else { return }
    #expect(first.scheduled.nanoseconds >= outcome.first + interval)
    for (previous, next) in zip(ticks, ticks.dropFirst()) {
      let step = next.scheduled.nanoseconds - previous.scheduled.nanoseconds
      switch policy {
      case .burst:
        #expect(step == interval, "burst step \(step)")
        #expect(previous.skipped == 0)
      case .skip:
        #expect(step == interval * Int64(1 + previous.skipped), "skip step \(step), skipped \(previous.skipped)")
      case .delay:
        #expect(step >= interval, "delay step \(step)")
      }
    }
  }

  /// Promised (`ActivitySequence`): a consumer that falls behind by more than `bufferLimit`
  /// events gets the newest ones; the rest are counted in `droppedCount`.
  @Test func activityBufferKeepsTheNewestAndCountsTheDropped() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "activity drops") {
      () async throws -> ([LoopActivity], Int) in
      let loop = try RunLoopThread(name: "act-drop")
      let hold = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(hold, to: endRaceModeA)
      let activities = loop.activities([.entry, .exit], modes: [endRaceModeA], bufferLimit: 3)
      for _ in 0..<5 {
        _ = try loop.performAndWait { loop.run(mode: endRaceModeA, for: .milliseconds(1)) }
      }
      activities.invalidate()
      var seen: [LoopActivity] = []
      for await event in activities { seen.append(event.activity) }
      let dropped = activities.droppedCount
      await execShutdown(loop)
      return (seen, dropped)
    }
    #expect(outcome?.0 == [.exit, .entry, .exit])
    #expect(outcome?.1 == 7)
  }

  /// A long `Task.sleep` under the loop's preference, or in an actor on the loop, ends with
  /// `CancellationError` when its task is cancelled: no hung await.
  @Test func cancelledLongSleepsOnTheLoopEndPromptly() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "cancelled sleeps") { () async throws -> [Bool] in
      let loop = try RunLoopThread(name: "sleep-cancel")
      let actor = HourSleepingActor(loop: loop)
      let preferred = Task(executorPreference: loop) { () -> Bool in
        do {
          try await Task.sleep(for: .seconds(3600))
          return false
        } catch { return error is CancellationError }
      }
      let isolated = Task { await actor.sleepLong() }
      let clock = Task { () -> Bool in
        do {
          try await loop.clock.sleep(for: .seconds(3600))
          return false
        } catch { return error is CancellationError }
      }
      try await Task.sleep(for: .milliseconds(10))
      preferred.cancel()
      isolated.cancel()
      clock.cancel()
      let results = [await preferred.value, await isolated.value, await clock.value]
      await execShutdown(loop)
      return results
    }
    #expect(outcome == [true, true, true])
  }

  /// `LoopGroup` with pinning on a machine with fewer CPUs than loops wraps around the allowed
  /// CPUs and works.
  @Test func pinnedLoopGroupWithMoreLoopsThanCPUsWorks() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "pinned group") { () async throws -> Int in
      let group = try LoopGroup(count: 5, name: "pin", pinToCPUs: true)
      var answered = 0
      for loop in group.loops where (try? loop.performAndWait { loop.isOnLoopThread }) == true {
        answered += 1
      }
      await execOnNewThread { group.shutdownAndWait() }
      return answered
    }
    #expect(outcome == 5)
  }
}
