import Glibc
import Synchronization
import Testing

@_spi(Testing) @testable import AsyncRunLoop

// Acceptance round 3: the executor, modal-run, shutdown and main-thread promises of the public
// API and its doc comments, each attacked with the interleaving that would break it.

/// Counts the jobs of one loop that are on the stack at once (only ever touched on that loop's
/// thread, or on the fallback queue after it terminated): more than one breaks the serial contract.
final class Round3Overlap: Sendable {
  private let state = Locked((current: 0, maximum: 0, total: 0))
  func enter() {
    state.withLock {
      $0.current += 1
      $0.maximum = max($0.maximum, $0.current)
      $0.total += 1
    }
  }
  func leave() { state.withLock { $0.current -= 1 } }
  var maximum: Int { state.withLock { $0.maximum } }
  var total: Int { state.withLock { $0.total } }
}

/// An actor on a loop whose methods record, through a shared `Round3Overlap`, whether a job of the
/// loop started while another one was on the stack.
actor Round3Worker: LoopActor {
  nonisolated let loop: RunLoopThread
  nonisolated let overlap: Round3Overlap
  private(set) var calls = 0

  init(loop: RunLoopThread, overlap: Round3Overlap) {
    self.loop = loop
    self.overlap = overlap
  }

  /// One synchronous job.
  func poke() {
    overlap.enter()
    defer { overlap.leave() }
    loop.checkIsolated()
    calls += 1
  }

  /// A modal run of `mode` from this actor (the actor is suspended, not blocked).
  func modal(_ mode: RunLoopMode, for duration: Duration) async throws(RunLoopError) -> RunLoopRunResult {
    try await loop.runModal(mode: mode, for: duration)
  }

  /// Runs the loop nested inside this job (blocking it): no other job of the loop may start.
  func nestedRun(_ mode: RunLoopMode, for duration: Duration) -> RunLoopRunResult {
    overlap.enter()
    defer { overlap.leave() }
    return loop.run(mode: mode, for: duration)
  }

  /// Sleeps on the loop's clock; returns how it ended and whether it resumed on the loop.
  func sleepOnTheLoopClock(for duration: Duration) async -> (cancelled: Bool, onLoop: Bool) {
    do {
      try await loop.clock.sleep(for: duration)
      return (false, loop.isOnLoopThread)
    } catch {
      return (error is CancellationError, loop.isOnLoopThread)
    }
  }
}

@Suite("AcceptanceRound3Executor: executors, modal runs, shutdown", .timeLimit(.minutes(10)))
struct AcceptanceRound3ExecutorTests {
  // MARK: Serial contract

  /// `runModal` from an actor on the loop: the loop keeps running its jobs during the modal run
  /// (the actor's other calls included), but never two at once.
  @Test func aModalRunFromAnActorRunsOtherJobsButNeverTwoAtOnce() async throws {
    let loop = try RunLoopThread(name: "r3-modal-serial")
    let overlap = Round3Overlap()
    let worker = Round3Worker(loop: loop, overlap: overlap)
    let other = Round3Worker(loop: loop, overlap: overlap)
    let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
    loop.add(keepAlive, to: "r3-modal")
    let outcome = try await withWatchdog(timeout: .seconds(20), "modal run with callers") {
      () async throws -> (RunLoopRunResult, Int) in
      async let modal = worker.modal("r3-modal", for: .milliseconds(100))
      await withTaskGroup(of: Void.self) { group in
        for index in 0..<8 {
          group.addTask {
            for _ in 0..<50 { await (index.isMultiple(of: 2) ? worker : other).poke() }
          }
        }
      }
      let result = try await modal
      return (result, await worker.calls)
    }
    #expect(outcome?.0 == .timedOut)
    #expect(outcome?.1 == 200)
    #expect(overlap.maximum == 1, "two jobs of the loop ran at once")
    keepAlive.invalidate()
    await execShutdown(loop)
  }

