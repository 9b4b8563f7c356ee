import Glibc
import Testing

@testable import AsyncRunLoop

/// An actor pinned to a `RunLoopThread.current` loop: counts its calls, where they ran, and
/// whether two of its jobs ever overlapped.
actor CurrentLoopCounter: LoopActor {
  nonisolated let loop: RunLoopThread
  nonisolated let overlap = JobOverlapCounter()
  private(set) var calls = 0

  init(loop: RunLoopThread) { self.loop = loop }

  /// One call: whether it ran isolated to the loop, and whether on the loop's own thread.
  func call() -> (isolated: Bool, onLoopThread: Bool) {
    overlap.enter()
    defer { overlap.leave() }
    calls += 1
    return (loop.isIsolatingCurrentContext() == true, loop.isOnLoopThread)
  }
}

/// A thread that binds a `RunLoopThread.current` loop, publishes it, runs `body` with it and
/// then lives on (never running the loop again) until `exit` opens.
private final class CurrentLoopThread: Sendable {
  let exit = TestGate()
  let exited = TestGate()
  private let published = Locked<RunLoopThread?>(nil)

  init(_ body: @escaping @Sendable (RunLoopThread) -> Void = { _ in }) {
    ExecThread { [published, exit, exited] in
      let loop = RunLoopThread.current
      published.withLock { $0 = loop }
      body(loop)
      exit.wait(timeout: .seconds(3600))
      exited.open()
    }.detach()
  }

  /// The thread's loop, once it has one.
  func loop() async -> RunLoopThread {
    await execOnNewThread { [published] in
      while published.withLock({ $0 }) == nil { usleep(500) }
      return published.withLock { $0! }
    }
  }

  /// Shuts the loop down (so that a body still in a run returns) and lets the thread exit,
  /// without waiting for it: this runs in `defer` on a cooperative-pool thread, which must not
  /// block (a body stuck after a failure would hold it for the whole wait).
  func end() {
    published.withLock { $0 }?.shutdown()
    exit.open()
  }
}

/// Jobs waiting in `loop`'s inbox (white-box: how many calls were accepted and wait).
private func waitingJobs(_ loop: RunLoopThread) -> Int {
  loop.shared.inboxLock.withLock { loop.shared.inbox.jobs.count }
}

/// A `RunLoopThread.current` loop is drained only by its own thread, when that thread exits. Its
/// jobs must not wait that long once it is shut down: out of a run, its thread runs no job, so
/// they go to the fallback (still isolated to the loop, one at a time), none lost, none twice.
@Suite("CurrentLoopShutdown: a shut-down current loop's jobs never wait for its thread", .timeLimit(.minutes(10)))
struct CurrentLoopShutdownTests {
  /// Calls accepted while the thread was out of a run (waiting in the inbox) run once the loop
  /// is shut down, while the thread lives on: each exactly once, isolated, one at a time.
  @Test func callsWaitingWhenTheLoopIsShutDownRunWhileItsThreadLivesOn() async throws {
    let thread = CurrentLoopThread()
    defer { thread.end() }
    let loop = await thread.loop()
    let counter = CurrentLoopCounter(loop: loop)
    let callers = 40
    let outcome = try await withWatchdog(timeout: .seconds(20), "calls waiting at shutdown") {
      try await withThrowingTaskGroup(of: (isolated: Bool, onLoopThread: Bool).self) { group in
        for _ in 0..<callers { group.addTask { await counter.call() } }
        // Every call waits in the inbox: the thread is not running the loop.
        while waitingJobs(loop) < callers { try await Task.sleep(for: .milliseconds(1)) }
        loop.shutdown()
        var results: [(isolated: Bool, onLoopThread: Bool)] = []
        for try await result in group { results.append(result) }
        return results
      }
    }
    #expect(outcome?.count == callers)
    #expect(outcome?.allSatisfy { $0.isolated && !$0.onLoopThread } == true)
    #expect(await counter.calls == callers)
    #expect(counter.overlap.maximum == 1)
    #expect(!thread.exited.opened, "the calls waited for the loop's thread to exit")
  }

