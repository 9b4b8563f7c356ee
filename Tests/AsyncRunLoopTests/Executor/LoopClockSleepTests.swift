import Glibc
import Synchronization
import Testing

@_spi(Testing) @testable import AsyncRunLoop

/// Sleeps end on time, on the right executor, and never hang on a loop that ends.
@Suite(
  "Sleeps end on time, on the right executor, and never hang on a loop that ends", .serialized, .timeLimit(.minutes(10))
)
struct LoopClockSleepTests {
  /// `LoopClock.sleep` "never wakes early" and throws `CancellationError` only "if the task is
  /// cancelled while sleeping". `LoopClock()` picks the caller's loop only while it is "always
  /// running"; a loop that is shutting down is not: the sleep must not be cut short by it.
  @Test func theImplicitClockIsNotCutShortByTheCallersLoopShuttingDown() async throws {
    let loop = try RunLoopThread(name: "implicit-clock")
    let outcome = try await withWatchdog(timeout: .seconds(20), "implicit clock sleep") {
      // Under the loop's preference `LoopClock.sleep` (nonisolated async) runs on the loop's
      // thread, so the implicit clock picks that loop.
      await withTaskExecutorPreference(loop) { () async -> (Result<Void, any Error>, Duration, Bool) in
        let onLoop = loop.isOnLoopThread
        loop.shutdown()
        let begin = ContinuousClock.now
        do {
          try await LoopClock().sleep(for: .milliseconds(30))
          return (.success(()), ContinuousClock.now - begin, onLoop)
        } catch {
          return (.failure(error), ContinuousClock.now - begin, onLoop)
        }
      }
    }
    guard let (result, slept, onLoop) = outcome else { return }
    #expect(onLoop)
    if case .failure(let error) = result {
      Issue.record("the sleep of an uncancelled task threw \(error) after \(slept)")
    }
    #expect(slept >= .milliseconds(30), "the sleep ended after \(slept)")
    await execShutdown(loop)
  }

  /// The same when the caller's loop shuts down during the sleep; cancelling the task still ends
  /// the sleep with `CancellationError`.
  @Test func theImplicitClockOutlivesTheCallersLoopShuttingDownMidSleepButNotCancellation() async throws {
    let loop = try RunLoopThread(name: "implicit-mid")
    let outcome = try await withWatchdog(timeout: .seconds(20), "implicit clock sleeps") {
      () async -> (Result<Void, any Error>, Duration, Result<Void, any Error>) in
      let cancelled = Task(executorPreference: loop) { () async -> Result<Void, any Error> in
        do {
          try await LoopClock().sleep(for: .seconds(3600))
          return .success(())
        } catch {
          return .failure(error)
        }
      }
      let (result, slept) = await withTaskExecutorPreference(loop) { () async -> (Result<Void, any Error>, Duration) in
        let begin = ContinuousClock.now
        let stopper = ExecThread {
          usleep(10_000)
          cancelled.cancel()
          loop.shutdown()
        }
        defer { stopper.join() }
        do {
          try await LoopClock().sleep(for: .milliseconds(40))
          return (.success(()), ContinuousClock.now - begin)
        } catch {
          return (.failure(error), ContinuousClock.now - begin)
        }
      }
      return (result, slept, await cancelled.value)
    }
    guard let (result, slept, cancelledResult) = outcome else { return }
    if case .failure(let error) = result {
      Issue.record("the sleep of an uncancelled task threw \(error) after \(slept)")
    }
    #expect(slept >= .milliseconds(40), "the sleep ended after \(slept)")
    if case .failure(let error) = cancelledResult {
      #expect(error is CancellationError, "\(error)")
    } else {
      Issue.record("the cancelled sleep returned normally")
    }
    await execShutdown(loop)
  }

  /// Cancelling a long `Task.sleep` under the loop's preference ends it promptly with
  /// `CancellationError` (the job waiting on the loop's timer does not keep the task).
  @Test func cancellingALongTaskSleepUnderTheLoopsPreferenceEndsIt() async throws {
    let loop = try RunLoopThread(name: "sleep-cancel")
    let before = loop.scheduledJobCount
    let outcome = try await withWatchdog(timeout: .seconds(20), "cancelled Task.sleep") { () async -> Bool in
      let sleeper = Task(executorPreference: loop) { () async -> Bool in
        do {
          try await Task.sleep(for: .seconds(3600))
          return false
        } catch {
          return error is CancellationError && loop.isOnLoopThread
        }
      }
      await execOnNewThread { while loop.scheduledJobCount == before { usleep(200) } }
      sleeper.cancel()
      return await sleeper.value
    }
    #expect(outcome == true)
    await execShutdown(loop)
  }

