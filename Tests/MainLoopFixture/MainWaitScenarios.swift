import AsyncRunLoop
import Dispatch
import Glibc

// Scenarios of the main loop in a real process: waiting callers racing a stop and a shutdown,
// a nested run inside a job of an actor pinned to the main loop, modal runs stacked from the main
// actor, and a mode that joins the common modes while the main loop runs.

/// Callers blocked in `runOnMainAndWait` and `RunLoopThread.main.performAndWait` racing
/// `stopMainLoop()`, ten times over: each call either runs its body once and returns, or throws
/// `wouldDeadlock` and its body never runs (not even when the main loop runs again later).
func mainWaitVersusStopScenario() {
  let bodies = Locked(0)
  var returned = 0
  for round in 0..<10 {
    let succeeded = Locked(0)
    let stopped = Locked(false)
    let unexpected = Locked<[String]>([])
    let callers = (0..<3).map { index in
      PlainThread {
        waitUntil("the main loop to run") { RunLoopThread.isMainLoopRunning || stopped.current }
        while true {
          do {
            if index == 2 {
              try RunLoopThread.main.performAndWait { bodies.withLock { $0 += 1 } }
            } else {
              try runOnMainAndWait { bodies.withLock { $0 += 1 } }
            }
            succeeded.withLock { $0 += 1 }
          } catch RunLoopError.wouldDeadlock {
            return
          } catch {
            unexpected.withLock { $0.append("\(error)") }
            return
          }
        }
      }
    }
    let stopper = PlainThread {
      waitUntil("some calls to return") { succeeded.current >= 10 * (round + 1) }
      stopMainLoop()
      stopped.withLock { $0 = true }
    }
    runMainLoop()
    stopper.join()
    for caller in callers { caller.join() }
    check(unexpected.current.isEmpty, "round \(round): unexpected errors \(unexpected.current)")
    returned += succeeded.current
  }
  // Run again: abandoned blocks reach the front of their queues now and must be skipped.
  RunLoopThread.main.add(LoopTimer(after: .milliseconds(50)) { _ in stopMainLoop() }, to: .common)
  runMainLoop()
  check(bodies.current == returned, "bodies ran \(bodies.current) times for \(returned) calls that returned")
  say("waiting callers vs stop: \(returned) calls returned, the others were refused, no body ran twice or unseen")
}

/// An actor pinned to the main loop (not the main actor).
actor WaitScenarioPinned: LoopActor {
  nonisolated var loop: RunLoopThread { RunLoopThread.main }
  private var calls = 0

  func bump() -> Int {
    calls += 1
    return calls
  }

  /// Runs the main loop nested inside this actor's job: the loop's other jobs (this actor's next
  /// call) must not start inside; performed blocks, timers and the main queue's source run.
  func runNested(_ log: Locked<[String]>, enqueued: Locked<Bool>) {
    log.withLock { $0.append("outer begins") }
    let loop = RunLoopThread.main
    Task.detached {
      enqueued.withLock { $0 = true }
      await self.mark(log)
    }
    loop.perform { log.withLock { $0.append("perform") } }
    loop.add(LoopTimer(after: .milliseconds(5)) { _ in log.withLock { $0.append("timer") } }, to: .default)
    DispatchQueue.main.async { log.withLock { $0.append("main queue") } }
    waitUntil("the second call to be sent") { enqueued.current }
    usleep(20_000)  // its job is on the main loop by now
    let result = loop.run(mode: .default, for: .milliseconds(100))
    log.withLock { $0.append("outer ends \(result)") }
  }

  func mark(_ log: Locked<[String]>) {
    RunLoopThread.main.checkIsolated()
    log.withLock { $0.append("second call") }
  }
}

/// A run of the main loop nested in a job of an actor pinned to it (the `run(mode:)` doc: no
/// executor jobs start inside; sources, timers and performed blocks run).
func mainPinnedNestedRunScenario() {
  let pinned = WaitScenarioPinned()
  let log = Locked<[String]>([])
  let enqueued = Locked(false)
  Task.detached {
    await pinned.runNested(log, enqueued: enqueued)
    waitUntil("the second call") { log.current.contains("second call") }
    stopMainLoop()
  }
  runMainLoop()
  let entries = log.current
  guard let ends = entries.firstIndex(where: { $0.hasPrefix("outer ends") }),
    let second = entries.firstIndex(of: "second call")
  else { fail("incomplete: \(entries)") }
  check(entries[ends] == "outer ends timedOut", "the nested run returned: \(entries)")
  check(second > ends, "another job of the loop ran inside the nested run: \(entries)")
  for inside in ["perform", "timer", "main queue"] {
    guard let index = entries.firstIndex(of: inside) else { fail("\(inside) never ran: \(entries)") }
    check(index < ends, "\(inside) did not run inside the nested run: \(entries)")
  }
  say("nested run in a pinned actor's job: \(entries)")
}

