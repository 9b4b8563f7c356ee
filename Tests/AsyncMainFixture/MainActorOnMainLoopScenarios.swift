@_spi(ExperimentalCustomExecutors) import AsyncRunLoop
import CAsyncRunLoop
import Dispatch
import Glibc

// What an `async` main on AsyncRunLoopExecutorFactory promises: main-actor work, main-queue
// blocks and runOnMain bodies on the main thread, in call order, with the main loop's members.

/// Suspends the main actor until `condition` holds (polling every millisecond with Task.sleep,
/// which keeps the main loop serving); fails the scenario after `seconds`.
@MainActor
func waitUntil(_ what: String, seconds: Int = 20, _ condition: () -> Bool) async {
  var remaining = seconds * 1000
  while !condition() {
    remaining -= 1
    if remaining <= 0 { fail("timed out waiting for \(what)") }
    try? await Task.sleep(for: .milliseconds(1))
  }
}

/// One thread's runOnMain calls, `Task { @MainActor }` jobs and `DispatchQueue.main` blocks,
/// interleaved, run on the main thread in the order the thread made them.
@MainActor
func callOrderScenario() async {
  let calls = 3000
  let received = Locked<[Int]>([])
  let record: @Sendable (Int) -> Void = { sequence in
    check(isOnMainThread, "call \(sequence) ran on thread \(carl_gettid()), not the main thread")
    MainActor.assumeIsolated {}
    received.withLock { $0.append(sequence) }
  }
  let sender = PlainThread {
    for sequence in 0..<calls {
      switch sequence % 3 {
      case 0: runOnMain { record(sequence) }
      case 1: Task { @MainActor in record(sequence) }
      default: DispatchQueue.main.async { record(sequence) }
      }
    }
    stopMainLoop()  // after every call: runMainLoop() returns once all of them ran
  }
  await runMainLoop()
  sender.join()
  let order = received.current
  check(order == Array(0..<calls), "calls ran out of order or were lost: \(order.count) of \(calls)")
  say("call-order: \(calls) calls across runOnMain, MainActor and DispatchQueue.main, in call order")
}

/// The executor answers isolation for the main thread only: main-actor code, a main-loop
/// timer's callout (not a main-queue job) and a main-queue block are isolated; a plain thread and
/// a pool task are not.
@MainActor
func isolationScenario() async {
  let executor = MainLoopExecutor.shared
  check(executor.isIsolatingCurrentContext() == true, "main-actor code is not isolated")
  let plainThread = Locked<Bool?>(nil)
  PlainThread { plainThread.withLock { $0 = executor.isIsolatingCurrentContext() } }.join()
  check(plainThread.current == false, "a plain thread answered \(String(describing: plainThread.current))")
  let poolTask = await Task.detached { executor.isIsolatingCurrentContext() }.value
  check(poolTask == false, "a pool task answered \(String(describing: poolTask))")
  let timerCallout = Locked(false)
  let timer = LoopTimer(after: .zero) { _ in
    MainActor.assumeIsolated { MainActor.assertIsolated() }  // goes through checkIsolated
    timerCallout.withLock { $0 = true }
    stopMainLoop()
  }
  RunLoopThread.main.add(timer, to: .common)
  await runMainLoop()
  check(timerCallout.current, "the main-loop timer did not fire")
  let block = Locked(false)
  DispatchQueue.main.async {
    MainActor.assumeIsolated { block.withLock { $0 = isOnMainThread } }
  }
  await waitUntil("the main-queue block") { block.current }
  say("isolation: main actor, main-loop callout and main-queue block isolated; plain thread and pool task not")
}

/// RunLoopThread.main's timers and performed blocks, runOnMainAndWait from a plain thread and
/// `await runOnMain` from a pool task all run on the main thread while the async main runs.
@MainActor
func mainLoopMembersScenario() async {
  let loop = RunLoopThread.main
  let seen = Locked<Set<String>>([])
  let note: @Sendable (String) -> Void = { what in
    check(isOnMainThread, "\(what) ran on thread \(carl_gettid()), not the main thread")
    seen.withLock { _ = $0.insert(what) }
  }
  loop.add(LoopTimer(after: .milliseconds(1)) { _ in note("timer") }, to: .common)
  check(loop.perform { note("perform") }, "perform was refused")
  let waiter = PlainThread {
    do {
      let value = try runOnMainAndWait { () -> Int in
        note("runOnMainAndWait")
        return 7
      }
      check(value == 7, "runOnMainAndWait returned \(value)")
    } catch {
      fail("runOnMainAndWait threw \(error)")
    }
  }
  let awaited = await Task.detached { () async -> Int in
    await runOnMain { () -> Int in
      note("await runOnMain")
      return 8
    }
  }.value
  check(awaited == 8, "await runOnMain returned \(awaited)")
  let expected: Set<String> = ["timer", "perform", "runOnMainAndWait", "await runOnMain"]
  await waitUntil("every member") { seen.current == expected }
  waiter.join()
  say("members: \(seen.current.sorted()) on the main thread")
}
