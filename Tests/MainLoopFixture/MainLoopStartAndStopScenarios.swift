import AsyncRunLoop
import CAsyncRunLoop
import Dispatch
import Glibc

// The main loop's start and stop in a synchronous main: callers started before it runs wait for
// it, nothing accepted before a stop is lost, and a program that gave the main queue away
// (dispatchMain) is told so.

/// Nothing accepted before stopMainLoop() is lost: a thread queues 10,000 runOnMain bodies, then
/// stops the main loop; every one has run when runMainLoop() returns. 20 rounds.
func stopKeepsAcceptedWorkScenario() {
  let bodies = 10_000
  for round in 0..<20 {
    let ran = Locked(0)
    let sender = PlainThread {
      for _ in 0..<bodies { runOnMain { ran.withLock { $0 += 1 } } }
      stopMainLoop()
    }
    runMainLoop()
    check(ran.current == bodies, "round \(round): \(ran.current) of \(bodies) bodies had run")
    sender.join()
  }
  say("stop-keeps-accepted-work: 20 rounds of \(bodies) bodies, all ran before runMainLoop() returned")
}

/// Nothing accepted before `RunLoopThread.main.shutdown()` is lost either, also when the main
/// thread shuts its own loop down before `runMainLoop()`: the main-queue blocks, main-actor jobs and
/// `runOnMain` bodies queued before it (100 of each, some from the main thread, some from
/// another) have all run, on the main thread, when `runMainLoop()` returns after the drain.
func shutdownKeepsAcceptedWorkScenario() {
  let each = 100
  let ran = Locked<[String: Int]>([:])
  let record: @Sendable (String) -> Void = { kind in
    check(isOnMainThread, "a \(kind) ran off the main thread")
    ran.withLock { $0[kind, default: 0] += 1 }
  }
  for _ in 0..<each {
    DispatchQueue.main.async { record("main-queue block") }
    Task { @MainActor in record("main-actor job") }
  }
  PlainThread { for _ in 0..<each { runOnMain { record("runOnMain body") } } }.join()
  check(RunLoopThread.main.perform { record("performed block") }, "the main loop refused a block")
  RunLoopThread.main.shutdown()
  runMainLoop()
  let counts = ran.current
  for kind in ["main-queue block", "main-actor job", "runOnMain body"] {
    check(counts[kind] == each, "\(counts[kind] ?? 0) of \(each) of each \(kind) ran: \(counts)")
  }
  check(counts["performed block"] == 1, "the performed block did not run once: \(counts)")
  say("shutdown-keeps-accepted-work: every block accepted before the shutdown ran")
}

/// A stop remembered from before `runMainLoop()` does not skip the drain of a shutdown that came
/// after it: `runMainLoop()` returns at once, but only after the main-queue block and the main
/// loop's performed block, both accepted before the shutdown, have run.
func stopThenShutdownScenario() {
  let ran = Locked<[String]>([])
  stopMainLoop()  // not running: remembered for the next runMainLoop()
  DispatchQueue.main.async { ran.withLock { $0.append("main-queue block") } }
  check(RunLoopThread.main.perform { ran.withLock { $0.append("performed block") } }, "perform was refused")
  RunLoopThread.main.shutdown()
  runMainLoop()
  check(ran.current == ["main-queue block", "performed block"], "ran: \(ran.current)")
  check(!RunLoopThread.main.perform {}, "the shut-down main loop accepted a block")
  say("stop-then-shutdown: the drain ran before runMainLoop() returned")
}

/// Threads and tasks started before the main loop runs wait for it to start, with
/// runOnMainAndWait, the blocking waitUntilMainLoopRuns() and the awaiting one, whenever they
/// reach it; none gets wouldDeadlock.
func earlyWaitersScenario() {
  let waiters = 6
  let served = Locked<[String]>([])
  let serve: @Sendable (String) -> Void = { what in
    let count = served.withLock {
      $0.append(what)
      return $0.count
    }
    if count == waiters { stopMainLoop() }
  }
  var threads: [PlainThread] = []
  for index in 0..<2 {
    threads.append(
      PlainThread {
        do {
          let onMain = try runOnMainAndWait { isOnMainThread }
          check(onMain, "a waited-for body ran off the main thread")
          serve("runOnMainAndWait \(index)")
        } catch {
          fail("runOnMainAndWait before the main loop ran threw \(error)")
        }
      })
    threads.append(
      PlainThread {
        do {
          try RunLoopThread.waitUntilMainLoopRuns()
          check(RunLoopThread.isMainLoopRunning, "waitUntilMainLoopRuns() returned before the main loop ran")
          serve("waitUntilMainLoopRuns \(index)")
        } catch {
          fail("waitUntilMainLoopRuns() before the main loop ran threw \(error)")
        }
      })
    Task.detached {
      do {
        try await RunLoopThread.waitUntilMainLoopRuns()
        serve("await waitUntilMainLoopRuns \(index)")
      } catch {
        fail("await waitUntilMainLoopRuns() before the main loop ran threw \(error)")
      }
    }
  }
  usleep(50_000)  // setup work on the main thread; the waiters may or may not have started yet
  check(served.current.isEmpty, "a waiter was served before the main loop ran: \(served.current)")
  runMainLoop()
  for thread in threads { thread.join() }
  check(served.current.count == waiters, "served \(served.current.count) of \(waiters) waiters")
  say("early-waiters: \(served.current.count) waiters started before the main loop were served")
}

/// After dispatchMain() the main queue is served by pool threads: the first runOnMain says so
/// once on stderr, naming AsyncRunLoopExecutorFactory, and runOnMainAndWait refuses to wait.
func lostMainQueueScenario() {
  _ = PlainThread {
    while _dispatch_get_main_queue_handle_4CF() >= 0 { usleep(1000) }  // dispatchMain() was called
    do {
      try runOnMainAndWait {}
      fail("runOnMainAndWait waited after dispatchMain()")
    } catch {
      say("runOnMainAndWait refused: \(error)")
    }
    let done = Locked(0)
    let offMain = Locked(0)
    for _ in 0..<3 {
      runOnMain {
        if !isOnMainThread { offMain.withLock { $0 += 1 } }
        done.withLock { $0 += 1 }
      }
    }
    waitUntil("the runOnMain bodies") { done.current == 3 }
    say("3 runOnMain bodies ran, \(offMain.current) of them off the main thread")
    say("lost-main-queue ok")
    exit(0)  // from this thread: it is never joined (the main thread is in dispatchMain)
  }
  dispatchMain()
}