  /// A shutdown from another thread while the thread runs the loop ends that run; the thread
  /// lives on outside it, and a call made then does not wait for the thread to exit.
  @Test func aShutdownDuringARunLeavesLaterCallsToTheFallback() async throws {
    let ranBefore = Locked<(isolated: Bool, onLoopThread: Bool)?>(nil)
    let runResult = Locked<RunLoopRunResult?>(nil)
    let started = TestGate()
    let thread = CurrentLoopThread { loop in
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepAlive)
      started.open()
      runResult.withLock { $0 = loop.run(for: .seconds(3600)) }
      keepAlive.invalidate()
    }
    defer { thread.end() }
    let loop = await thread.loop()
    let counter = CurrentLoopCounter(loop: loop)
    let outcome = try await withWatchdog(timeout: .seconds(20), "a call after a shutdown during a run") {
      () async -> (isolated: Bool, onLoopThread: Bool) in
      await execOnNewThread { _ = started.wait(timeout: .seconds(20)) }
      ranBefore.withLock { $0 = nil }
      let before = await counter.call()  // the run serves it, on the loop's thread
      ranBefore.withLock { $0 = before }
      loop.shutdown()
      _ = await execOnNewThread { waitUntil("the run to end") { runResult.withLock { $0 } != nil } }
      return await counter.call()
    }
    #expect(ranBefore.withLock { $0 }.map { $0.isolated && $0.onLoopThread } == true)
    #expect(runResult.withLock { $0 } == .stopped)
    #expect(outcome.map { $0.isolated && !$0.onLoopThread } == true)
    #expect(await counter.calls == 2)
    #expect(!thread.exited.opened)
  }

  /// The thread enters and leaves short runs over and over while tasks call an actor on the loop
  /// and another thread shuts it down at some point: every call completes exactly once, no two of
  /// the actor's jobs ever overlap (the thread and the fallback never both run them), and none
  /// waits for the thread to exit.
  @Test func shutdownRacingRunsNeverRunsTwoJobsAtOnceAndLosesNone() async throws {
    let rounds = 10 * stressFactor
    for round in 0..<rounds {
      let thread = CurrentLoopThread { loop in
        let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
        loop.add(keepAlive)
        while !loop.isShutDown { loop.run(for: .microseconds(200)) }
        keepAlive.invalidate()
      }
      let loop = await thread.loop()
      let counter = CurrentLoopCounter(loop: loop)
      let (tasks, calls) = (4, 50)
      let isolated = Locked(0)
      let outcome: Void? = try await withWatchdog(timeout: .seconds(20), "calls racing a shutdown, round \(round)") {
        await execConcurrently(
          tasks: tasks, times: calls,
          {
            if await counter.call().isolated { isolated.withLock { $0 += 1 } }
          },
          alongside: {
            usleep(UInt32(200 * (round % 7)))
            loop.shutdown()
          })
      }
      #expect(outcome != nil)
      #expect(await counter.calls == tasks * calls)
      #expect(isolated.withLock { $0 } == tasks * calls)
      #expect(counter.overlap.maximum == 1, "round \(round): two jobs of the actor overlapped")
      #expect(!thread.exited.opened)
      thread.end()
    }
  }
}

/// Sleeps pending on a current loop's timers when it is shut down, its thread out of a run: they
/// must not wait for the thread to exit either (its drain, which invalidates the timers, happens
/// only then). A `Task.sleep` completes at its deadline elsewhere, never early; a `clock` sleep
/// throws `CancellationError` as the docs say for a loop's shutdown.
@Suite("CurrentLoopShutdown: sleeps on a shut-down current loop", .timeLimit(.minutes(10)))
struct CurrentLoopShutdownSleepTests {
  /// Sleeps registered with the loop's shutdown (white-box: no other hand-off is made here).
  private func pendingSleeps(_ loop: RunLoopThread) -> Int {
    loop.shared.inboxLock.withLock { loop.shared.divertHandOffs.count }
  }