  /// A run nested in a job of a task that prefers the loop (not only an actor's) runs no other
  /// job: the `run(mode:…)` doc names both.
  @Test func aRunNestedInATaskPreferringTheLoopRunsNoOtherJob() async throws {
    let loop = try RunLoopThread(name: "r3-pref-nested")
    let overlap = Round3Overlap()
    let worker = Round3Worker(loop: loop, overlap: overlap)
    let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
    loop.add(keepAlive, to: "r3-nested")
    let pokesDuringRun = try await withWatchdog(timeout: .seconds(20), "nested run in a preferring task") {
      () async -> Int in
      let started = TestGate()
      let nested = Task(executorPreference: loop) { () -> Int in
        overlap.enter()
        defer { overlap.leave() }
        started.open()
        loop.run(mode: "r3-nested", for: .milliseconds(60))
        return overlap.total
      }
      _ = await execOnNewThread { started.wait(timeout: .seconds(10)) }
      // Jobs of both roles arrive while the task's job runs the loop nested.
      async let pokes: Void = withTaskGroup(of: Void.self) { group in
        for _ in 0..<10 { group.addTask { await worker.poke() } }
        for _ in 0..<10 {
          group.addTask {
            await withTaskExecutorPreference(loop) {
              overlap.enter()
              overlap.leave()
            }
          }
        }
      }
      let totalAtEndOfNestedRun = await nested.value
      await pokes
      return totalAtEndOfNestedRun
    }
    #expect(pokesDuringRun == 1, "jobs ran inside the nested run: \(String(describing: pokesDuringRun))")
    #expect(overlap.maximum == 1)
    #expect(overlap.total == 21)
    keepAlive.invalidate()
    await execShutdown(loop)
  }

  /// A run nested in an actor's job runs performed blocks, and a `runModal` whose block lands in
  /// it still ends (at its deadline) without starting another job inside the outer one.
  @Test func aModalRunLandingInARunNestedInAJobStartsNoJob() async throws {
    let loop = try RunLoopThread(name: "r3-modal-in-job")
    let overlap = Round3Overlap()
    let blocker = Round3Worker(loop: loop, overlap: overlap)
    let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
    loop.add(keepAlive, to: "r3-outer")
    loop.add(LoopTimer(after: .seconds(3600)) { _ in }, to: "r3-inner")
    let outcome = try await withWatchdog(timeout: .seconds(20), "modal inside a nested job run") {
      () async throws -> (RunLoopRunResult, RunLoopRunResult) in
      async let outer = blocker.nestedRun("r3-outer", for: .milliseconds(150))
      try await Task.sleep(for: .milliseconds(20))
      // The modal block runs on `loop` inside the blocker's nested run.
      let modal = try await loop.runModal(mode: "r3-inner", for: .milliseconds(30))
      await blocker.poke()
      return (await outer, modal)
    }
    #expect(outcome?.0 == .timedOut)
    #expect(outcome?.1 == .timedOut)
    #expect(overlap.maximum == 1, "a job started inside the blocker's job")
    keepAlive.invalidate()
    await execShutdown(loop)
  }

