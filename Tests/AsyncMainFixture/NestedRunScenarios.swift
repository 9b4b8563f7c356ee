@_spi(ExperimentalCustomExecutors) import AsyncRunLoop
import Dispatch
import Glibc

// Nested and modal runs of the main loop, the executor's own run()/stop(), sleeping, and the
// main loop's stop and shutdown, in an `async` main on AsyncRunLoopExecutorFactory.

/// `runModal` from main-actor code lets other main-actor work run meanwhile; a nested run from
/// a main-actor job serves the main loop's timers and returns; the executor's nested `run()` ends
/// with `stop()` and `runUntil` with its condition, returning control to main.
@MainActor
func nestedAndModalScenario() async {
  let loop = RunLoopThread.main
  let otherWork = Locked(false)
  let modalStarted = Locked(false)
  // Entering a run in the default mode: the outer run was entered long ago, so this is the modal
  // run (a timer could fire in the outer run before the modal run starts).
  let starter = LoopObserver(activities: .entry) { _, _ in modalStarted.withLock { $0 = true } }
  loop.add(starter, to: .default)
  // The modal run stops once the probe, one of its timers, sees the other work done: it ran
  // during the modal run (a run that timed out instead would mean it did not).
  let probe = LoopTimer(after: .zero, repeatingEvery: .milliseconds(5)) { _ in
    if otherWork.current { loop.stop() }  // ends the innermost run: the modal one
  }
  loop.add(probe, to: .default)
  let helper = PlainThread {
    while !modalStarted.current { usleep(1000) }
    Task { @MainActor in otherWork.withLock { $0 = true } }
  }
  let modal: RunLoopRunResult
  do {
    modal = try await loop.runModal(mode: .default, for: .seconds(20))
  } catch {
    fail("runModal threw \(error)")
  }
  probe.invalidate()
  starter.invalidate()
  helper.join()
  check(isOnMainThread, "the code after runModal ran off the main thread")
  check(
    modal == .stopped && otherWork.current,
    "main-actor work queued during the modal run did not run during it: \(modal)")

  let fired = Locked(false)
  loop.add(LoopTimer(after: .milliseconds(2)) { _ in fired.withLock { $0 = true } }, to: .common)
  let nested = loop.run(mode: .default, for: .milliseconds(100))
  check(nested == .timedOut && fired.current, "the nested run returned \(nested), timer fired: \(fired.current)")

  let executor = MainLoopExecutor.shared
  loop.add(LoopTimer(after: .milliseconds(2)) { _ in executor.stop() }, to: .common)
  do { try executor.run() } catch { fail("the nested run() threw \(error)") }
  check(isOnMainThread, "control came back off the main thread")

  let condition = Locked(false)
  loop.add(LoopTimer(after: .milliseconds(2)) { _ in condition.withLock { $0 = true } }, to: .common)
  do { try executor.runUntil { condition.current } } catch { fail("runUntil threw \(error)") }
  say("nested-and-modal: runModal \(modal), nested run \(nested), run() ended by stop(), runUntil by its condition")
}

/// Nothing accepted before stopMainLoop() is lost: a thread queues 10,000 runOnMain bodies, then
/// stops the main loop; every one has run when `await runMainLoop()` returns. 20 rounds.
@MainActor
func stopKeepsAcceptedWorkScenario() async {
  let bodies = 10_000
  for round in 0..<20 {
    let ran = Locked(0)
    let sender = PlainThread {
      for _ in 0..<bodies { runOnMain { ran.withLock { $0 += 1 } } }
      stopMainLoop()
    }
    await runMainLoop()
    check(ran.current == bodies, "round \(round): \(ran.current) of \(bodies) bodies had run")
    sender.join()
  }
  say("stop-keeps-accepted-work: 20 rounds of \(bodies) bodies, all ran before runMainLoop() returned")
}

/// `Task.sleep` on the main actor resumes on the main thread (its timer is the global
/// executor's: the runtime does not ask the main executor to schedule it); a sleep on the main
/// loop's clock waits on a main-loop timer.
@MainActor
func sleepScenario() async {
  do {
    try await Task.sleep(for: .milliseconds(5))
    check(isOnMainThread, "Task.sleep resumed off the main thread")
    let passes = Locked(0)
    let counter = LoopObserver(activities: .beforeTimers) { _, _ in passes.withLock { $0 += 1 } }
    RunLoopThread.main.add(counter, to: .common)
    try await RunLoopThread.main.clock.sleep(for: .milliseconds(5))
    counter.invalidate()
    check(isOnMainThread, "the main loop clock's sleep resumed off the main thread")
    check(passes.current > 0, "the main loop ran no pass during its clock's sleep")
  } catch {
    fail("a sleep threw \(error)")
  }
  say("sleep: Task.sleep and the main loop clock's sleep resume on the main thread")
}

/// Threads started first thing in main wait for the main loop with runOnMainAndWait: under the
/// factory the main loop runs before main's first line, so they never get `wouldDeadlock`.
@MainActor
func waitFromEarlyThreadScenario() async {
  let results = Locked<[Int]>([])
  let threads = (0..<8).map { index in
    PlainThread {
      do {
        let value = try runOnMainAndWait { () -> Int in
          check(isOnMainThread, "a waited-for body ran off the main thread")
          return index
        }
        results.withLock { $0.append(value) }
      } catch {
        fail("runOnMainAndWait from an early thread threw \(error)")
      }
    }
  }
  await waitUntil("the early threads") { results.current.count == threads.count }
  for thread in threads { thread.join() }
  say("wait-from-early-thread: \(results.current.count) threads served")
}

/// Shutting the main loop down ends the process with status 0 once it is drained, after a line
/// on stderr (main never gets control back: its actor has no thread left). What was accepted before
/// the shutdown runs first, on the main thread: a performed block, a main-queue block, a main-actor
/// job and a `runOnMain` body from another thread.
@MainActor
func shutdownScenario() async {
  await Task.yield()  // the main loop serves this main from here on
  check(RunLoopThread.isMainLoopRunning, "the main loop does not run after main's first await")
  DispatchQueue.main.async {
    check(isOnMainThread, "the main-queue block ran off the main thread")
    say("a main-queue block ran in the drain")
  }
  Task { @MainActor in
    check(isOnMainThread, "the main-actor job ran off the main thread")
    say("a main-actor job ran in the drain")
  }
  let drained = PlainThread {
    // Accepted before the shutdown: the drain runs it.
    check(RunLoopThread.main.perform { say("a performed block ran in the drain") }, "perform was refused")
    runOnMain {
      check(isOnMainThread, "the runOnMain body ran off the main thread")
      say("a runOnMain body ran in the drain")
    }
  }
  drained.join()
  say("shutdown requested")
  RunLoopThread.main.shutdown()
  await runMainLoop()  // never returns: the process ends once the main loop is drained
  fail("main got control back after the main loop shut down")
}
