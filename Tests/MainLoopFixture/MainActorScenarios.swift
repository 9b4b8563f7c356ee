import AsyncRunLoop
import Dispatch
import Glibc

// Main-actor isolation across nested and modal runs of the
// main loop.

/// What the round-3 scenarios saw, on the main actor.
@MainActor var mainActorLog: [String] = []

/// A `@MainActor` job (a main-queue job) that runs the main loop nested must not have another
/// main-actor job start inside it: two main-actor jobs at once break the main actor's isolation,
/// exactly as two jobs of one loop at once would break a `LoopActor`'s (the `run(mode:…)` doc: a
/// second job starting while one is on the stack breaks the serial-executor contract). The same
/// for a `DispatchQueue.main` block that runs the loop nested. The work queued meanwhile runs
/// after the outer job, in order.
func mainActorNestedRunScenario() {
  let loop = RunLoopThread.main
  Task { @MainActor in
    mainActorLog.append("job 1 begins")
    Task { @MainActor in mainActorLog.append("job 2") }  // queued on the main queue behind job 1
    DispatchQueue.main.async { MainActor.assumeIsolated { mainActorLog.append("block 3") } }
    let passes = Locked(0)
    let counter = LoopObserver(activities: .beforeTimers) { _, _ in passes.withLock { $0 += 1 } }
    loop.add(counter, to: .default)
    let result = loop.run(mode: .default, for: .milliseconds(50))
    counter.invalidate()
    // A main-queue wake-up the nested run may not serve must not make it spin either.
    check(passes.current < 1_000, "the nested run spun: \(passes.current) passes in 50 ms")
    say("nested run: \(passes.current) passes")
    mainActorLog.append("job 1 ends (\(result))")
    DispatchQueue.main.async { MainActor.assumeIsolated { mainActorLog.append("block 4") } }
    DispatchQueue.main.async {
      MainActor.assumeIsolated { mainActorLog.append("block 5 begins") }
      DispatchQueue.main.async { MainActor.assumeIsolated { mainActorLog.append("block 6") } }
      let inner = loop.run(mode: .default, for: .milliseconds(50))
      MainActor.assumeIsolated { mainActorLog.append("block 5 ends (\(inner))") }
      DispatchQueue.main.async { stopMainLoop() }
    }
  }
  runMainLoop()
  let log = MainActor.assumeIsolated { mainActorLog }
  let expected = [
    "job 1 begins", "job 1 ends (timedOut)", "job 2", "block 3", "block 4", "block 5 begins",
    "block 5 ends (timedOut)", "block 6",
  ]
  check(log == expected, "main-actor work ran nested in another main-actor job: \(log)")
  say("no main-actor job started inside another: \(log)")
}

/// `runModal` from `@MainActor` code suspends the caller, so other main-actor work keeps running
/// during the modal run (the `runModal` doc: the caller's executor "is not blocked", "the
/// caller's actor's other work included") — in a mode of the common set, which serves the main
/// queue.
func mainActorModalScenario() {
  let loop = RunLoopThread.main
  let otherWorkRan = Locked(false)
  Task { @MainActor in
    // The modal run stops once the probe, one of its timers, sees the other work done: it ran
    // during the modal run (a run that timed out instead would mean it did not).
    let entered = Locked(false)
    let entry = LoopObserver(activities: .entry) { _, _ in entered.withLock { $0 = true } }
    loop.add(entry, to: .default)
    let probe = LoopTimer(after: .zero, repeatingEvery: .milliseconds(5)) { _ in
      if otherWorkRan.current { loop.stop() }  // ends the innermost run: the modal one
    }
    loop.add(probe, to: .default)
    let helper = PlainThread {
      waitUntil("the modal run") { entered.current }
      Task { @MainActor in otherWorkRan.withLock { $0 = true } }
    }
    let result: RunLoopRunResult
    do {
      result = try await loop.runModal(mode: .default, for: .seconds(20))
    } catch {
      fail("runModal threw \(error)")
    }
    probe.invalidate()
    entry.invalidate()
    helper.join()
    expectMainThreadAndMainActor("the code after runModal")
    check(
      result == .stopped && otherWorkRan.current,
      "main-actor work queued during the modal run did not run during it: \(result)")
    // Cancelling the task ends its modal run (no deadline) with `.stopped`.
    let modal = Task { @MainActor in try await loop.runModal(mode: .default) }
    let canceller = PlainThread {
      usleep(20_000)
      modal.cancel()
    }
    let cancelled = await modal.result
    canceller.join()
    guard case .success(let stopped) = cancelled, stopped == .stopped else {
      fail("the cancelled modal run from the main actor ended with \(cancelled)")
    }
    stopMainLoop()
  }
  runMainLoop()
  say("main-actor work ran during a modal run from the main actor; cancelling ended another")
}