  /// `runModal` from an actor on the loop during another modal run of the same actor nests
  /// inside it: both end at their deadlines, the inner one first, and no two jobs overlap. A
  /// shutdown then ends nested modal runs at every level (`.stopped`), without a hang.
  @Test func nestedModalRunsFromOneActorEndInOrderAndAllStopAtShutdown() async throws {
    let loop = try RunLoopThread(name: "r3-modal-nested")
    let overlap = Round3Overlap()
    let worker = Round3Worker(loop: loop, overlap: overlap)
    loop.add(LoopTimer(after: .seconds(3600)) { _ in }, to: "r3-outer")
    loop.add(LoopTimer(after: .seconds(3600)) { _ in }, to: "r3-inner")
    let order = Locked<[String]>([])
    // The order is taken from the runs' exits on the loop thread: the callers' tasks resume on
    // the shared pool, whose threads other tests may hold for longer than the outer run lasts.
    let innerEntries = Locked(0)
    loop.add(
      LoopObserver(activities: [.entry, .exit]) { _, activity in
        if activity == .entry { innerEntries.withLock { $0 += 1 } } else { order.withLock { $0.append("inner") } }
      }, to: "r3-inner")
    let outerEntries = Locked(0)
    loop.add(
      LoopObserver(activities: [.entry, .exit]) { _, activity in
        if activity == .entry { outerEntries.withLock { $0 += 1 } } else { order.withLock { $0.append("outer") } }
      }, to: "r3-outer")
    let timed = try await withWatchdog(timeout: .seconds(20), "nested modal runs") {
      () async throws -> (RunLoopRunResult, RunLoopRunResult) in
      // The outer run lasts long enough for the inner one to start inside it even on a loaded
      // machine (scaled like the watchdogs), and the inner one starts once the outer one began.
      // (1 s was too short twice: in a fresh-clone CI run and with helpers compiling.)
      async let outer: RunLoopRunResult = {
        try await worker.modal("r3-outer", for: .milliseconds(4000 * watchdogScale))
      }()
      while outerEntries.withLock({ $0 }) < 1 { try await Task.sleep(for: .milliseconds(2)) }
      let inner = try await worker.modal("r3-inner", for: .milliseconds(20))
      await worker.poke()
      return (try await outer, inner)
    }
    #expect(timed?.0 == .timedOut)
    #expect(timed?.1 == .timedOut)
    #expect(order.withLock { $0 } == ["inner", "outer"])
    let stopped = try await withWatchdog(timeout: .seconds(20), "nested modal runs at shutdown") {
      () async throws -> (RunLoopRunResult, RunLoopRunResult) in
      async let outer = worker.modal("r3-outer", for: .seconds(3600))
      try await Task.sleep(for: .milliseconds(10))
      async let inner = worker.modal("r3-inner", for: .seconds(3600))
      // Shut down only once the inner run has begun (a fixed sleep loses that race under load,
      // and a modal run asked for after shutdown throws instead).
      while innerEntries.withLock({ $0 }) < 2 { try await Task.sleep(for: .milliseconds(2)) }
      await execOnNewThread { loop.shutdownAndWait() }
      return (try await outer, try await inner)
    }
    #expect(stopped?.0 == .stopped)
    #expect(stopped?.1 == .stopped)
    #expect(overlap.maximum == 1)
  }

  /// `runModal` from a task that prefers the same loop (its job is on the loop, suspended) runs
  /// the loop's jobs meanwhile, and the task resumes on the loop.
  @Test func runModalFromATaskPreferringTheLoopResumesOnIt() async throws {
    let loop = try RunLoopThread(name: "r3-modal-pref")
    let overlap = Round3Overlap()
    let worker = Round3Worker(loop: loop, overlap: overlap)
    loop.add(LoopTimer(after: .seconds(3600)) { _ in }, to: "r3-modal")
    let outcome = try await withWatchdog(timeout: .seconds(20), "modal run under the preference") {
      () async throws -> (RunLoopRunResult, Bool, Int) in
      async let pokes: Void = execConcurrently(tasks: 2, times: 20) { await worker.poke() }
      let (result, onLoop) = try await withTaskExecutorPreference(loop) {
        () async throws -> (RunLoopRunResult, Bool) in
        let result = try await loop.runModal(mode: "r3-modal", for: .milliseconds(40))
        return (result, loop.isOnLoopThread && RunLoopThread.current === loop)
      }
      await pokes
      return (result, onLoop, await worker.calls)
    }
    #expect(outcome?.0 == .timedOut)
    #expect(outcome?.1 == true)
    #expect(outcome?.2 == 40)
    #expect(overlap.maximum == 1)
    await execShutdown(loop)
  }

  // MARK: Isolation

  /// Nonisolated code running on the loop thread under the loop's preference is on the loop: an
  /// actor on the loop may `assumeIsolated` there, and `checkIsolated` passes.
  @Test func assumeIsolatedOfALoopActorHoldsUnderTheLoopsPreference() async throws {
    let loop = try RunLoopThread(name: "r3-assume-pref")
    let probe = ExecProbe(loop: loop)
    let touched = try await withWatchdog(timeout: .seconds(20), "assumeIsolated under the preference") {
      await withTaskExecutorPreference(loop) { () -> Bool in
        loop.checkIsolated()
        probe.touchWithoutChecking()  // traps off the loop
        return loop.isOnLoopThread
      }
    }
    #expect(touched == true)
    #expect(await probe.hits == ["unchecked"])
    await execShutdown(loop)
  }