  @Test func aTaskSleepPendingAtShutdownEndsAtItsDeadlineNotAtThreadExit() async throws {
    // The thread runs the loop in short runs until the shutdown (a task preferring a loop that
    // nobody runs never starts), then lives on.
    let thread = CurrentLoopThread { loop in
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepAlive)
      while !loop.isShutDown { loop.run(for: .milliseconds(5)) }
      keepAlive.invalidate()
    }
    defer { thread.end() }
    let loop = await thread.loop()
    // Long enough that the shutdown comes first even on a loaded machine (scaled like the
    // watchdogs); the wait below also ends if the sleep ended first (the test then proves less,
    // but never hangs).
    let duration = Duration.milliseconds(1000 * watchdogScale)
    let finished = Locked(false)
    let outcome = try await withWatchdog(timeout: .seconds(20), "a Task.sleep on a shut-down current loop") {
      () async throws -> (slept: Duration, isolated: Bool) in
      async let slept: (Duration, Bool) = withTaskExecutorPreference(loop) {
        let start = ContinuousClock.now
        try await Task.sleep(for: duration)
        finished.withLock { $0 = true }
        return (ContinuousClock.now - start, loop.isIsolatingCurrentContext() == true)
      }
      while pendingSleeps(loop) < 1 && !finished.withLock({ $0 }) { try await Task.sleep(for: .milliseconds(1)) }
      loop.shutdown()
      return try await slept
    }
    #expect(outcome.map { $0.slept >= duration } == true, "the sleep ended early")
    #expect(outcome?.isolated == true, "the sleeper resumed off the loop's executor (the fallback)")
    #expect(!thread.exited.opened, "the sleep waited for the loop's thread to exit")
    #expect(pendingSleeps(loop) == 0)
  }

  @Test func aClockSleepPendingAtShutdownThrowsCancellationWithoutWaitingForTheThread() async throws {
    let thread = CurrentLoopThread()
    defer { thread.end() }
    let loop = await thread.loop()
    let outcome = try await withWatchdog(timeout: .seconds(20), "a clock sleep on a shut-down current loop") {
      () async -> String in
      async let ended: String = {
        do {
          try await loop.clock.sleep(for: .seconds(3600))
          return "returned"
        } catch is CancellationError {
          return "cancelled"
        } catch {
          return "\(error)"
        }
      }()
      while pendingSleeps(loop) < 1 { try? await Task.sleep(for: .milliseconds(1)) }
      loop.shutdown()
      return await ended
    }
    #expect(outcome == "cancelled")
    #expect(!thread.exited.opened)
  }

  @Test func sleepsStartedAfterTheJobsLeftNeitherHangNorEndEarly() async throws {
    let thread = CurrentLoopThread()
    defer { thread.end() }
    let loop = await thread.loop()
    loop.shutdown()  // the thread is out of a run: the jobs leave now
    let outcome = try await withWatchdog(timeout: .seconds(20), "sleeps after the shutdown") {
      () async -> (slept: Duration, clock: Bool) in
      let start = ContinuousClock.now
      try? await withTaskExecutorPreference(loop) { try await Task.sleep(for: .milliseconds(100)) }
      let slept = ContinuousClock.now - start
      let cancelled: Bool
      do {
        try await loop.clock.sleep(for: .seconds(3600))
        cancelled = false
      } catch {
        cancelled = error is CancellationError
      }
      return (slept, cancelled)
    }
    #expect(outcome.map { $0.slept >= .milliseconds(100) } == true)
    #expect(outcome?.clock == true)
    #expect(pendingSleeps(loop) == 0)
  }
}
