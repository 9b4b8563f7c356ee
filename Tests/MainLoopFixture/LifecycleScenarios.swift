import AsyncRunLoop
import Dispatch
import Glibc

/// Values come back and errors are rethrown unchanged, across threads, for both waiting forms.
func valuesScenario() {
  let checked = Locked(0)
  let done: @Sendable () -> Void = {
    if checked.withLock({ count in
      count += 1
      return count == 2
    }) {
      stopMainLoop()
    }
  }
  let plain = PlainThread {
    waitUntil("the main loop to run") { RunLoopThread.isMainLoopRunning }
    do {
      let text = try runOnMainAndWait { "from main \(isOnMainThread)" }
      check(text == "from main true", "runOnMainAndWait returned '\(text)'")
      let numbers = try runOnMainAndWait { [1, 2, 3] }
      check(numbers == [1, 2, 3], "runOnMainAndWait returned \(numbers)")
    } catch {
      fail("runOnMainAndWait threw \(error)")
    }
    do {
      _ = try runOnMainAndWait { () throws(FixtureError) -> Int in throw FixtureError(code: 42) }
      fail("runOnMainAndWait did not rethrow")
    } catch let error as FixtureError {
      check(error == FixtureError(code: 42), "rethrown: \(error)")
    } catch {
      fail("runOnMainAndWait threw \(error) instead of the body's error")
    }
    done()
  }
  Task.detached {
    let text = await runOnMain { "from main \(isOnMainThread)" }  // no `try`: the body cannot throw
    check(text == "from main true", "await runOnMain returned '\(text)'")
    do throws(FixtureError) {
      _ = try await runOnMain { () throws(FixtureError) -> Int in throw FixtureError(code: 43) }
      fail("await runOnMain did not rethrow")
    } catch {
      check(error == FixtureError(code: 43), "rethrown: \(error)")  // typed throws: `error` is a FixtureError
    }
    done()
  }
  runMainLoop()
  plain.join()
  say("values returned and errors rethrown")
}

/// When the main loop has stopped running, runOnMainAndWait throws instead of hanging, and its
/// body never runs: after it stopped, and when it stops while a caller waits. A stop requested
/// before runMainLoop() makes it return at once.
func notRunningScenario() {
  check(!RunLoopThread.isMainLoopRunning, "running before runMainLoop()")
  let bodyRan = Locked(false)
  stopMainLoop()
  runMainLoop()  // the remembered stop: returns at once
  say("a stop requested before runMainLoop() made it return at once")

  // A caller that waits while the main loop stops is released with an error; its body never runs.
  let stopping = Locked(false)
  let callerAboutToWait = Locked(false)
  let outcome = Locked<String?>(nil)
  let waiter = PlainThread {
    waitUntil("the main loop to run") { RunLoopThread.isMainLoopRunning }
    DispatchQueue.main.async {
      stopMainLoop()
      stopping.withLock { $0 = true }
      waitUntil("the caller") { callerAboutToWait.current }
      usleep(100_000)  // the caller queues its block while this one runs, then the loop stops
    }
    // Queue the block only once the stopping block runs: the drain in progress does not reach it.
    waitUntil("the stopping block") { stopping.current }
    callerAboutToWait.withLock { $0 = true }
    do {
      try runOnMainAndWait { bodyRan.withLock { $0 = true } }
      outcome.withLock { $0 = "ran" }
    } catch RunLoopError.wouldDeadlock(let message) {
      outcome.withLock { $0 = message }
    } catch {
      fail("unexpected error \(error)")
    }
  }
  runMainLoop()
  waiter.join()
  let message = outcome.current ?? "nothing"
  check(message.contains("stopped running before the block ran"), "a waiting caller got: \(message)")
  check(!RunLoopThread.isMainLoopRunning, "running after runMainLoop() returned")
  say("a waiting caller was released: \(message)")

  // Once the main loop has run and stopped, a new caller is refused at once (before the first
  // run, callers wait for it instead: see the early-waiters scenario).
  let refusal = Locked<String?>(nil)
  PlainThread {
    do {
      try runOnMainAndWait { bodyRan.withLock { $0 = true } }
    } catch RunLoopError.wouldDeadlock(let message) {
      refusal.withLock { $0 = message }
    } catch {
      fail("unexpected error \(error)")
    }
  }.join()
  check(
    refusal.current?.contains("the main loop is not running") == true,
    "no refusal: \(String(describing: refusal.current))")
  say("refused after the loop ran and stopped: \(refusal.current!)")

  // Running the loop again reaches the abandoned block: it is skipped.
  RunLoopThread.main.add(LoopTimer(after: .milliseconds(50)) { _ in stopMainLoop() }, to: .common)
  runMainLoop()
  check(!bodyRan.current, "a refused or abandoned body ran")
  say("refused and abandoned bodies never ran")
}