/// Two modal runs stacked from `@MainActor` code (the second task starts during the first's modal
/// run, as the main queue is served in the default mode). Cancelling the outer one while the
/// inner one runs ends it only after the inner one returns (nested runs unwind in order): the
/// inner one times out, the outer one returns `.stopped`.
func mainModalStackScenario() {
  let loop = RunLoopThread.main
  let order = Locked<[String]>([])
  let innerRunning = Locked(false)
  let trace = Locked<[String]>([])
  let tracer = LoopObserver(activities: [.entry, .exit]) { _, activity in trace.withLock { $0.append("\(activity)") } }
  loop.add(tracer, to: .default)
  Task { @MainActor in
    // Two unstructured tasks may start in either order: the inner one is made only once the
    // outer one's modal run has begun (this task is then served by that run).
    let outerEntered = Locked(false)
    loop.add(
      LoopObserver(activities: .entry, repeats: false) { _, _ in outerEntered.withLock { $0 = true } }, to: .default)
    let outer = Task { @MainActor in try await loop.runModal(mode: .default) }
    while !outerEntered.current { await Task.yield() }
    let inner = Task { @MainActor in
      let entry = LoopObserver(activities: .entry, repeats: false) { _, _ in innerRunning.withLock { $0 = true } }
      loop.add(entry, to: .default)
      let result = try await loop.runModal(mode: .default, for: .milliseconds(200))
      order.withLock { $0.append("inner \(result)") }
      trace.withLock { $0.append("inner resumed \(result)") }
      return result
    }
    let canceller = PlainThread {
      waitUntil("the inner modal run") { innerRunning.current }
      usleep(30_000)
      trace.withLock { $0.append("cancel") }
      outer.cancel()
    }
    let outerResult = await outer.result
    order.withLock { $0.append("outer \((try? outerResult.get()).map { "\($0)" } ?? "threw")") }
    trace.withLock { $0.append("outer awaited") }
    _ = await inner.result
    canceller.join()
    stopMainLoop()
  }
  runMainLoop()
  // The inner run necessarily ends first (it is nested in the outer one); the order the two
  // tasks resume in afterwards is the main queue's, not the runs', so only the results count.
  check(
    order.current.sorted() == ["inner timedOut", "outer stopped"],
    "modal runs ended as \(order.current); trace \(trace.current)")
  say("stacked modal runs from the main actor: \(order.current)")
}

/// A mode that joins the common modes while the main loop runs receives what is in `.common`
/// (the main queue's source, a timer added before and one added after): a raw run of it, nested
/// in a timer callout, serves `DispatchQueue.main`, `@MainActor` jobs and `runOnMainAndWait`
/// from another thread, and fires both timers.
func mainLateCommonModeScenario() {
  let loop = RunLoopThread.main
  let seen = Locked<Set<String>>([])
  let early = LoopTimer(after: .milliseconds(30)) { _ in seen.withLock { _ = $0.insert("early timer") } }
  loop.add(early, to: .common)
  let nestedResult = Locked<RunLoopRunResult?>(nil)
  let helperDone = Locked(false)
  loop.add(
    LoopTimer(after: .milliseconds(1)) { _ in
      let mode = RunLoopMode("round9-late")
      loop.addModeToCommonModes(mode)
      loop.add(LoopTimer(after: .milliseconds(10)) { _ in seen.withLock { _ = $0.insert("late timer") } }, to: .common)
      DispatchQueue.main.async { seen.withLock { _ = $0.insert("main queue") } }
      Task { @MainActor in seen.withLock { _ = $0.insert("main actor") } }
      let helper = PlainThread {
        do {
          try runOnMainAndWait { seen.withLock { _ = $0.insert("wait") } }
        } catch {
          fail("runOnMainAndWait threw \(error) during a run in a late common mode")
        }
        helperDone.withLock { $0 = true }
      }
      let probe = LoopTimer(after: .zero, repeatingEvery: .milliseconds(2)) { _ in
        if seen.current.count == 5 { loop.stop() }
      }
      loop.add(probe, to: mode)
      nestedResult.withLock { $0 = loop.run(mode: mode, for: .seconds(10)) }
      probe.invalidate()
      helper.join()
      stopMainLoop()
    }, to: .default)
  runMainLoop()
  check(
    nestedResult.current == .stopped,
    "the nested run returned \(String(describing: nestedResult.current)); saw \(seen.current)")
  check(helperDone.current, "the waiting caller did not return")
  say("a late common mode served: \(seen.current.sorted())")
}

