import AsyncRunLoop
import AsyncRunLoopFoundation
import CoreFoundation
import Foundation

// Timers and performed blocks of both loops fire on the main thread, in deadline order, under
// either driver; an idle process with far timers on both sides uses no CPU.

/// What fired, in order; each entry checked to be on the main thread.
let firings = Locked<[String]>([])

func note(_ name: String) {
  check(isOnMainThread, "\(name) ran off the main thread")
  firings.withLock { $0.append(name) }
}

/// Far apart, so that a loaded machine does not make two deadlines due in the same wake-up
/// (two loops' overdue timers cannot be ordered across the loops).
let timerSpacing = 0.25

/// Schedules Foundation and AsyncRunLoop timers interleaved, a Foundation perform from the main
/// thread, a CF block from another thread, then an idle phase; calls `finish` at the end.
func scheduleTimersAndIdle(finish: @escaping @Sendable () -> Void) {
  _ = Timer.scheduledTimer(withTimeInterval: 2 * timerSpacing, repeats: false) { _ in note("foundation-2") }
  _ = Timer.scheduledTimer(withTimeInterval: 4 * timerSpacing, repeats: false) { _ in note("foundation-4") }
  RunLoopThread.main.add(LoopTimer(after: .seconds(timerSpacing)) { _ in note("loop-1") })
  RunLoopThread.main.add(LoopTimer(after: .seconds(3 * timerSpacing)) { _ in note("loop-3") })
  RunLoop.main.perform { note("foundation-perform") }
  startThread {
    CFRunLoopPerformBlock(CFRunLoopGetMain(), kCFRunLoopDefaultMode) { note("cf-block") }
    CFRunLoopWakeUp(CFRunLoopGetMain())
  }
  RunLoopThread.main.add(
    LoopTimer(after: .seconds(5 * timerSpacing)) { _ in
      note("loop-5")
      // Idle: both loops hold a far timer and nothing else happens for two seconds. A polling
      // bridge (a periodic "tickler") would show here; the bound is far below any such timer's
      // cost and far above the few wake-ups of an idle process.
      _ = Timer.scheduledTimer(withTimeInterval: 3600, repeats: false) { _ in }
      RunLoopThread.main.add(LoopTimer(after: .seconds(3600)) { _ in })
      let before = processCPUNanoseconds()
      RunLoopThread.main.add(
        LoopTimer(after: .seconds(2)) { _ in
          let used = processCPUNanoseconds() - before
          say("idle CPU over 2 s: \(used / 1000) us")
          check(used < 20_000_000, "the idle bridged loops used \(used / 1_000_000) ms of CPU in 2 s")
          finish()
        })
    })
}

func checkTimerOrder() {
  let seen = firings.snapshot
  let timerNames: Set = ["loop-1", "foundation-2", "loop-3", "foundation-4", "loop-5"]
  let timers = seen.filter { timerNames.contains($0) }
  check(timers == ["loop-1", "foundation-2", "loop-3", "foundation-4", "loop-5"], "timers fired as \(seen)")
  check(seen.contains("foundation-perform"), "RunLoop.main.perform did not run: \(seen)")
  check(seen.contains("cf-block"), "CFRunLoopPerformBlock did not run: \(seen)")
  say("fired: \(seen)")
}

/// `runMainLoop()` drives; Foundation's run loop is served through the bridge.
func ourDriverTimersScenario() {
  MainLoopBridge.install()
  scheduleTimersAndIdle { stopMainLoop() }
  runMainLoop()
  checkTimerOrder()
}

/// `RunLoop.main.run(mode:before:)` drives; our main loop is served through the bridge, with
/// `runOnMain`, `runOnMainAndWait`, `@MainActor` tasks and `perform` from other threads.
func foundationDriverTimersScenario() {
  MainLoopBridge.install()
  let done = Locked(false)
  scheduleTimersAndIdle {
    done.withLock { $0 = true }
    CFRunLoopStop(CFRunLoopGetMain())
  }
  // Started from a block that runs under RunLoop.main.run(): the main loop is served from then
  // on (before that, runOnMainAndWait would rightly throw wouldDeadlock).
  RunLoop.main.perform { startThread { sendFromAnotherThread() } }
  while !done.snapshot {
    _ = RunLoop.main.run(mode: .default, before: Date(timeIntervalSinceNow: 10))
  }
  checkTimerOrder()
  let seen = firings.snapshot
  for name in ["loop-perform", "run-on-main", "main-actor", "run-on-main-and-wait"] {
    check(seen.contains(name), "\(name) did not run under RunLoop.main.run(): \(seen)")
  }
}

/// Work for the main loop from another thread, by each route.
private func sendFromAnotherThread() {
  _ = RunLoopThread.main.perform(inModes: [.default]) { note("loop-perform") }
  runOnMain { note("run-on-main") }
  Task { @MainActor in note("main-actor") }
  do {
    let value = try runOnMainAndWait { () -> Int in
      note("run-on-main-and-wait")
      return 42
    }
    check(value == 42, "runOnMainAndWait returned \(value)")
  } catch {
    fail("runOnMainAndWait threw \(error) under RunLoop.main.run()")
  }
}

/// `while … { RunLoop.main.run(mode:before:) }`: a caller that blocks in `runOnMainAndWait` while
/// the main thread is between two of those runs waits for the next one; it is not refused.
func foundationDriverBetweenRunsScenario() {
  MainLoopBridge.install()
  // One CF run first: from then on CF serves the main loop.
  _ = RunLoop.main.run(mode: .default, before: Date(timeIntervalSinceNow: 0.01))
  let call = BlockedMainCall()
  // Between two runs, long enough for the caller to have blocked (or been refused).
  usleep(200_000)
  check(call.outcome.snapshot == nil, "runOnMainAndWait ended between two CF runs: \(call.outcome.snapshot ?? "")")
  while call.outcome.snapshot == nil {
    _ = RunLoop.main.run(mode: .default, before: Date(timeIntervalSinceNow: 0.05))
  }
  check(call.outcome.snapshot == "returned 7", "runOnMainAndWait \(call.outcome.snapshot ?? "")")
}

/// A caller blocked between two `RunLoop.main.run(mode:before:)` calls is released with an error
/// when the main loop is shut down meanwhile (no further Foundation run comes).
func foundationDriverShutdownBetweenRunsScenario() {
  MainLoopBridge.install()
  _ = RunLoop.main.run(mode: .default, before: Date(timeIntervalSinceNow: 0.01))
  let call = BlockedMainCall()
  usleep(200_000)
  check(call.outcome.snapshot == nil, "runOnMainAndWait ended between two CF runs: \(call.outcome.snapshot ?? "")")
  RunLoopThread.main.shutdown()
  check(call.waitForEnd(seconds: 2), "runOnMainAndWait still blocked 2 s after the main loop shut down")
  check(call.outcome.snapshot == "refused", "runOnMainAndWait \(call.outcome.snapshot ?? "")")
}