  /// On the fallback queue a dead loop's job is isolated to that loop only: another dead loop's
  /// isolation check answers no (a definite false from the loop itself).
  @Test func theFallbackIsIsolatedToTheDeadLoopWhoseJobItRunsOnly() async throws {
    let first = try RunLoopThread(name: "r3-dead-a")
    let second = try RunLoopThread(name: "r3-dead-b")
    await execShutdown(first)
    await execShutdown(second)
    let answers = try await withWatchdog(timeout: .seconds(20), "jobs on the fallback") {
      await withTaskExecutorPreference(first) {
        (first.isIsolatingCurrentContext(), second.isIsolatingCurrentContext(), first.isOnLoopThread)
      }
    }
    #expect(answers?.0 == true)
    #expect(answers?.1 == false)
    #expect(answers?.2 == false)
  }

  // MARK: Sleeping

  /// `LoopClock.sleep` "never wakes early" and throws `CancellationError` only "if the task is
  /// cancelled while sleeping". `LoopClock()` picks the caller's loop only while it is "always
  /// running"; a loop that is shutting down is not: the sleep must not be cut short by it.
  @Test func theImplicitClockIsNotCutShortByTheCallersLoopShuttingDown() async throws {
    let loop = try RunLoopThread(name: "r3-implicit-clock")
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
    let loop = try RunLoopThread(name: "r3-implicit-mid")
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
    let loop = try RunLoopThread(name: "r3-sleep-cancel")
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
    let loop = try RunLoopThread(name: "r3-clock-cancel")
    let worker = Round3Worker(loop: loop, overlap: Round3Overlap())
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

  /// A task preferring a dead loop still sleeps the whole time (`Task.sleep` never returns early)
  /// and stays isolated to the loop (on the fallback).
  @Test func aTaskPreferringADeadLoopSleepsTheWholeTimeAndStaysIsolated() async throws {
    let loop = try RunLoopThread(name: "r3-dead-sleep")
    await execShutdown(loop)
    let outcome = try await withWatchdog(timeout: .seconds(20), "sleep on a dead loop") {
      () async throws -> (Duration, Bool) in
      try await withTaskExecutorPreference(loop) { () async throws -> (Duration, Bool) in
        let begin = ContinuousClock.now
        try await Task.sleep(for: .milliseconds(20))
        try await Task.sleep(until: .now + .milliseconds(5), clock: .suspending)
        return (ContinuousClock.now - begin, loop.isIsolatingCurrentContext() == true)
      }
    }
    #expect(outcome.map { $0.0 >= .milliseconds(25) } == true, "slept \(String(describing: outcome?.0))")
    #expect(outcome?.1 == true)
  }

  // MARK: Modal runs and shutdown

  /// Shutting the loop down during a modal run ends it (`.stopped`, every run stops during
  /// shutdown); it does not hang and does not throw (the run was not refused).
  @Test func shutdownDuringAModalRunEndsIt() async throws {
    let loop = try RunLoopThread(name: "r3-modal-shutdown")
    loop.add(LoopTimer(after: .seconds(3600)) { _ in }, to: "r3-modal")
    let outcome = try await withWatchdog(timeout: .seconds(20), "modal run at shutdown") {
      () async -> Result<RunLoopRunResult, RunLoopError> in
      let modal = Task { () async -> Result<RunLoopRunResult, RunLoopError> in
        do throws(RunLoopError) {
          return .success(try await loop.runModal(mode: "r3-modal"))
        } catch {
          return .failure(error)
        }
      }
      try? await Task.sleep(for: .milliseconds(20))
      await execOnNewThread { loop.shutdownAndWait() }
      return await modal.value
    }
    #expect(outcome == .success(.stopped))
  }

  /// A modal run accepted before shutdown whose block only gets to run in the drain returns (no
  /// hang, no throw).
  @Test func aModalRunAcceptedBeforeShutdownReturnsFromTheDrain() async throws {
    let loop = try RunLoopThread(name: "r3-modal-drain")
    loop.add(LoopTimer(after: .seconds(3600)) { _ in }, to: "r3-modal")
    let release = TestGate()
    let busy = TestGate()
    loop.perform {
      busy.open()
      release.wait(timeout: .seconds(20))
    }
    busy.wait(timeout: .seconds(20))
    let outcome = try await withWatchdog(timeout: .seconds(20), "modal run drained") {
      () async -> Result<RunLoopRunResult, RunLoopError> in
      let modal = Task { () async -> Result<RunLoopRunResult, RunLoopError> in
        do throws(RunLoopError) {
          return .success(try await loop.runModal(mode: "r3-modal"))
        } catch {
          return .failure(error)
        }
      }
      try? await Task.sleep(for: .milliseconds(20))  // the modal block is queued behind the busy one
      loop.shutdown()
      release.open()
      return await modal.value
    }
    switch outcome {
    case .success(let result)?: #expect(result == .stopped || result == .finished, "\(result)")
    case .failure(let error)?: Issue.record("a modal run accepted before the shutdown threw \(error)")
    case nil: break
    }
    await execShutdown(loop)
  }

  /// A task already cancelled when it calls `runModal` (no deadline) gets `.stopped` at once.
  @Test func runModalFromACancelledTaskEndsAtOnce() async throws {
    let loop = try RunLoopThread(name: "r3-modal-precancelled")
    loop.add(LoopTimer(after: .seconds(3600)) { _ in }, to: "r3-modal")
    let outcome = try await withWatchdog(timeout: .seconds(20), "pre-cancelled modal run") {
      let task = Task { () async throws -> RunLoopRunResult in
        withUnsafeCurrentTask { $0?.cancel() }
        return try await loop.runModal(mode: "r3-modal")
      }
      return try await task.value
    }
    #expect(outcome == .stopped)
    await execShutdown(loop)
  }

  // MARK: Shutdown from everywhere

  /// Concurrent `shutdown()`/`shutdownAndWait()` from many threads, from inside a job and from a
  /// block the drain runs: all return, and every accepted job ran.
  @Test func shutdownFromManyThreadsJobsAndDrainedBlocksAllReturn() async throws {
    let loop = try RunLoopThread(name: "r3-shutdown-everywhere")
    let overlap = Round3Overlap()
    let worker = Round3Worker(loop: loop, overlap: overlap)
    let drainedBlockRan = Locked(false)
    loop.perform(inModes: ["r3-never-run"]) {
      loop.shutdownAndWait()  // on the loop thread, during the drain: only (re)starts the shutdown
      drainedBlockRan.withLock { $0 = true }
    }
    let source = InputSource(cancel: { _, _ in loop.shutdownAndWait() }) { _ in }
    loop.add(source)
    let finished = try await withWatchdog(timeout: .seconds(30), "shutdowns everywhere") { () async -> Int in
      async let calls: Void = execConcurrently(tasks: 4, times: 100) { await worker.poke() }
      async let fromJob: Void = withTaskExecutorPreference(loop) { loop.shutdownAndWait() }
      await execOnNewThread {
        race([
          { loop.shutdownAndWait() }, { loop.shutdown() }, { loop.shutdownAndWait() }, { loop.shutdownAndWait() },
        ])
      }
      await fromJob
      await calls
      return await worker.calls
    }
    #expect(finished == 400)
    #expect(drainedBlockRan.withLock { $0 })
    #expect(overlap.maximum == 1)
    #expect(loop.isShutDown)
  }

  /// `shutdownAndWait()` of a loop that does not own its thread (`RunLoopThread.current`) has no
  /// thread to join: it starts the shutdown and returns at once, without waiting for that thread
  /// (which may live on); the run in progress ends, and the thread drains the loop when it exits —
  /// the block accepted before the shutdown runs then, on that thread.
  @Test func shutdownAndWaitOfACurrentLoopEndsItsRunAndItsThreadDrainsItOnExit() async throws {
    let published = Locked<RunLoopThread?>(nil)
    let drainedOn = Locked<pthread_t?>(nil)
    let runResult = Locked<RunLoopRunResult?>(nil)
    let exit = TestGate()
    let threadDone = TestGate()
    let thread = ExecThread {
      let loop = RunLoopThread.current
      loop.add(InputSource { _ in })  // keeps the default mode alive
      loop.perform(inModes: ["r3-never-run"]) { drainedOn.withLock { $0 = pthread_self() } }
      published.withLock { $0 = loop }
      // No deadline that a loaded machine could reach before the shutdown does (the test's
      // waits bound it instead).
      let result = loop.run(mode: .default, for: .seconds(3600))
      runResult.withLock { $0 = result }
      exit.wait(timeout: .seconds(20))  // the thread lives on after its run ended
      threadDone.open()
    }
    let loop = try #require(
      await execOnNewThread { () -> RunLoopThread? in
        while published.withLock({ $0 }) == nil { usleep(500) }
        return published.withLock { $0 }
      })
    let returned = try await withWatchdogOnThread(timeout: .seconds(20), "shutdownAndWait") {
      loop.shutdownAndWait()  // must not wait for the thread, which waits for `exit`
      return true
    }
    #expect(returned == true)
    #expect(loop.isShutDown)
    waitUntil("the run to end") { runResult.withLock { $0 } != nil }
    #expect(runResult.withLock { $0 } == .stopped)
    #expect(drainedOn.withLock { $0 } == nil, "drained before the thread exited")
    exit.open()
    threadDone.wait(timeout: .seconds(20))
    thread.join()
    waitUntil("the drain at thread exit") { drainedOn.withLock { $0 } != nil }
  }