/// stopMainLoop() from inside nested runs ends them and the runMainLoop() around them: a nested
/// run in a common mode, and one in a private mode the main loop's observer does not see.
func nestedStopScenario() {
  let loop = RunLoopThread.main
  for mode: RunLoopMode in [.default, "modal"] {
    let nestedResult = Locked<RunLoopRunResult?>(nil)
    loop.add(
      LoopTimer(after: .milliseconds(5)) { _ in
        loop.add(LoopTimer(after: .milliseconds(5)) { _ in stopMainLoop() }, to: mode)
        let result = loop.run(mode: mode, for: .seconds(20))
        nestedResult.withLock { $0 = result }
      }, to: .default)
    runMainLoop()  // the watchdog kills the process if the outer run does not end
    check(
      nestedResult.current == .stopped, "the nested run in \(mode) returned \(String(describing: nestedResult.current))"
    )
    say("stopMainLoop() in a nested \(mode) run ended it and runMainLoop()")
  }
}

/// runMainLoop() inside runMainLoop() is a programming error: it traps with a clear message.
func nestedRunMainLoopScenario() {
  RunLoopThread.main.add(LoopTimer(after: .milliseconds(1)) { _ in runMainLoop() }, to: .default)
  runMainLoop()
  fail("nested runMainLoop() returned")
}

/// RunLoopThread.main.shutdown() ends runMainLoop(), which first drains the loop as shutdown()
/// promises (a block waiting for another mode runs, on the main thread); then the loop refuses
/// work and runOnMainAndWait refuses to wait.
func shutdownScenario() {
  let loop = RunLoopThread.main
  let drained = Locked(false)
  let stopper = PlainThread {
    waitUntil("the main loop to run") { RunLoopThread.isMainLoopRunning }
    loop.perform(inModes: ["never-run"]) {
      check(isOnMainThread, "the drained block ran off the main thread")
      drained.withLock { $0 = true }
    }
    loop.shutdown()
  }
  runMainLoop()
  stopper.join()
  check(drained.current, "shutdown did not drain the block")
  check(loop.isShutDown, "not shut down")
  check(!RunLoopThread.isMainLoopRunning, "running after shutdown")
  check(!loop.perform {}, "the shut-down main loop accepted a block")
  PlainThread {
    do {
      try runOnMainAndWait {}
      fail("runOnMainAndWait waited on a shut-down main loop")
    } catch {
      check(error as? RunLoopError != nil, "unexpected error \(error)")
    }
  }.join()
  say("shutdown ended runMainLoop() after draining")
}

/// Running RunLoopThread.main directly (no runMainLoop) also serves the main queue, counts as
/// running, and does not return `.finished` at once: the main-queue source keeps the default mode
/// alive. A mode outside the common set holds nothing, so it does return `.finished`.
func rawRunScenario() {
  let loop = RunLoopThread.main
  check(loop.run(mode: .default, for: .milliseconds(20)) == .timedOut, "a raw run did not last its limit")
  check(loop.run(mode: "empty", for: .seconds(5)) == .finished, "a run in an empty mode did not finish at once")
  let served = Locked<[String]>([])
  let helper = PlainThread {
    waitUntil("the main loop to run") { RunLoopThread.isMainLoopRunning }
    Task { @MainActor in
      expectMainThreadAndMainActor("a MainActor task in a raw run")
      served.withLock { $0.append("MainActor") }
    }
    DispatchQueue.main.async {
      expectMainThreadAndMainActor("a main-queue block in a raw run")
      served.withLock { $0.append("dispatch") }
    }
    do {
      try runOnMainAndWait {
        expectMainThreadAndMainActor("runOnMainAndWait in a raw run")
        served.withLock { $0.append("wait") }
      }
    } catch {
      fail("runOnMainAndWait threw \(error) during a raw run")
    }
    loop.stop()
  }
  let result = loop.run(mode: .default, for: .seconds(20))
  helper.join()
  check(result == .stopped, "the raw run returned \(result)")
  check(served.current == ["MainActor", "dispatch", "wait"], "served out of order or not at all: \(served.current)")
  check(!RunLoopThread.isMainLoopRunning, "running after the raw run returned")
  say("raw runs served: \(served.current)")
}

/// `RunLoopThread.main.performAndWait` from another thread, for a block the main loop has not
/// run when it stops (here: in a mode it never runs): the caller is released with an error
/// instead of hanging, and the block never runs.
func performAndWaitStoppedScenario() {
  let bodyRan = Locked(false)
  let outcome = Locked<String?>(nil)
  let caller = PlainThread {
    waitUntil("the main loop to run") { RunLoopThread.isMainLoopRunning }
    do {
      try RunLoopThread.main.performAndWait(inModes: ["never-run"]) { bodyRan.withLock { $0 = true } }
      outcome.withLock { $0 = "ran" }
    } catch RunLoopError.wouldDeadlock(let message) {
      outcome.withLock { $0 = message }
    } catch {
      outcome.withLock { $0 = "unexpected error \(error)" }
    }
  }
  let stopper = PlainThread {
    waitUntil("the main loop to run") { RunLoopThread.isMainLoopRunning }
    usleep(100_000)  // the caller is waiting by now (if not, it is refused at once: same outcome)
    stopMainLoop()
  }
  runMainLoop()
  caller.join()
  stopper.join()
  check(!bodyRan.current, "the block ran although the main loop had stopped")
  check(
    outcome.current?.contains("main loop") == true,
    "performAndWait was not refused: \(String(describing: outcome.current))")
  say("released with: \(outcome.current!)")
}
