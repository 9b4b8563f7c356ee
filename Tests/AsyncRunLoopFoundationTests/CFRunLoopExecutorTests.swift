import AsyncRunLoopFoundation
import CoreFoundation
import Foundation
import Testing

#if canImport(Glibc)
  import Glibc
#endif

/// The calling thread's identity.
private func threadID() -> UInt { UInt(pthread_self()) }

/// `Thread.current.name` (unavailable in async code, where a task may move between threads: here
/// it runs in a job of the executor, on its thread).
private func currentFoundationThreadName() -> String? { Thread.current.name }

/// An actor pinned to a Foundation run-loop thread: records where and in which order its calls ran.
actor PinnedRecorder {
  nonisolated let executor: CFRunLoopExecutor
  nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }
  private(set) var calls: [Int] = []
  private(set) var threads: Set<UInt> = []
  private(set) var allIsolated = true

  init(executor: CFRunLoopExecutor) { self.executor = executor }

  func record(_ index: Int) {
    calls.append(index)
    threads.insert(threadID())
    if executor.isIsolatingCurrentContext() != true { allIsolated = false }
  }
}

/// A Foundation `Thread` running its run loop serves as an actor's executor: jobs run on that
/// thread, in order, isolated, next to Foundation timers; shutdown loses no job.
@Suite struct CFRunLoopExecutorTests {
  /// `startThread(name:)` starts a thread named `name`: Foundation's `Thread.current.name` and
  /// the kernel's name (what debuggers and `top -H` show) say it.
  @Test func startThreadNamesItsThread() async {
    let executor = CFRunLoopExecutor.startThread(name: "cf-named")
    defer { executor.shutdown() }
    let names = await Task(executorPreference: executor) { () -> (String?, String) in
      let comm = (try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)) ?? ""
      return (currentFoundationThreadName(), comm.trimmingCharacters(in: .newlines))
    }.value
    #expect(names.0 == "cf-named")
    #expect(names.1 == "cf-named")
  }

  @Test func actorCallsRunOnTheFoundationThreadInOrderAndIsolated() async {
    let executor = CFRunLoopExecutor.startThread(name: "cf-executor")
    defer { executor.shutdown() }
    let recorder = PinnedRecorder(executor: executor)
    for index in 0..<1000 { await recorder.record(index) }
    #expect(await recorder.calls == Array(0..<1000))
    #expect(await recorder.threads.count == 1)
    #expect(await recorder.threads.first != threadID())
    #expect(await recorder.allIsolated)
  }

  @Test func isolationIsUnknownOffTheThreadAndAssumeIsolatedHoldsOnIt() async {
    let executor = CFRunLoopExecutor.startThread(name: "cf-isolation")
    defer { executor.shutdown() }
    #expect(executor.isIsolatingCurrentContext() == nil)
    let recorder = PinnedRecorder(executor: executor)
    let onThread = await Task(executorPreference: executor) { () -> Bool in
      // A task that prefers the executor runs on its thread.
      executor.isIsolatingCurrentContext() == true
    }.value
    #expect(onThread)
    await recorder.record(0)
    #expect(await recorder.allIsolated)
  }

  @Test func foundationTimersAndJobsShareTheThread() async {
    let executor = CFRunLoopExecutor.startThread(name: "cf-timers")
    defer { executor.shutdown() }
    let recorder = PinnedRecorder(executor: executor)
    await recorder.record(0)
    let jobThread = await recorder.threads.first
    let fired = await withCheckedContinuation { (continuation: CheckedContinuation<UInt, Never>) in
      Task(executorPreference: executor) {
        // On the thread: a Foundation timer on its run loop.
        let timer = CFRunLoopTimerCreateWithHandler(nil, CFAbsoluteTimeGetCurrent() + 0.01, 0, 0, 0) { _ in
          continuation.resume(returning: threadID())
        }
        CFRunLoopAddTimer(CFRunLoopGetCurrent(), timer, kCFRunLoopDefaultMode)
      }
    }
    #expect(fired == jobThread)
  }

  @Test func shutdownWithCallsInFlightLosesNone() async {
    let executor = CFRunLoopExecutor.startThread(name: "cf-shutdown")
    let recorder = PinnedRecorder(executor: executor)
    let perTask = 2000
    await withTaskGroup(of: Void.self) { group in
      for task in 0..<4 {
        group.addTask {
          for index in 0..<perTask { await recorder.record(task * perTask + index) }
        }
      }
      group.addTask {
        try? await Task.sleep(for: .milliseconds(5))
        executor.shutdown()
      }
    }
    let calls = await recorder.calls
    #expect(calls.count == 4 * perTask)
    #expect(Set(calls).count == 4 * perTask)
    for task in 0..<4 {
      let mine = calls.filter { $0 / perTask == task }
      #expect(mine == Array(task * perTask..<(task + 1) * perTask))
    }
    #expect(await recorder.allIsolated)
  }
}
