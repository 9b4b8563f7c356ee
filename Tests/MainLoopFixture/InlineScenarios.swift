import AsyncRunLoop
import Dispatch
import Glibc

/// What the inline checks saw, on the main actor.
@MainActor var inlineLog: [String] = []
/// True while a caller's frame is active: a body that sees it true ran nested in that call.
@MainActor var callerFrameActive = false
/// Set by a main-queue block queued before an `await runOnMain`: it must not run first.
@MainActor var queuedBlockRan = false

/// On the main thread, every form runs its body inline: nested in the caller's frame (the same
/// call stack), before the call returns, ahead of work queued earlier — checked from synchronous
/// top-level code, a main-queue block, a MainActor task, a main loop perform block and timer, and
/// an actor on the main loop.
func inlineScenario() {
  MainActor.assumeIsolated { checkSynchronousFormsInline(in: "synchronous top-level code") }
  let loop = RunLoopThread.main
  let contexts = Locked(0)
  let expectedContexts = 6
  let contextDone: @Sendable () -> Void = {
    if contexts.withLock({ count in
      count += 1
      return count == expectedContexts
    }) {
      stopMainLoop()
    }
  }
  DispatchQueue.main.async {
    MainActor.assumeIsolated { checkSynchronousFormsInline(in: "a DispatchQueue.main block") }
    contextDone()
  }
  Task { @MainActor in
    checkSynchronousFormsInline(in: "a MainActor task")
    await checkAwaitFormInline(in: "a MainActor task")
    contextDone()
  }
  loop.perform {
    MainActor.assumeIsolated { checkSynchronousFormsInline(in: "a RunLoopThread.main.perform block") }
    contextDone()
  }
  loop.add(
    LoopTimer(after: .milliseconds(2)) { _ in
      MainActor.assumeIsolated { checkSynchronousFormsInline(in: "a main loop timer") }
      contextDone()
    }, to: .common)
  Task.detached {
    await InlineCheckingActor().check()
    contextDone()
  }
  Task(executorPreference: loop) {
    await checkAwaitFormInline(in: "a task preferring RunLoopThread.main")
    contextDone()
  }
  runMainLoop()
  check(contexts.current == expectedContexts, "only \(contexts.current) contexts checked")
  say("inline in \(expectedContexts + 1) main-thread contexts")
}

/// An actor on the main loop: its `await runOnMain` runs inline too (same thread, no hop).
actor InlineCheckingActor: LoopActor {
  nonisolated let loop: RunLoopThread = .main

  func check() async {
    loop.checkIsolated()
    await checkAwaitFormInline(in: "an actor on RunLoopThread.main")
  }
}

@MainActor
func checkSynchronousFormsInline(in context: String) {
  expectMainThreadAndMainActor(context)
  // Fire and forget: runs before runOnMain returns, nested in this frame.
  inlineLog = ["before"]
  callerFrameActive = true
  runOnMain {
    check(callerFrameActive, "\(context): runOnMain's body did not run inside the caller's frame")
    inlineLog.append("inside")
  }
  inlineLog.append("after")
  check(inlineLog == ["before", "inside", "after"], "\(context): runOnMain order was \(inlineLog)")
  // Wait until done: inline too (waiting for ourselves would deadlock), value and error returned.
  do {
    let value = try runOnMainAndWait {
      check(callerFrameActive, "\(context): runOnMainAndWait's body did not run inside the caller's frame")
      return 11
    }
    check(value == 11, "\(context): runOnMainAndWait returned \(value)")
  } catch {
    fail("\(context): runOnMainAndWait threw \(error)")
  }
  do {
    try runOnMainAndWait { () throws(FixtureError) -> Void in throw FixtureError(code: 3) }
    fail("\(context): runOnMainAndWait did not rethrow")
  } catch let error as FixtureError {
    check(error.code == 3, "\(context): rethrown error was \(error)")
  } catch {
    fail("\(context): runOnMainAndWait threw \(error)")
  }
  callerFrameActive = false
}

/// `await runOnMain` on the main thread does not suspend: a main-queue block queued just before
/// it has not run when it returns (a hop to the main actor would queue behind that block).
nonisolated(nonsending) func checkAwaitFormInline(in context: String) async {
  check(isOnMainThread, "\(context): not on the main thread")
  await runOnMain { queuedBlockRan = false }
  DispatchQueue.main.async { MainActor.assumeIsolated { queuedBlockRan = true } }
  let value = await runOnMain {
    check(!queuedBlockRan, "\(context): await runOnMain's body ran after work queued before it")
    return 5
  }
  check(value == 5, "\(context): await runOnMain returned \(value)")
  let stillQueued = await runOnMain { !queuedBlockRan }
  check(stillQueued, "\(context): await runOnMain suspended (queued work ran in between)")
  do throws(FixtureError) {
    try await runOnMain { () throws(FixtureError) -> Void in throw FixtureError(code: 4) }
    fail("\(context): await runOnMain did not rethrow")
  } catch {
    check(error.code == 4, "\(context): rethrown error was \(error)")
  }
}
