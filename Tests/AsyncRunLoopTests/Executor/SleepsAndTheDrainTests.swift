import Glibc
import Testing

@_spi(Testing) @testable import AsyncRunLoop

// MARK: - More executor promises

@Suite("Sleeps end at the shutdown drain, neither hung nor early", .serialized, .timeLimit(.minutes(10)))
struct SleepsAndTheDrainTests {
  /// Promised: cancelling a `loop.clock` sleep ends it with `CancellationError` and takes its
  /// timer off the loop; cancelling a `Task.sleep` under the loop's preference ends it too.
  @Test func cancelledSleepsEndPromptlyAndLeaveNoTimerBehind() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "cancel sleeps") {
      () async throws -> (clock: Bool, task: Bool, records: Int?) in
      let loop = try RunLoopThread(name: "csleep")
      let clockSleep = Task { () -> Bool in
        do {
          try await loop.clock.sleep(until: .now.advanced(by: .seconds(60)))
          return false
        } catch { return error is CancellationError }
      }
      let taskSleep = Task(executorPreference: loop) { () -> Bool in
        do {
          try await Task.sleep(for: .seconds(60))
          return false
        } catch { return error is CancellationError }
      }
      _ = await pollEveryMillisecond { loop.scheduledJobCount >= 1 }
      _ = await pollEveryMillisecond {
        (try? loop.performAndWait { loop.core.modeTable.allRecords.count }) ?? 0 >= 2
      }
      clockSleep.cancel()
      taskSleep.cancel()
      let clock = await clockSleep.value
      let task = await taskSleep.value
      _ = await pollEveryMillisecond { (try? loop.performAndWait { loop.core.modeTable.allRecords.count }) ?? 0 <= 1 }
      let records = await execOnNewThread { try? loop.performAndWait { loop.core.modeTable.allRecords.count } }
      await execShutdown(loop)
      return (clock, task, records)
    }
    guard let outcome else { return }
    #expect(outcome.clock)
    #expect(outcome.task)
    // The Task.sleep's job stays on its timer until its deadline (the runtime's): at most one.
    #expect((outcome.records ?? 99) <= 1, "the loop holds \(String(describing: outcome.records)) records")
  }

  /// Promised: a `LoopClock()` sleep made on a loop's thread is not ended by that loop's
  /// shutdown: it sleeps the rest on the shared timer loop and returns at its deadline, never
  /// early.
  @Test func aDefaultClockSleepOnALoopOutlivesTheLoopsShutdown() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "default clock") {
      () async throws -> (result: String, early: Bool) in
      let loop = try RunLoopThread(name: "dclock")
      let deadline = LoopClock.Instant.now.advanced(by: .milliseconds(300))
      let sleeper = Task(executorPreference: loop) { () -> String in
        do {
          try await LoopClock().sleep(until: deadline)
          return "returned"
        } catch {
          return "\(error)"
        }
      }
      _ = await pollEveryMillisecond { (try? loop.performAndWait { loop.core.modeTable.allRecords.count }) ?? 0 >= 1 }
      await execShutdown(loop)
      let result = await sleeper.value
      return (result, LoopClock.Instant.now < deadline)
    }
    guard let outcome else { return }
    #expect(outcome.result == "returned")
    #expect(!outcome.early)
  }

  /// Promised: the drain runs jobs that arrive while it drains: a task started from a source's
  /// cancel routine (which the shutdown runs) that calls an actor on the loop completes, and so
  /// does a `performAndWait` on the loop made from the fallback (it throws `shutDown`).
  @Test func jobsStartedByCancelRoutinesDuringTheDrainComplete() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "drain jobs") {
      () async throws -> (calls: Int, late: String) in
      let loop = try RunLoopThread(name: "drain")
      let actor = PinnedSurfaceActor(loop: loop)
      let done = Locked<Task<String, Never>?>(nil)
      let source = InputSource(
        cancel: { _, _ in
          let task = Task { () -> String in
            await actor.slowCall()
            do {
              _ = try await actor.performInlineOrThrow()
              return "ran"
            } catch RunLoopError.shutDown {
              return "shutDown"
            } catch {
              return "\(error)"
            }
          }
          done.withLock { $0 = task }
        }, perform: { _ in })
      loop.add(source)
      _ = await execOnNewThread { try? loop.performAndWait {} }
      await execShutdown(loop)
      guard let task = done.withLock({ $0 }) else { return (-1, "no task") }
      let late = await task.value
      return (await actor.calls, late)
    }
    guard let outcome else { return }
    #expect(outcome.calls == 1)
    #expect(outcome.late == "ran" || outcome.late == "shutDown", "\(outcome.late)")
  }
}

