import AsyncRunLoopFoundation
import CoreFoundation
import Dispatch
import Foundation
import Testing

#if canImport(Glibc)
  import Glibc
#endif

/// An actor pinned to a `CFRunLoopExecutor` whose method can run the thread's run loop itself.
actor NestingRecorder {
  nonisolated let executor: CFRunLoopExecutor
  nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }
  let events = BridgeTestLog()

  init(executor: CFRunLoopExecutor) { self.executor = executor }

  /// Opens `entered`, then runs the run loop in the default mode (a common mode, where the
  /// executor's blocks run), 20 ms at a time, until `released` has an entry; returns how each of
  /// those nested runs ended.
  func nest(until released: BridgeTestLog, entered: DispatchSemaphore) -> [CFRunLoopRunResult] {
    events.append("nested run starts")
    entered.signal()
    var results: [CFRunLoopRunResult] = []
    repeat {
      results.append(CFRunLoopRunInMode(kCFRunLoopDefaultMode, 0.02, false))
    } while released.snapshot.isEmpty
    events.append("nested run ends")
    return results
  }

  func record(_ event: String) -> Bool {
    events.append(event)
    return executor.isIsolatingCurrentContext() == true
  }
}

/// A list of events any thread may append to.
final class BridgeTestLog: @unchecked Sendable {  // Safety: proof below
  // Safety: `entries` is only touched with `lock` held.
  private let lock = NSLock()
  private var entries: [String] = []

  func append(_ entry: String) { lock.withLock { entries.append(entry) } }
  var snapshot: [String] { lock.withLock { entries } }
}

/// `CFRunLoopExecutor`'s shutdown: a job that runs the thread's run loop itself keeps the executor
/// serial and is not cut short, and once the executor has terminated its thread is no longer
/// isolated to it (its fallback queue is).
@Suite struct CFRunLoopExecutorShutdownTests {
  /// The type's doc: a job that runs the run loop itself runs no other job meanwhile, and a
  /// `shutdown()` during it waits for it to return (its final drain neither runs jobs under the
  /// job nor stops the nested run). A job queued meanwhile runs after the job, isolated.
  @Test func aShutdownDuringAJobsNestedRunWaitsForTheJobAndRunsNoJobUnderIt() async throws {
    let executor = CFRunLoopExecutor.startThread(name: "cf-nested-shutdown")
    let recorder = NestingRecorder(executor: executor)
    let entered = DispatchSemaphore(value: 0)
    let released = BridgeTestLog()
    let nesting = Task { await recorder.nest(until: released, entered: entered) }
    #expect(await waitOffThePool(entered), "the nested run did not start")
    // A job for the same actor, enqueued while the nested run goes on, then the shutdown.
    let queued = Task { await recorder.record("queued job runs") }
    try await Task.sleep(for: .milliseconds(20))
    executor.shutdown()
    // The job keeps running the loop until after `shutdown()` returned, so the final drain's block
    // comes up in its nested runs.
    try await Task.sleep(for: .milliseconds(100))
    released.append("released")
    let results = await nesting.value
    #expect(!results.contains(.stopped), "a nested run was stopped by the shutdown: \(results)")
    #expect(await queued.value, "the queued job ran without the executor's isolation")
    let events = recorder.events.snapshot
    #expect(events == ["nested run starts", "nested run ends", "queued job runs"])
    // Terminated: a later job still runs isolated (on the fallback queue).
    let late = await recorder.record("late job runs")
    #expect(late)
  }

  /// `shutdown()` ends a `startThread` thread also when its final drain came up in a run nested in
  /// a Foundation timer's handler (not a job): that run is stopped, and so is the thread's outer
  /// run, which then exits.
  @Test func aShutdownDuringARunNestedInATimersHandlerStillEndsTheThread() async throws {
    let executor = CFRunLoopExecutor.startThread(name: "cf-nested-timer")
    let entered = DispatchSemaphore(value: 0)
    let released = BridgeTestLog()
    let thread = await Task(executorPreference: executor) { () -> String? in
      let timer = CFRunLoopTimerCreateWithHandler(nil, CFAbsoluteTimeGetCurrent(), 0, 0, 0) { _ in
        entered.signal()
        repeat { _ = CFRunLoopRunInMode(kCFRunLoopDefaultMode, 0.02, false) } while released.snapshot.isEmpty
      }
      CFRunLoopAddTimer(CFRunLoopGetCurrent(), timer, kCFRunLoopDefaultMode)
      return currentKernelThreadID()
    }.value
    let id = try #require(thread)
    #expect(await waitOffThePool(entered), "the timer did not fire")
    #expect(threadExists(id) == true)
    executor.shutdown()
    try await Task.sleep(for: .milliseconds(100))
    released.append("released")
    let deadline = ContinuousClock.now.advanced(by: .seconds(20 * watchdogScale))
    while threadExists(id) != false && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
    #expect(threadExists(id) == false, "the executor's thread did not exit")
  }