  /// A shut-down loop that does not own its thread, whose thread lives on without running it:
  /// a job enqueued then is not lost — and must not hang for as long as the thread lives
  /// (`enqueue`: after the loop terminated the job runs on the fallback queue).
  @Test func aJobForAShutDownCurrentLoopWhoseThreadLivesOnDoesNotHang() async throws {
    let published = Locked<RunLoopThread?>(nil)
    let exit = TestGate()
    let exited = Locked(false)
    ExecThread {
      let loop = RunLoopThread.current
      published.withLock { $0 = loop }
      exit.wait(timeout: .seconds(120))  // lives on (until the test ends), never running the loop again
      exited.withLock { $0 = true }
    }.detach()
    defer { exit.open() }
    let loop = try #require(
      await execOnNewThread { () -> RunLoopThread? in
        while published.withLock({ $0 }) == nil { usleep(500) }
        return published.withLock { $0 }
      })
    loop.shutdown()
    let outcome = try await withWatchdog(timeout: .seconds(20), "a job for a shut-down current loop") {
      await withTaskExecutorPreference(loop) { (loop.isIsolatingCurrentContext() == true, exited.withLock { $0 }) }
    }
    #expect(outcome?.0 == true)
    #expect(outcome?.1 == false, "the job waited until the loop's thread exited")
  }

  // MARK: Inline forms

  /// `performAndWait` from a job on the loop (an actor, a task preferring it) runs inline.
  @Test func performAndWaitFromAJobOnTheLoopRunsInline() async throws {
    let loop = try RunLoopThread(name: "r3-paw-inline")
    let outcome = try await withWatchdog(timeout: .seconds(20), "performAndWait inline") {
      try await withTaskExecutorPreference(loop) { () throws -> Bool in
        let inline = Locked(false)
        try loop.performAndWait { inline.withLock { $0 = true } }
        return inline.withLock { $0 }  // set before performAndWait returned: it ran inline
      }
    }
    #expect(outcome == true)
    await execShutdown(loop)
  }
}

