import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

/// A current loop lives as long as its thread, and its shutdown ends its runs without losing jobs.
@Suite(
  "A current loop lives as long as its thread, and its shutdown ends its runs without losing jobs", .serialized,
  .timeLimit(.minutes(10)))
struct CurrentLoopLifecycleTests {
  /// `shutdownAndWait()` of a loop that does not own its thread (`RunLoopThread.current`) has no
  /// thread to join: it starts the shutdown and returns at once, without waiting for that thread
  /// (which may live on); the run in progress ends, and the thread drains the loop when it exits —
  /// the block accepted before the shutdown runs then, on that thread.
  @Test func shutdownAndWaitOfACurrentLoopEndsItsRunAndItsThreadDrainsItOnExit() async throws {
    let published = Locked<RunLoopThread?>(nil)
    let drainedOn = Locked<pthread_t?>(nil)
    let runResult = Locked<RunLoopRunResult?>(nil)
    let exit = TestGate()
    let threadDone = TestGate()
    let thread = ExecThread {
      let loop = RunLoopThread.current
      loop.add(InputSource { _ in })  // keeps the default mode alive
      loop.perform(inModes: ["never-run"]) { drainedOn.withLock { $0 = pthread_self() } }
      published.withLock { $0 = loop }
      // No deadline that a loaded machine could reach before the shutdown does (the test's
      // waits bound it instead).
      let result = loop.run(mode: .default, for: .seconds(3600))
      runResult.withLock { $0 = result }
      exit.wait(timeout: .seconds(20))  // the thread lives on after its run ended
      threadDone.open()
    }
    let loop = try #require(
      await execOnNewThread { () -> RunLoopThread? in
        while published.withLock({ $0 }) == nil { usleep(500) }
        return published.withLock { $0 }
      })
    let returned = try await withWatchdogOnThread(timeout: .seconds(20), "shutdownAndWait") {
      loop.shutdownAndWait()  // must not wait for the thread, which waits for `exit`
      return true
    }
    #expect(returned == true)
    #expect(loop.isShutDown)
    waitUntil("the run to end") { runResult.withLock { $0 } != nil }
    #expect(runResult.withLock { $0 } == .stopped)
    #expect(drainedOn.withLock { $0 } == nil, "drained before the thread exited")
    exit.open()
    threadDone.wait(timeout: .seconds(20))
    thread.join()
    waitUntil("the drain at thread exit") { drainedOn.withLock { $0 } != nil }
  }

  /// A shut-down loop that does not own its thread, whose thread lives on without running it:
  /// a job enqueued then is not lost — and must not hang for as long as the thread lives
  /// (`enqueue`: after the loop terminated the job runs on the fallback queue).
  @Test func aJobForAShutDownCurrentLoopWhoseThreadLivesOnDoesNotHang() async throws {
    let published = Locked<RunLoopThread?>(nil)
    let exit = TestGate()
    let exited = Locked(false)
    ExecThread {
      let loop = RunLoopThread.current
      published.withLock { $0 = loop }
      exit.wait(timeout: .seconds(120))  // lives on (until the test ends), never running the loop again
      exited.withLock { $0 = true }
    }.detach()
    defer { exit.open() }
    let loop = try #require(
      await execOnNewThread { () -> RunLoopThread? in
        while published.withLock({ $0 }) == nil { usleep(500) }
        return published.withLock { $0 }
      })
    loop.shutdown()
    let outcome = try await withWatchdog(timeout: .seconds(20), "a job for a shut-down current loop") {
      await withTaskExecutorPreference(loop) { (loop.isIsolatingCurrentContext() == true, exited.withLock { $0 }) }
    }
    #expect(outcome?.0 == true)
    #expect(outcome?.1 == false, "the job waited until the loop's thread exited")
  }

  /// Tasks that prefer an owned loop are started in bursts while the loop shuts down: each runs
  /// exactly once (on the loop, or on the fallback queue after termination) and in the order they
  /// were started.
  @Test func tasksStartedAcrossAShutdownRunOnceInOrder() async throws {
    var failures: [String] = []
    for attempt in 0..<4 {
      let loop = try RunLoopThread(name: "drain")
      let total = 4_000
      let order = Guarded<[Int]>([])
      let tasks = Guarded<[Task<Void, Never>]>([])
      await execOnNewThread {
        for index in 0..<total {
          let task = Task(executorPreference: loop) { order.withLock { $0.append(index) } }
          tasks.withLock { $0.append(task) }
          if index == 1_000 + attempt * 700 { loop.shutdown() }
        }
      }
      let all = tasks.snapshot
      let done: Void? = try await withWatchdog(timeout: .seconds(20), "every task across a shutdown") {
        for task in all { await task.value }
      }
      if done == nil { failures.append("attempt \(attempt): hung") }
      if order.snapshot != Array(0..<total) {
        let got = order.snapshot
        failures.append(
          "attempt \(attempt): \(got.count) ran, first misplaced \(got.indices.first { got[$0] != $0 } ?? -1)")
      }
      await execShutdown(loop)
    }
    #expect(failures == [])
  }

  /// A current loop is shut down by another thread while its thread is in a run and tasks keep
  /// arriving; the thread runs a few more short runs, then ends its runs. Every task runs exactly
  /// once, in the order started, and never two at once (on the loop's thread, then the fallback).
  @Test func aCurrentLoopShutDownMidRunKeepsItsJobsInOrderOnce() async throws {
    let total = 5_000
    let order = Guarded<[Int]>([])
    let running = AtomicCounter()
    let overlaps = AtomicCounter()
    let tasks = Guarded<[Task<Void, Never>]>([])
    let finished = try await withWatchdogOnThread(timeout: .seconds(20), "current loop shutdown") { () -> Bool in
      let loop = RunLoopThread.current
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep)
      let producer = startThread {
        for index in 0..<total {
          let task = Task(executorPreference: loop) {
            if running.increment() != 1 { overlaps.increment() }
            order.withLock { $0.append(index) }
            running.value.subtract(1, ordering: .sequentiallyConsistent)
          }
          tasks.withLock { $0.append(task) }
          if index == total / 2 { loop.shutdown() }
          if index % 500 == 0 { usleep(200) }
        }
      }
      for _ in 0..<40 { _ = loop.run(until: .now.advanced(by: .microseconds(300))) }
      joinThread(producer)
      for _ in 0..<5 { _ = loop.run(until: .now.advanced(by: .microseconds(300))) }
      keep.invalidate()
      return true
    }
    let all = tasks.snapshot
    let done: Void? = try await withWatchdog(timeout: .seconds(20), "every task") {
      for task in all { await task.value }
    }
    #expect(finished == true)
    #expect(done != nil)
    #expect(overlaps.current == 0, "two of the loop's jobs ran at once")
    #expect(order.snapshot == Array(0..<total), "jobs lost, repeated or out of order")
  }

  /// A sequence on a thread's own loop whose thread exits without running it again: the loop
  /// terminates; what was posted is delivered, then the sequence ends; `onCancel` ran once, on
  /// the exiting thread, which was still the loop's thread.
  @Test func aCurrentLoopsSequenceIsDrainedWhenItsThreadExits() async throws {
    let cancels = SequenceCallLog()
    let sequence = try await withWatchdogOnThread { () -> SourceSequence<Int> in
      let loop = RunLoopThread.current
      let sequence = loop.sourceSequence(
        of: Int.self, onCancel: { cancelLoop in cancels.record(onLoopThread: cancelLoop.isOnLoopThread) })
      for value in 0..<3 { _ = sequence.post(value) }
      return sequence
    }
    guard let sequence else { return }
    let values = try await withWatchdog(timeout: .seconds(30), "drained sequence") { () async -> [Int] in
      var values: [Int] = []
      for await value in sequence { values.append(value) }
      return values
    }
    #expect(values == [0, 1, 2])
    #expect(sequence.loop.isShutDown)
    #expect(sequence.post(9) == .terminated)
    await eventually("cancel routine") { cancels.count == 1 }
    #expect(cancels.allOnLoopThread)
  }

  /// `shutdown()` of a current loop from another thread ends its run now; a run started later
  /// ends at once; `shutdownAndWait()` returns at once; `perform` refuses and `performAndWait`
  /// throws afterwards.
  @Test func aCurrentLoopsShutdownEndsItsRunsAndRefusesWork() async throws {
    let loopBox = Guarded<RunLoopThread?>(nil)
    let running = TestGate()
    let outcome = try await withWatchdogOnThread { () -> (Bool, Bool, Bool) in
      let thread = startThread {
        let loop = RunLoopThread.current
        let keeper = InputSource(perform: { _ in })
        loop.add(keeper, to: .default)
        loopBox.withLock { $0 = loop }
        loop.perform { running.open() }
        loop.run(mode: .default)  // until the shutdown
        loop.run(mode: .default)  // after it: ends at once
        keeper.invalidate()
      }
      _ = running.wait(timeout: .seconds(20))
      let loop = loopBox.snapshot!
      loop.shutdownAndWait()  // not the loop's own thread, but it owns none: returns at once
      joinThread(thread)
      let refused = !loop.perform {}
      var threw = false
      do { _ = try loop.performAndWait { 1 } } catch { threw = true }
      return (loop.isShutDown, refused, threw)
    }
    #expect(outcome?.0 == true)
    #expect(outcome?.1 == true)
    #expect(outcome?.2 == true)
  }

  /// "The loop lives as long as its thread": `RunLoopThread.current` answers the same loop on
  /// every call from one thread, after the caller dropped its references, and another loop on
  /// another thread.
  @Test func currentIsOneLoopPerThreadForTheThreadsLife() async throws {
    let outcome = try await withWatchdogOnThread { () -> (Bool, Bool, Bool) in
      let first = WeakLoopReference()
      let identity: ObjectIdentifier = {
        let loop = RunLoopThread.current
        first.loop = loop
        return ObjectIdentifier(loop)
      }()
      let again = ObjectIdentifier(RunLoopThread.current)
      let other = Guarded<ObjectIdentifier?>(nil)
      joinThread(startThread { other.withLock { $0 = ObjectIdentifier(RunLoopThread.current) } })
      return (first.loop != nil, identity == again, other.snapshot != identity)
    }
    #expect(outcome?.0 == true)
    #expect(outcome?.1 == true)
    #expect(outcome?.2 == true)
  }

  /// `performAndWait` on a current loop its thread is not running blocks until the thread runs
  /// it; if the thread exits instead, the drain runs the accepted block and the call returns its
  /// value.
  @Test func performAndWaitOnACurrentLoopReturnsWhenItsThreadExits() async throws {
    let loopBox = Guarded<RunLoopThread?>(nil)
    let made = TestGate()
    let exit = TestGate()
    let result = try await withWatchdogOnThread { () -> (Int, Bool) in
      let thread = startThread {
        loopBox.withLock { $0 = RunLoopThread.current }
        made.open()
        _ = exit.wait(timeout: .seconds(20))
      }
      _ = made.wait(timeout: .seconds(20))
      let loop = loopBox.snapshot!
      loopBox.withLock { $0 = nil }
      let onThread = Guarded(false)
      startThread(detached: true) {
        usleep(100_000)  // let performAndWait queue its block (not asserted on)
        exit.open()
      }
      let value = try loop.performAndWait { () -> Int in
        onThread.withLock { $0 = loop.isOnLoopThread }
        return 42
      }
      joinThread(thread)
      return (value, onThread.snapshot)
    }
    #expect(result?.0 == 42)
    #expect(result?.1 == true)
  }

  /// `performAndWait` on a current loop whose thread is out of a run, then `shutdown()` from a
  /// third thread: the documented outcome is `RunLoopError.shutDown` ("if the loop has shut down
  /// (or shuts down before running it)"), not a wait for the thread to exit.
  @Test func performAndWaitOnACurrentLoopShutDownBeforeRunningItThrows() async throws {
    let thread = CommandedCurrentLoopThread()
    let loop = await thread.loop()
    let outcome = Guarded<Result<Int, any Error>?>(nil)
    let waiter = TestGate()
    ExecThread {
      waiter.open()
      let result = Result { try loop.performAndWait { 7 } }
      outcome.withLock { $0 = result }
    }.detach()
    await execOnNewThread {
      _ = waiter.wait(timeout: .seconds(20))
      _ = waitUntil("the block waiting") { loop.shared.inboxLock.withLock { !loop.shared.inbox.performs.isEmpty } }
    }
    loop.shutdown()
    // The thread runs the loop again ("runs the block when its thread next runs it").
    let rerun = await thread.exec { loop -> RunLoopRunResult in
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepAlive)
      defer { keepAlive.invalidate() }
      return loop.run(for: .milliseconds(100))
    }
    #expect(rerun == .stopped)
    let returned = await execOnNewThread {
      waitUntil(timeout: .seconds(5), "performAndWait to return after the shutdown") { outcome.snapshot != nil }
    }
    #expect(returned)
    thread.quit()  // unblocks it otherwise
    _ = await execOnNewThread { waitUntil("performAndWait after the thread exits") { outcome.snapshot != nil } }
    if case .failure(let error)? = outcome.snapshot {
      #expect(error as? RunLoopError == .shutDown(loop: loop.name))
    } else {
      Issue.record("performAndWait returned \(String(describing: outcome.snapshot)) instead of throwing shutDown")
    }
  }
}