  /// `runUntilTerminated()`: a thread that made its executor with `init()` serves its jobs until
  /// the executor's final drain, and then the call returns; later jobs run on the fallback queue.
  @Test func runUntilTerminatedServesAnInitExecutorUntilItsShutdownThenReturns() async throws {
    let published = DispatchSemaphore(value: 0)
    let returned = DispatchSemaphore(value: 0)
    let box = ExecutorBox()
    let thread = Thread {
      let executor = CFRunLoopExecutor()
      box.executor = executor
      published.signal()
      executor.runUntilTerminated()
      returned.signal()
    }
    thread.start()
    #expect(await waitOffThePool(published))
    let executor = try #require(box.executor)
    let recorder = NestingRecorder(executor: executor)
    #expect(await recorder.record("served by the thread"))
    executor.shutdown()
    #expect(await waitOffThePool(returned), "runUntilTerminated() did not return after the shutdown")
    #expect(await recorder.record("served by the fallback"))
    #expect(recorder.events.snapshot == ["served by the thread", "served by the fallback"])
  }

  /// `runUntilTerminated()`: once the executor has terminated it stops only its own run; runs
  /// nested in the loop's callouts (a timer handler that waits by running the loop) are left
  /// alone, the one the final drain comes up in too, and the call returns once that callout has
  /// returned.
  @Test func runUntilTerminatedLeavesRunsNestedInACalloutAloneAfterTheTermination() async throws {
    let published = DispatchSemaphore(value: 0)
    let entered = DispatchSemaphore(value: 0)
    let returned = DispatchSemaphore(value: 0)
    let shutDown = BridgeTestLog()
    let released = BridgeTestLog()
    let nestedSinceShutdown = BridgeTestLog()
    let box = ExecutorBox()
    let thread = Thread {
      let executor = CFRunLoopExecutor()
      box.executor = executor
      box.runLoop = CFRunLoopGetCurrent()
      let timer = CFRunLoopTimerCreateWithHandler(nil, CFAbsoluteTimeGetCurrent(), 0, 0, 0) { _ in
        entered.signal()
        repeat {
          let result = CFRunLoopRunInMode(kCFRunLoopDefaultMode, 0.01, false)
          if !shutDown.snapshot.isEmpty {
            nestedSinceShutdown.append(result == .timedOut ? "timed out" : "ended early: \(result)")
          }
        } while released.snapshot.isEmpty
      }
      CFRunLoopAddTimer(CFRunLoopGetCurrent(), timer, kCFRunLoopDefaultMode)
      published.signal()
      executor.runUntilTerminated()
      returned.signal()
    }
    thread.start()
    #expect(await waitOffThePool(published))
    #expect(await waitOffThePool(entered), "the timer did not fire")
    let executor = try #require(box.executor)
    let runLoop = RunLoopReference(runLoop: try #require(box.runLoop))
    // Every nested run from here on is recorded: also the one the final drain comes up in.
    shutDown.append("shut down")
    executor.shutdown()
    // Terminated once a job runs off the thread (on the fallback queue): the final drain came up
    // in the handler's nested runs.
    let deadline = ContinuousClock.now.advanced(by: .seconds(20 * watchdogScale))
    var ranOnTheThread = true
    while ranOnTheThread && ContinuousClock.now < deadline {
      ranOnTheThread = await Task(executorPreference: executor) { CFEqual(CFRunLoopGetCurrent(), runLoop.runLoop) }
        .value
      if ranOnTheThread { try await Task.sleep(for: .milliseconds(5)) }
    }
    #expect(!ranOnTheThread, "no job ran on the fallback queue: the executor did not terminate")
    let recordedAtTermination = nestedSinceShutdown.snapshot.count
    while nestedSinceShutdown.snapshot.count < recordedAtTermination + 3 && ContinuousClock.now < deadline {
      try await Task.sleep(for: .milliseconds(5))
    }
    released.append("released")
    #expect(await waitOffThePool(returned), "runUntilTerminated() did not return once the callout returned")
    let results = nestedSinceShutdown.snapshot
    #expect(results.count >= recordedAtTermination + 3)
    #expect(results.allSatisfy { $0 == "timed out" }, "a nested run was ended by the shutdown: \(results)")
  }

  /// `runUntilTerminated()` traps in one of the executor's jobs, where it could never return (an
  /// alarm ends the child instead if it hangs: SIGALRM, not the trap's SIGILL).
  @Test func runUntilTerminatedInOneOfTheExecutorsJobsTraps() async {
    await #expect(processExitsWith: .signal(SIGILL)) {
      alarm(30)
      let executor = CFRunLoopExecutor.startThread(name: "cf-run-in-job")
      await Task(executorPreference: executor) { serveUntilTerminated(executor) }.value
    }
  }