/// The main-thread promises, in a real process whose main thread runs the main loop (the
/// `MainLoopFixture` scenarios named `round3-…`; see `MainLoopProcessTests`).
@Suite("AcceptanceRound3Executor: the main loop in a real process", .serialized)
struct AcceptanceRound3ExecutorMainLoopTests {
  /// A `@MainActor` job or main-queue block that runs the main loop nested has no other main-actor
  /// job start inside it, and the nested run does not spin on the main queue's wake-up.
  @Test func noMainActorJobStartsInsideAnotherThatRunsTheLoopNested() throws {
    try expectScenarioPasses("round3-main-actor-nested-run")
  }

  /// `runModal` from `@MainActor` code leaves the main actor free for other work, and cancelling
  /// the task ends the modal run with `.stopped`.
  @Test func aModalRunFromTheMainActorLetsMainActorWorkRunAndEndsOnCancellation() throws {
    try expectScenarioPasses("round3-main-actor-modal")
  }

  /// In a mode outside the common set a modal run from `@MainActor` code does not serve the main
  /// queue (other main-actor work waits until it ends); in a common mode it does.
  @Test func aModalRunFromTheMainActorServesMainActorWorkOnlyInACommonMode() throws {
    try expectScenarioPasses("round3-main-actor-private-modal")
  }

  /// `RunLoopThread.main.shutdownAndWait()` from another thread returns; late jobs of an actor on
  /// the main loop run on the fallback, isolated.
  @Test func lateJobsOfAnActorOnTheShutDownMainLoopRunOnTheFallback() throws {
    try expectScenarioPasses("round3-main-shutdown-late-jobs")
  }

}