/// `RunLoopThread.main.shutdown()` racing callers blocked in `performAndWait` and
/// `runOnMainAndWait`, and jobs of an actor pinned to the main loop: each call returns once (its
/// body ran once) or throws a `RunLoopError` (its body never ran); every job runs exactly once.
func mainShutdownWaitersScenario() {
  let loop = RunLoopThread.main
  let bodies = Locked(0)
  let succeeded = Locked(0)
  let unexpected = Locked<[String]>([])
  let shutDown = Locked(false)
  let callers = (0..<4).map { index in
    PlainThread {
      waitUntil("the main loop to run") { RunLoopThread.isMainLoopRunning || shutDown.current }
      while true {
        do {
          if index % 2 == 0 {
            try loop.performAndWait { bodies.withLock { $0 += 1 } }
          } else {
            try runOnMainAndWait { bodies.withLock { $0 += 1 } }
          }
          succeeded.withLock { $0 += 1 }
        } catch is RunLoopError {
          return
        } catch {
          unexpected.withLock { $0.append("\(error)") }
          return
        }
      }
    }
  }
  let pinned = WaitScenarioPinned()
  let jobs = Locked(0)
  for _ in 0..<50 {
    Task.detached {
      _ = await pinned.bump()
      jobs.withLock { $0 += 1 }
    }
  }
  let stopper = PlainThread {
    waitUntil("some calls to return") { succeeded.current >= 40 }
    loop.shutdown()
    shutDown.withLock { $0 = true }
  }
  runMainLoop()
  stopper.join()
  for caller in callers { caller.join() }
  check(unexpected.current.isEmpty, "unexpected errors \(unexpected.current)")
  check(bodies.current == succeeded.current, "bodies ran \(bodies.current) times for \(succeeded.current) returns")
  waitUntil("every job of the pinned actor") { jobs.current == 50 }
  let calls = Locked(0)
  Task.detached {
    let count = await pinned.bump()
    calls.withLock { $0 = count }
  }
  waitUntil("a late job") { calls.current != 0 }
  check(calls.current == 51, "the pinned actor counted \(calls.current) calls, not 51")
  say("shutdown vs waiting callers: \(succeeded.current) returned, the rest refused; 51 jobs ran once each")
}

/// Sleeps on the main loop when it shuts down (the shutdown docs): a sleep on its `clock` throws
/// `CancellationError`, and a `Task.sleep` under its preference is never ended early — it
/// completes at its deadline, after `runMainLoop()` returned.
func mainShutdownSleepsScenario() {
  let loop = RunLoopThread.main
  let clockOutcome = Locked<String?>(nil)
  let taskOutcome = Locked<String?>(nil)
  let started = Locked(0)
  let duration = Duration.milliseconds(400)
  Task(executorPreference: loop) {
    started.withLock { $0 += 1 }
    do {
      try await loop.clock.sleep(for: .seconds(3600))
      clockOutcome.withLock { $0 = "returned" }
    } catch is CancellationError {
      clockOutcome.withLock { $0 = "cancelled" }
    } catch {
      clockOutcome.withLock { $0 = "\(error)" }
    }
  }
  Task(executorPreference: loop) {
    started.withLock { $0 += 1 }
    let start = ContinuousClock.now
    do {
      try await Task.sleep(for: duration)
      taskOutcome.withLock { $0 = ContinuousClock.now - start >= duration ? "ok" : "early" }
    } catch {
      taskOutcome.withLock { $0 = "threw \(error)" }
    }
  }
  let stopper = PlainThread {
    waitUntil("both sleeps to start") { started.current == 2 }
    usleep(20_000)
    loop.shutdown()
  }
  runMainLoop()
  stopper.join()
  waitUntil("the clock sleep to end") { clockOutcome.current != nil }
  check(clockOutcome.current == "cancelled", "the main loop's clock sleep ended with \(clockOutcome.current!)")
  waitUntil("the task sleep to end") { taskOutcome.current != nil }
  check(taskOutcome.current == "ok", "the Task.sleep under the main loop's preference: \(taskOutcome.current!)")
  say("sleeps at the main loop's shutdown: clock cancelled, Task.sleep at its deadline")
}