  /// `runUntilTerminated()` traps off the executor's thread.
  @Test func runUntilTerminatedOffTheExecutorsThreadTraps() async {
    await #expect(processExitsWith: .signal(SIGILL)) {
      alarm(30)
      serveUntilTerminated(CFRunLoopExecutor.startThread(name: "cf-run-elsewhere"))
    }
  }

  /// `isIsolatingCurrentContext()`: true on the thread until the executor has terminated, nil
  /// there afterwards (the fallback queue runs its jobs now), true on the fallback queue.
  @Test func afterTheFinalDrainTheThreadIsNoLongerIsolatedAndTheFallbackIs() async throws {
    let published = DispatchSemaphore(value: 0)
    let box = ExecutorBox()
    let stop = BridgeTestLog()
    let thread = Thread {
      box.executor = CFRunLoopExecutor()
      box.runLoop = CFRunLoopGetCurrent()
      // A timer far in the future keeps the default mode from being empty.
      let keepAlive = CFRunLoopTimerCreateWithHandler(nil, CFAbsoluteTimeGetCurrent() + 1e6, 1e6, 0, 0) { _ in }
      CFRunLoopAddTimer(CFRunLoopGetCurrent(), keepAlive, kCFRunLoopDefaultMode)
      published.signal()
      while stop.snapshot.isEmpty { _ = CFRunLoopRunInMode(kCFRunLoopDefaultMode, 0.05, false) }
      CFRunLoopTimerInvalidate(keepAlive)
    }
    thread.start()
    #expect(await waitOffThePool(published))
    let (executor, runLoop) = (box.executor!, box.runLoop!)
    defer { stop.append("stop") }
    #expect(await onThread(of: runLoop) { executor.isIsolatingCurrentContext() } == true)
    // A timer sequence ends at the final drain: after the end, the executor has terminated.
    let ticks = executor.timer(every: .seconds(3600))
    executor.shutdown()
    for await _ in ticks {}
    #expect(await onThread(of: runLoop) { executor.isIsolatingCurrentContext() } == nil)
    let recorder = NestingRecorder(executor: executor)
    #expect(await recorder.record("on the fallback"))
  }

  /// Runs `body` on `runLoop`'s thread (a block in its default mode) and returns its result.
  private func onThread(of runLoop: CFRunLoop, _ body: @escaping @Sendable () -> Bool?) async -> Bool? {
    let reference = RunLoopReference(runLoop: runLoop)
    return await withCheckedContinuation { (continuation: CheckedContinuation<Bool?, Never>) in
      CFRunLoopPerformBlock(reference.runLoop, kCFRunLoopDefaultMode) {
        continuation.resume(returning: body())
      }
      CFRunLoopWakeUp(reference.runLoop)
    }
  }
}

/// The executor and run loop a test's Foundation thread publishes.
final class ExecutorBox: @unchecked Sendable {  // Safety: proof below
  // Safety: written once on the thread before it signals a semaphore, read after the test waited
  // on that semaphore.
  var executor: CFRunLoopExecutor?
  var runLoop: CFRunLoop?
}

/// A CF run loop handed to another thread.
struct RunLoopReference: @unchecked Sendable {  // Safety: proof below
  // Safety: immutable; only passed to CFRunLoopPerformBlock and CFRunLoopWakeUp, which any thread
  // may call, and compared with CFEqual (which reads nothing that changes).
  let runLoop: CFRunLoop
}

/// `runUntilTerminated()` from a synchronous context (it is unavailable in async code).
func serveUntilTerminated(_ executor: CFRunLoopExecutor) {
  executor.runUntilTerminated()
}