extension SleepsAndTheDrainTests {
  /// Promised: `assumeIsolated` of an actor on the loop works in performed blocks and timer and
  /// observer callouts on that loop, and in the actor's calls that run on the fallback after the
  /// loop terminated.
  @Test func assumeIsolatedHoldsInCalloutsAndOnTheFallback() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "assumeIsolated") {
      () async throws -> [Int] in
      let loop = try RunLoopThread(name: "assume")
      let actor = PinnedSurfaceActor(loop: loop)
      await actor.slowCall()
      let seen = Locked<[Int]>([])
      let fired = TestGate()
      loop.add(
        LoopTimer(after: .zero) { _ in
          seen.withLock { $0.append(actor.callsAssumingIsolation()) }
          fired.open()
        }, to: .common)
      let observed = TestGate()
      let observer = LoopObserver(activities: .beforeWaiting, repeats: false) { _, _ in
        seen.withLock { $0.append(actor.callsAssumingIsolation()) }
        observed.open()
      }
      loop.add(observer, to: .common)
      let inBlock = await execOnNewThread { try? loop.performAndWait { actor.callsAssumingIsolation() } }
      _ = await pollEveryMillisecond { fired.opened && observed.opened }
      await execShutdown(loop)
      let onFallback = await actor.callsThroughDynamicCheck()
      return [inBlock ?? -1] + seen.withLock { $0 } + [onFallback]
    }
    guard let outcome else { return }
    #expect(outcome == [1, 1, 1, 1])
  }

  /// Promised: a `Task.sleep` under the preference of a loop that has already terminated is
  /// never dropped and never early: it completes at its deadline and the task goes on (on the
  /// fallback queue).
  @Test func taskSleepUnderATerminatedLoopsPreferenceCompletesAtItsDeadline() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "sleep on dead loop") {
      () async throws -> (slept: Duration, isolated: Bool?) in
      let loop = try RunLoopThread(name: "deadsleep")
      await execShutdown(loop)
      return await Task(executorPreference: loop) { () -> (Duration, Bool?) in
        let start = ContinuousClock.now
        try? await Task.sleep(for: .milliseconds(100))
        return (ContinuousClock.now - start, loop.isIsolatingCurrentContext())
      }.value
    }
    guard let outcome else { return }
    #expect(outcome.slept >= .milliseconds(100))
    #expect(outcome.isolated == true)
  }
}

extension SleepsAndTheDrainTests {
  /// Promised: an actor on a `RunLoopThread.current` loop, whose plain thread runs the loop in
  /// short slices, keeps its one-at-a-time guarantee across the shutdown: the calls running on
  /// the thread and those moved to the fallback once the thread is out of a run never overlap,
  /// every call completes, and the thread is no longer isolated to the loop afterwards.
  @Test func aCurrentLoopsActorNeverOverlapsAcrossTheMoveToTheFallback() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "current loop actor") {
      () async throws -> (most: Int, calls: Int, isolatedAfter: Bool?) in
      let made = Locked<RunLoopThread?>(nil)
      let stop = TestGate()
      let isolatedAfter = Locked<Bool?>(nil)
      let exited = TestGate()
      startThread(detached: true) {
        let loop = RunLoopThread.current
        loop.add(LoopTimer(after: .seconds(3600)) { _ in }, to: .default)  // something to watch
        made.withLock { $0 = loop }
        while !stop.opened {
          _ = loop.run(mode: .default, for: .milliseconds(3))
        }
        isolatedAfter.withLock { $0 = loop.isIsolatingCurrentContext() }
        exited.open()
      }
      _ = await pollEveryMillisecond { made.withLock { $0 } != nil }
      guard let loop = made.withLock({ $0 }) else { return (-1, -1, nil) }
      let actor = PinnedSurfaceActor(loop: loop)
      await withTaskGroup(of: Void.self) { group in
        for _ in 0..<8 {
          group.addTask {
            for _ in 0..<20 { await actor.slowCall() }
          }
        }
        group.addTask {
          _ = await pollEveryMillisecond { actor.overlap.inside.current > 0 }
          try? await Task.sleep(for: .milliseconds(5))
          loop.shutdown()
        }
      }
      let calls = await actor.calls
      stop.open()
      _ = await execOnNewThread { exited.wait(timeout: .seconds(10)) }
      return (actor.overlap.most.withLock { $0 }, calls, isolatedAfter.withLock { $0 })
    }
    guard let outcome else { return }
    #expect(outcome.most == 1, "\(outcome.most) calls of the actor overlapped")
    #expect(outcome.calls == 160)
    #expect(outcome.isolatedAfter == false)
  }
}

extension SleepsAndTheDrainTests {
  /// Promised: a `loop.clock` sleep never returns before its deadline, whatever its tolerance;
  /// on a loop that has shut down it throws `CancellationError` at once; in a task cancelled
  /// before it sleeps it throws `CancellationError` without waiting.
  @Test func loopClockSleepsAreNeverEarlyAndEndOnShutdownOrCancellation() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "clock sleeps") {
      () async throws -> (early: Int, dead: Bool, precancelled: Bool) in
      let loop = try RunLoopThread(name: "clock")
      var early = 0
      for index in 0..<20 {
        let deadline = LoopClock.Instant.now.advanced(by: .microseconds(500 + 100 * index))
        try await loop.clock.sleep(until: deadline, tolerance: .milliseconds(index % 3 == 0 ? 0 : 20))
        if LoopClock.Instant.now < deadline { early += 1 }
      }
      let precancelled = await Task { () -> Bool in
        withUnsafeCurrentTask { $0?.cancel() }
        do {
          try await loop.clock.sleep(until: .now.advanced(by: .seconds(60)))
          return false
        } catch { return error is CancellationError }
      }.value
      await execShutdown(loop)
      var dead = false
      do { try await loop.clock.sleep(until: .now.advanced(by: .seconds(60))) } catch {
        dead = error is CancellationError
      }
      return (early, dead, precancelled)
    }
    guard let outcome else { return }
    #expect(outcome.early == 0)
    #expect(outcome.dead)
    #expect(outcome.precancelled)
  }
}
