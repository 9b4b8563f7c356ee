import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

/// Exactly one thread at a time counts as isolated to a loop, the fallback included.
@Suite("Exactly one thread at a time counts as isolated to a loop, the fallback included", .timeLimit(.minutes(10)))
struct IsolationIsExactTests: PassTestModes {
  /// `runModal` from a task that prefers the same loop (its job is on the loop, suspended) runs
  /// the loop's jobs meanwhile, and the task resumes on the loop.
  @Test func runModalFromATaskPreferringTheLoopResumesOnIt() async throws {
    let loop = try RunLoopThread(name: "modal-pref")
    let overlap = JobOverlapCounter()
    let worker = SerialCheckingWorker(loop: loop, overlap: overlap)
    loop.add(LoopTimer(after: .seconds(3600)) { _ in }, to: "modal")
    let outcome = try await withWatchdog(timeout: .seconds(20), "modal run under the preference") {
      () async throws -> (RunLoopRunResult, Bool, Int) in
      async let pokes: Void = execConcurrently(tasks: 2, times: 20) { await worker.poke() }
      let (result, onLoop) = try await withTaskExecutorPreference(loop) {
        () async throws -> (RunLoopRunResult, Bool) in
        let result = try await loop.runModal(mode: "modal", for: .milliseconds(40))
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

  /// Nonisolated code running on the loop thread under the loop's preference is on the loop: an
  /// actor on the loop may `assumeIsolated` there, and `checkIsolated` passes.
  @Test func assumeIsolatedOfALoopActorHoldsUnderTheLoopsPreference() async throws {
    let loop = try RunLoopThread(name: "assume-pref")
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
    let first = try RunLoopThread(name: "dead-a")
    let second = try RunLoopThread(name: "dead-b")
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

  /// A task preferring a dead loop still sleeps the whole time (`Task.sleep` never returns early)
  /// and stays isolated to the loop (on the fallback).
  @Test func aTaskPreferringADeadLoopSleepsTheWholeTimeAndStaysIsolated() async throws {
    let loop = try RunLoopThread(name: "dead-sleep")
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

  /// Once a current loop's jobs run on the fallback, its thread must not also count as isolated
  /// to the loop while one of those jobs runs: the README promises `assumeIsolated` in performed
  /// blocks and callouts on the loop, so a block the thread runs at its exit drain (or an
  /// observer told in a run entered after the shutdown, or the thread's own code) would touch an
  /// actor's state while the actor's job runs on the fallback.
  @Test func theThreadAndTheFallbackNeverBothClaimIsolation() async throws {
    let thread = CommandedCurrentLoopThread()
    let loop = await thread.loop()
    let actor = OverlapRecordingActor(loop: loop)
    let fromDrainBlock = Guarded<(isolated: Bool, jobRunning: Bool)?>(nil)
    let accepted = loop.perform(inModes: [modeNever]) {
      fromDrainBlock.withLock { $0 = (loop.isIsolatingCurrentContext() == true, actor.inJob.snapshot) }
    }
    #expect(accepted)
    loop.shutdown()
    let entered = TestGate()
    let release = TestGate()
    let holder = Task { await actor.hold(entered: entered, release: release) }
    #expect(await execOnNewThread { entered.wait(timeout: .seconds(20) * watchdogScale) })
    // The thread's own code, out of a run.
    let plain = await thread.exec { loop in (loop.isIsolatingCurrentContext() == true, actor.inJob.snapshot) }
    // An observer told in a run the thread enters after the shutdown.
    let observed = await thread.exec { loop -> (isolated: Bool, jobRunning: Bool, told: Int) in
      let seen = Guarded<(Bool, Bool, Int)>((false, false, 0))
      let observer = LoopObserver(activities: .all) { _, _ in
        seen.withLock {
          $0 = ($0.0 || loop.isIsolatingCurrentContext() == true, $0.1 || actor.inJob.snapshot, $0.2 + 1)
        }
      }
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(observer)
      loop.add(keepAlive)
      _ = loop.run(for: .seconds(5))
      observer.invalidate()
      keepAlive.invalidate()
      return seen.snapshot
    }
    thread.quit()
    _ = await execOnNewThread {
      waitUntil(timeout: .seconds(20), "the drain's block") { fromDrainBlock.snapshot != nil }
    }
    release.open()
    #expect(await holder.value == false, "the held job ran on the loop's thread")
    #expect(!(plain.0 && plain.1), "the thread's own code claims isolation while a fallback job runs")
    #expect(observed.told == 0 || !(observed.isolated && observed.jobRunning), "an observer callout claims isolation")
    let drain = fromDrainBlock.snapshot
    #expect(drain != nil)
    if let drain { #expect(!(drain.isolated && drain.jobRunning), "a drain block claims isolation") }
  }

  /// A modal run asked by an actor on the current loop, ended by a shutdown from another thread:
  /// it returns `.stopped`, the actor goes on (on the fallback), and calls made meanwhile and
  /// afterwards all complete, one at a time.
  @Test func aModalRunEndedByShutdownLetsTheActorGoOnOnTheFallback() async throws {
    let thread = CommandedCurrentLoopThread()
    let loop = await thread.loop()
    let overlap = JobOverlapCounter()
    let actor = OverlapRecordingActor(loop: loop, overlap: overlap)
    let mode = modeM
    let inModal = TestGate()
    let outerResult = Guarded<RunLoopRunResult?>(nil)
    thread.send { loop in
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      let marker = LoopObserver(activities: .beforeWaiting) { _, _ in inModal.open() }
      loop.add(keepAlive)
      loop.add(keepAlive, to: mode)
      loop.add(marker, to: mode)
      // The limit only ends the run if the shutdown never comes: as long as the watchdog (under
      // a sanitizer and the whole suite, the modal run and 20 calls took over 20 s once).
      outerResult.withLock { $0 = loop.run(for: .seconds(20) * watchdogScale) }
      keepAlive.invalidate()
      marker.invalidate()
    }
    let outcome = try await withWatchdog(timeout: .seconds(20), "a modal run ended by shutdown") {
      () async throws -> (RunLoopRunResult, Int) in
      async let modal = actor.modal(mode)
      await execOnNewThread { _ = inModal.wait(timeout: .seconds(20)) }
      var during = 0
      for _ in 0..<20 {
        if await actor.call() { during += 1 }
      }
      loop.shutdown()
      let result = try await modal
      for _ in 0..<20 {
        if await actor.call() { during += 1 }
      }
      return (result, during)
    }
    #expect(outcome?.0 == .stopped)
    #expect(outcome?.1 == 40)
    #expect(overlap.maximum == 1)
    _ = await execOnNewThread { waitUntil("the outer run to end") { outerResult.snapshot != nil } }
    #expect(outerResult.snapshot == .stopped)
    #expect(!thread.bodyEnded.opened)
    thread.quit()
  }

  /// Jobs accepted while the thread was out of a run, then more while it runs again after the
  /// shutdown, then more after its thread exited: every job runs once, in the order enqueued
  /// from one task, never on the thread once it was shut down with the thread out of a run.
  @Test func jobsKeepTheirOrderAcrossTheDiversionAndTheThreadsExit() async throws {
    let thread = CommandedCurrentLoopThread()
    let loop = await thread.loop()
    let order = Guarded<[Int]>([])
    let onThread = Locked(0)
    // Tasks that prefer the loop, started in order from one task: their first jobs reach the
    // loop in this order.
    func start(_ range: Range<Int>) -> [Task<Void, Never>] {
      range.map { index in
        Task(executorPreference: loop) {
          if loop.isOnLoopThread { onThread.withLock { $0 += 1 } }
          order.withLock { $0.append(index) }
        }
      }
    }
    var tasks = start(0..<30)
    _ = await execOnNewThread {
      waitUntil("30 jobs waiting") { loop.shared.inboxLock.withLock { loop.shared.inbox.jobs.count } >= 30 }
    }
    loop.shutdown()
    let rerun = await thread.exec { loop -> RunLoopRunResult in
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepAlive)
      defer { keepAlive.invalidate() }
      return loop.run(for: .seconds(5))
    }
    tasks += start(30..<60)
    thread.quit()
    await execOnNewThread { _ = thread.bodyEnded.wait(timeout: .seconds(20)) }
    tasks += start(60..<90)
    let allTasks = tasks
    let done: Void? = try await withWatchdog(timeout: .seconds(20), "every job") {
      for task in allTasks { await task.value }
    }
    #expect(done != nil)
    #expect(rerun == .stopped || rerun == .finished)
    #expect(order.snapshot.count == 90)
    #expect(Set(order.snapshot).count == 90)
    #expect(order.snapshot == Array(0..<90), "the jobs ran out of order")
    #expect(onThread.withLock { $0 } == 0)
  }
}