/// An actor pinned to the main loop.
actor MainActorScenarioPinned: LoopActor {
  nonisolated var loop: RunLoopThread { RunLoopThread.main }
  func locate() -> (onMain: Bool, isolated: Bool) {
    (isOnMainThread, RunLoopThread.main.isIsolatingCurrentContext() == true)
  }
}

/// `RunLoopThread.main.shutdownAndWait()` from another thread returns at once (the main loop has
/// no thread of its own to join) and ends `runMainLoop()`, which drains the loop first; a job for
/// an actor on the main loop enqueued afterwards is not lost: it runs on the fallback queue, still
/// isolated to the main loop.
func mainShutdownLateJobsScenario() {
  let pinned = MainActorScenarioPinned()
  let before = Locked<(onMain: Bool, isolated: Bool)?>(nil)
  let stopper = PlainThread {
    waitUntil("the main loop to run") { RunLoopThread.isMainLoopRunning }
    Task.detached {
      before.withLock { $0 = nil }; let seen = await pinned.locate(); before.withLock { $0 = seen }
    }
    waitUntil("a job of the actor on the main loop") { before.current != nil }
    RunLoopThread.main.shutdownAndWait()  // must not wait for the main thread
  }
  runMainLoop()
  stopper.join()
  check(
    before.current?.onMain == true && before.current?.isolated == true, "before: \(String(describing: before.current))")
  let after = Locked<(onMain: Bool, isolated: Bool)?>(nil)
  Task.detached {
    let seen = await pinned.locate()
    after.withLock { $0 = seen }
  }
  waitUntil("a late job of the actor on the main loop") { after.current != nil }
  check(after.current?.onMain == false, "a late job ran on the main thread after shutdown")
  check(after.current?.isolated == true, "a late job on the fallback was not isolated to the main loop")
  say("late jobs of an actor on the shut-down main loop ran on the fallback, isolated")
}

/// The main actor's jobs are main-queue blocks, which the main loop serves in its common modes
/// only (as CF serves the main queue): during a `runModal` from `@MainActor` code in a mode outside
/// the common set, other main-actor work waits until the run ends; once the mode is added to the
/// common modes, it runs during the modal run.
func mainActorPrivateModalScenario() {
  let loop = RunLoopThread.main
  Task { @MainActor in
    for common in [false, true] {
      let mode = RunLoopMode(common ? "round3-private-common" : "round3-private")
      if common { loop.addModeToCommonModes(mode) }
      let entered = Locked(false)
      let otherWorkRan = Locked(false)
      let seenDuringRun = Locked(false)
      let entry = LoopObserver(activities: .entry) { _, _ in entered.withLock { $0 = true } }
      loop.add(entry, to: mode)
      let probe = LoopTimer(after: .zero, repeatingEvery: .milliseconds(5)) { _ in
        guard otherWorkRan.current else { return }
        seenDuringRun.withLock { $0 = true }
        loop.stop()  // ends the innermost run: the modal one
      }
      loop.add(probe, to: mode)
      let helper = PlainThread {
        waitUntil("the modal run") { entered.current }
        Task { @MainActor in otherWorkRan.withLock { $0 = true } }
      }
      let result: RunLoopRunResult
      do {
        result = try await loop.runModal(mode: mode, for: common ? .seconds(20) : .milliseconds(150))
      } catch {
        fail("runModal threw \(error)")
      }
      probe.invalidate()
      entry.invalidate()
      helper.join()
      if common {
        check(result == .stopped && seenDuringRun.current, "in a common mode: \(result), seen \(seenDuringRun.current)")
      } else {
        check(result == .timedOut, "in a private mode the modal run returned \(result)")
        check(!seenDuringRun.current, "main-actor work ran during a modal run in a private mode")
      }
      // Queued before this job resumed, or (a slow helper) soon after: wait without blocking.
      while !otherWorkRan.current { try? await Task.sleep(for: .milliseconds(1)) }
    }
    stopMainLoop()
  }
  runMainLoop()
  say("main-actor work waits out a private-mode modal run and runs during a common-mode one")
}