  /// Cancelling an actor's `loop.clock` sleep throws `CancellationError`, and the actor resumes on
  /// its loop.
  @Test func cancellingALoopClockSleepInAnActorThrowsOnTheLoop() async throws {
    let loop = try RunLoopThread(name: "clock-cancel")
    let worker = SerialCheckingWorker(loop: loop, overlap: JobOverlapCounter())
    let outcome = try await withWatchdog(timeout: .seconds(20), "cancelled clock sleep") {
      let sleeper = Task { await worker.sleepOnTheLoopClock(for: .seconds(3600)) }
      try await Task.sleep(for: .milliseconds(10))
      sleeper.cancel()
      return await sleeper.value
    }
    #expect(outcome?.cancelled == true)
    #expect(outcome?.onLoop == true)
    await execShutdown(loop)
  }

  /// A current loop's thread runs a task that sleeps, then the task is cancelled and ends. The
  /// runtime keeps the sleep's wake-up scheduled on the loop until its deadline (as on every
  /// executor: it does not withdraw it), so the thread's outermost run of an empty mode finishes
  /// only once that wake-up has fired (documented in the DocC article, step 9), not at once and
  /// not never. A run nested in it finishes at once all along.
  @Test func aCancelledSleepKeepsACurrentLoopsOutermostRunOnlyUntilItsDeadline() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "cancelled sleep") {
      () -> (ended: Bool, nested: RunLoopRunResult?, result: RunLoopRunResult, timers: Int) in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep)
      let ended = TestGate()
      let before = loop.scheduledJobCount
      let sleeper = Task(executorPreference: loop) {
        try? await Task.sleep(for: .seconds(1))
        ended.open()
      }
      let deadline = ContinuousClock.now.advanced(by: .seconds(5))
      while loop.scheduledJobCount == before && ContinuousClock.now < deadline {
        _ = loop.run(until: .now.advanced(by: .milliseconds(1)))
      }
      sleeper.cancel()
      while !ended.opened && ContinuousClock.now < deadline {
        _ = loop.run(until: .now.advanced(by: .milliseconds(1)))
      }
      keep.invalidate()
      let nested = Locked<RunLoopRunResult?>(nil)
      loop.perform {
        nested.withLock { $0 = loop.run(mode: orderModeEmpty, until: .now.advanced(by: .seconds(10))) }
      }
      // Runs until the wake-up (due a second after the sleep began) fires, then finishes.
      let result = loop.run(until: .now.advanced(by: .seconds(10)))
      return (ended.opened, nested.withLock { $0 }, result, loop.core.modeTable.everyModeContents?.timerCount ?? 0)
    }
    #expect(outcome?.ended == true)
    #expect(outcome?.nested == .finished)
    #expect(outcome?.result == .finished, "every-mode timers left: \(outcome?.timers ?? -1)")
  }

  @Test func sleepsOnACurrentLoopThatStopsRunningEndAfterItsShutdown() async throws {
    let early = AtomicCounter()
    let slept = AtomicCounter()
    let cancelled = AtomicCounter()
    let started = AtomicCounter()
    let release = TestGate()
    let loopBox = Guarded<RunLoopThread?>(nil)
    var tasks: [Task<Void, Never>] = []
    let thread = startThread(detached: true) {
      let loop = RunLoopThread.current
      loopBox.withLock { $0 = loop }
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep)
      let deadline = ContinuousClock.now.advanced(by: .seconds(5))
      while started.current < 20 && ContinuousClock.now < deadline {
        _ = loop.run(until: .now.advanced(by: .milliseconds(1)))
      }
      _ = release.wait(timeout: .seconds(20))  // out of any run from now on
      keep.invalidate()
    }
    _ = thread
    let loop = await execOnNewThread { () -> RunLoopThread in
      while loopBox.snapshot == nil { usleep(200) }
      return loopBox.snapshot!
    }
    for index in 0..<20 {
      tasks.append(
        Task(executorPreference: loop) {
          started.increment()
          let start = ContinuousClock.now
          let delay = Duration.milliseconds(30 + index)
          if index % 2 == 0 {
            do {
              try await Task.sleep(for: delay)
              if ContinuousClock.now - start < delay { early.increment() }
              slept.increment()
            } catch {}
          } else {
            do { try await loop.clock.sleep(for: .seconds(30)) } catch is CancellationError {
              cancelled.increment()
            } catch {}
          }
        })
    }
    _ = await execOnNewThread {
      waitUntil(timeout: .seconds(5), "the tasks started") { started.current == 20 }
      usleep(2_000)
      loop.shutdown()
    }
    let all = tasks
    let done: Void? = try await withWatchdog(timeout: .seconds(20), "sleepers of a shut-down current loop") {
      for task in all { await task.value }
    }
    release.open()
    #expect(done != nil)
    #expect(slept.current == 10)
    #expect(cancelled.current == 10)
    #expect(early.current == 0)
  }

  /// A loop shut down and released with a cancelled hour-long `Task.sleep` pending on it gives its
  /// descriptors back, as one without does (checked first), instead of keeping the whole loop
  /// alive until the hour is over. The descriptors are its poller's, closed in the poller's
  /// `deinit`: the test watches the poller (the process's descriptor count also moves with the
  /// tests running alongside).
  @Test
  func aShutDownLoopWithAPendingSleepReleasesItsDescriptors() async throws {
    func pollerReleased(sleeping: Bool) async throws -> Bool {
      weak var weakPoller: EpollPoller?
      do {
        let loop = try RunLoopThread(name: "fds")
        weakPoller = loop.shared.poller
        if sleeping {
          let before = loop.scheduledJobCount
          let sleeper = Task(executorPreference: loop) { try? await Task.sleep(for: .seconds(3600)) }
          _ = await execOnNewThread {
            waitUntil(timeout: .seconds(5), "the sleep scheduled") { loop.scheduledJobCount > before }
          }
          sleeper.cancel()
          await sleeper.value
        }
        await execShutdown(loop)
      }
      let poller = UncheckedSendableBox({ weakPoller == nil })
      return await execOnNewThread {
        let deadline = ContinuousClock.now.advanced(by: .seconds(2 * watchdogScale))
        while !poller.value() && ContinuousClock.now < deadline { usleep(1_000) }
        return poller.value()
      }
    }
    let withoutSleep = try await pollerReleased(sleeping: false)
    let withSleep = try await pollerReleased(sleeping: true)
    #expect(withoutSleep, "control: a plain loop kept its poller")
    #expect(withSleep, "a loop with a cancelled pending sleep kept its poller (and descriptors)")
  }

  /// A loop-preferring task's sleep ends during a modal run of another mode (the every-mode timer
  /// fires there): its `stop()` ends the modal run, long before the modal run's limit.
  @Test func aSleepEndsDuringAModalRunAndStopsIt() async throws {
    let loop = try RunLoopThread(name: "modal")
    let keep = LoopTimer(after: .seconds(3600)) { _ in }
    loop.add(keep, to: orderModeModal)
    let result = try await withWatchdog(timeout: .seconds(20), "modal run") { () -> RunLoopRunResult in
      let sleeper = Task(executorPreference: loop) {
        try? await Task.sleep(for: .milliseconds(20))
        loop.stop()
      }
      let result = try await loop.runModal(mode: orderModeModal, for: .seconds(10))
      await sleeper.value
      return result
    }
    keep.invalidate()
    await execShutdown(loop)
    #expect(result == .stopped)
  }

  /// Sleeps pending on a loop that shuts down: none hangs and none ends early (they wait for their
  /// deadline elsewhere); a `LoopClock` sleep on the loop ends with a visible `CancellationError`.
  @Test func sleepsPendingAtShutdownEndNeitherHungNorEarly() async throws {
    let loop = try RunLoopThread(name: "sleeps")
    let early = AtomicCounter()
    let finished = AtomicCounter()
    let clockErrors = AtomicCounter()
    var tasks: [Task<Void, Never>] = []
    for index in 0..<40 {
      tasks.append(
        Task(executorPreference: loop) {
          let start = ContinuousClock.now
          let delay = Duration.milliseconds(5 + index % 20)
          do {
            try await Task.sleep(for: delay)
            if ContinuousClock.now - start < delay { early.increment() }
          } catch {}
          finished.increment()
        })
    }
    let clockSleeper = Task {
      do { try await loop.clock.sleep(for: .seconds(30)) } catch is CancellationError { clockErrors.increment() } catch
      {}
    }
    _ = await execOnNewThread { usleep(2_000) }
    await execShutdown(loop)
    let all = tasks
    let done: Void? = try await withWatchdog(timeout: .seconds(20), "sleepers after shutdown") {
      for task in all { await task.value }
      await clockSleeper.value
    }
    #expect(done != nil)
    #expect(finished.current == 40)
    #expect(early.current == 0)
    #expect(clockErrors.current == 1)
  }

  /// A current loop's outermost run of an empty mode stays for a task sleeping on it and ends
  /// once the sleep has ended (finished); the sleep is never early.
  @Test func aCurrentLoopsOutermostEmptyRunServesItsSleeperThenFinishes() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(10), "current loop sleeper") {
      () -> (RunLoopRunResult, Bool, Bool) in
      let loop = RunLoopThread.current
      let start = LoopClock.Instant.now
      let woke = Locked<LoopClock.Instant?>(nil)
      let onLoop = Locked(false)
      let task = Task(executorPreference: loop) {
        try? await Task.sleep(for: .milliseconds(50))
        woke.withLock { $0 = .now }
        onLoop.withLock { $0 = loop.isOnLoopThread }
      }
      let result = loop.run(mode: silencedEmptyMode, until: .now.advanced(by: .seconds(5)))
      _ = task
      let early = woke.withLock { $0 }.map { start.duration(to: $0) < .milliseconds(50) } ?? true
      loop.shutdown()
      return (result, early, onLoop.withLock { $0 })
    }
    #expect(outcome?.0 == .finished)
    #expect(outcome?.1 == false)
    #expect(outcome?.2 == true)
  }

  /// A loop shut down and dropped while a task that prefers it sleeps: the sleep ends no earlier
  /// than its deadline and the task finishes.
  @Test func aSleepOnALoopShutDownAndDroppedEndsOnTimeAndTheTaskFinishes() async throws {
    let start = LoopClock.Instant.now
    var loop: RunLoopThread? = try RunLoopThread(name: "late")
    let task = Task(executorPreference: loop) { () -> LoopClock.Instant in
      try? await Task.sleep(for: .milliseconds(150))
      return .now
    }
    try await Task.sleep(for: .milliseconds(20))
    loop?.shutdownAndWait()
    loop = nil
    let woke = try await withWatchdog(timeout: .seconds(30), "late sleeper") { await task.value }
    #expect(woke.map { start.duration(to: $0) >= .milliseconds(150) } == true)
  }

  /// An actor on a loop sleeping with `LoopClock()` while the loop shuts down: the sleep goes on
  /// elsewhere, never ends early, does not throw, and the method finishes.
  @Test func loopClockInAnActorWhoseLoopShutsDownMidSleepEndsOnTime() async throws {
    let loop = try RunLoopThread(name: "clock")
    let sleeper = LoopClockSleepingActor(loop: loop)
    let start = LoopClock.Instant.now
    let slept = Task { try await sleeper.sleep(.milliseconds(120)) }
    try await Task.sleep(for: .milliseconds(30))
    loop.shutdownAndWait()
    let ended = try await withWatchdog(timeout: .seconds(30), "LoopClock sleep in an actor") {
      try await slept.value
    }
    #expect(ended.map { start.duration(to: $0) >= .milliseconds(120) } == true)
  }

  /// `LoopClock().sleep(for:)` in an actor on a loop sleeps on that loop's timers and ends on the
  /// loop's thread.
  @Test func loopClockInAnActorSleepsOnTheActorsLoop() async throws {
    let loop = try RunLoopThread(name: "clock2")
    let sleeper = LoopClockSleepingActor(loop: loop)
    let (timersDuring, onLoop) =
      try await withWatchdog(timeout: .seconds(30), "actor sleep") {
        try await sleeper.sleepCountingTimers()
      } ?? (0, false)
    #expect(timersDuring >= 1)
    #expect(onLoop)
    loop.shutdownAndWait()
  }

  /// A loop shut down and dropped while a loop-preferring task still sleeps (not cancelled): the
  /// sleeper wakes no earlier than its deadline (on the fallback), and once it has, nothing holds
  /// the loop: its descriptors are released. (Until then the sleeping task itself holds the loop,
  /// its executor preference, and with it the descriptors.)
  /// (The descriptors are the poller's, closed in its `deinit`: the test watches the poller
  /// itself, since the process's descriptor count also moves with the tests running alongside.)
  @Test func aDroppedLoopWithAnUncancelledSleeperIsReleasedOnceTheSleeperWoke() async throws {
    let start = LoopClock.Instant.now
    var loop: RunLoopThread? = try RunLoopThread(name: "fds")
    weak let weakLoop = loop
    weak let weakPoller = loop?.shared.poller
    let before = loop?.scheduledJobCount ?? 0
    let sleeper = Task(executorPreference: loop) { () -> LoopClock.Instant in
      try? await Task.sleep(for: .milliseconds(300))
      return .now
    }
    _ = await execOnNewThread {
      waitUntil(timeout: .seconds(5), "the sleep scheduled") { (weakLoop?.scheduledJobCount ?? 0) > before }
    }
    if let loop { await execShutdown(loop) }
    loop = nil
    let woke = try await withWatchdog(timeout: .seconds(30), "sleeper") { await sleeper.value }
    let released = await execOnNewThread { () -> Bool in
      waitUntil(timeout: .seconds(5), "the loop and its poller released") { weakLoop == nil && weakPoller == nil }
    }
    #expect(woke.map { start.duration(to: $0) >= .milliseconds(300) } == true)
    #expect(released)
  }

  /// A current loop's thread starts a loop-preferring task that sleeps, runs its loop until the
  /// sleep is scheduled, and exits without running it again: the sleep ends (no earlier than its
  /// deadline) and the task finishes.
  @Test func aSleepOnACurrentLoopWhoseThreadExitedEndsOnTime() async throws {
    let start = LoopClock.Instant.now
    let task = Locked<Task<LoopClock.Instant, Never>?>(nil)
    let thread = startThread {
      let loop = RunLoopThread.current
      let before = loop.scheduledJobCount
      task.withLock {
        $0 = Task(executorPreference: loop) { () -> LoopClock.Instant in
          try? await Task.sleep(for: .milliseconds(100))
          return .now
        }
      }
      let deadline = ContinuousClock.now.advanced(by: .seconds(5))
      while loop.scheduledJobCount == before && ContinuousClock.now < deadline {
        _ = loop.run(until: .now.advanced(by: .milliseconds(1)))
      }
    }
    joinThread(thread)
    guard let sleeper = task.withLock({ $0 }) else {
      Issue.record("no task")
      return
    }
    let woke = try await withWatchdog(timeout: .seconds(30), "current-loop sleeper") { await sleeper.value }
    #expect(woke.map { start.duration(to: $0) >= .milliseconds(100) } == true)
  }

  /// `LoopClock().sleep(for:)` in a task that prefers a current loop (not an owned one): it sleeps
  /// on the shared timer loop and resumes on the current loop's thread while that thread runs it,
  /// no earlier than its deadline.
  @Test func loopClockInATaskPreferringACurrentLoopResumesOnThatLoop() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(10), "LoopClock on a current loop") {
      () -> (Bool, Bool) in
      let loop = RunLoopThread.current
      let start = LoopClock.Instant.now
      let result = Locked<(Bool, Bool)?>(nil)
      let task = Task(executorPreference: loop) {
        try? await LoopClock().sleep(for: .milliseconds(40))
        result.withLock { $0 = (start.duration(to: .now) >= .milliseconds(40), loop.isOnLoopThread) }
      }
      let deadline = ContinuousClock.now.advanced(by: .seconds(5))
      while result.withLock({ $0 }) == nil && ContinuousClock.now < deadline {
        _ = loop.run(until: .now.advanced(by: .milliseconds(5)))
      }
      _ = task
      loop.shutdown()
      return result.withLock { $0 } ?? (false, false)
    }
    #expect(outcome?.0 == true)
    #expect(outcome?.1 == true)
  }
}
