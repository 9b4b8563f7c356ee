import Glibc
import Testing

@testable import AsyncRunLoop

/// A `runModal` of an hour in `mode`, as a result.
private func modalRun(on loop: RunLoopThread, mode: RunLoopMode) async -> Result<RunLoopRunResult, RunLoopError> {
  do throws(RunLoopError) {
    return .success(try await loop.runModal(mode: mode, for: .seconds(3600)))
  } catch {
    return .failure(error)
  }
}

/// The blocks waiting in `loop`'s inbox (white-box: a `runModal` waits there until its run starts).
private func waitingBlocks(_ loop: RunLoopThread) -> Int {
  loop.shared.inboxLock.withLock { loop.shared.inbox.performs.count }
}

private func untilBlocksWait(_ loop: RunLoopThread, count: Int = 1) async throws {
  while waitingBlocks(loop) < count { try await Task.sleep(for: .milliseconds(1)) }
}

/// `runModal` is a wait like `performAndWait`: shutdown and cancellation release it, on every kind
/// of loop, whether its thread is in a run or parked — it never waits for a thread to exit.
@Suite(.timeLimit(.minutes(5)))
struct ModalRunReleaseTests {
  /// A current loop whose thread is parked outside a run: `shutdown()` from another thread
  /// releases a waiting `runModal` with `shutDown` at once, and the run never starts.
  @Test func aModalRunOnAParkedCurrentLoopIsReleasedByShutdown() async throws {
    let thread = ParkedLoopThread()
    defer { thread.end() }
    let loop = await thread.loop()
    let entries = AtomicCounter()
    let observer = LoopObserver(activities: [.entry]) { _, _ in entries.increment() }
    let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
    thread.onThread { loop in
      loop.add(observer, to: "modal")
      loop.add(keepAlive, to: "modal")
    }
    let outcome = try await withWatchdog(timeout: .seconds(20), "runModal on a parked, shut-down current loop") {
      () -> Result<RunLoopRunResult, RunLoopError> in
      let waiting = Task { () -> Result<RunLoopRunResult, RunLoopError> in
        await modalRun(on: loop, mode: "modal")
      }
      try await untilBlocksWait(loop)
      loop.shutdown()
      return await waiting.value
    }
    #expect(outcome == .failure(.shutDown(loop: loop.name)))
    thread.exit.open()
    let terminated = await execOnNewThread { () -> Bool in
      for _ in 0..<20_000 {
        if loop.shared.inboxLock.withLock({ loop.shared.inbox.life.phase >= .finishing }) { return true }
        usleep(1000)
      }
      return false
    }
    #expect(terminated)
    #expect(entries.current == 0)  // the drain at exit found the run given up: it did not start it
  }

  /// A `runModal` requested from a task whose loop has already diverted its jobs (shut down while
  /// parked) throws `shutDown` without waiting.
  @Test func aModalRunOnAnAlreadyShutDownParkedCurrentLoopThrowsAtOnce() async throws {
    let thread = ParkedLoopThread()
    defer { thread.end() }
    let loop = await thread.loop()
    loop.shutdown()
    let outcome = try await withWatchdog(timeout: .seconds(20), "runModal after shutdown") {
      () -> Result<RunLoopRunResult, RunLoopError> in
      await modalRun(on: loop, mode: "modal")
    }
    #expect(outcome == .failure(.shutDown(loop: loop.name)))
  }

  /// Cancelling a `runModal` whose run has not started (its loop's thread is parked) returns
  /// `.stopped` at once; when the thread later runs the loop, the run does not start.
  @Test func aModalRunCancelledBeforeItStartsReturnsStoppedAndNeverRuns() async throws {
    let thread = ParkedLoopThread()
    defer { thread.end() }
    let loop = await thread.loop()
    let entries = AtomicCounter()
    let observer = LoopObserver(activities: [.entry]) { _, _ in entries.increment() }
    let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
    thread.onThread { loop in
      loop.add(observer, to: "modal")
      loop.add(keepAlive, to: "modal")
    }
    let outcome = try await withWatchdog(timeout: .seconds(20), "cancelled runModal before its run") {
      () -> Result<RunLoopRunResult, RunLoopError> in
      let waiting = Task { () -> Result<RunLoopRunResult, RunLoopError> in
        await modalRun(on: loop, mode: "modal")
      }
      try await untilBlocksWait(loop)
      waiting.cancel()
      return await waiting.value
    }
    #expect(outcome == .success(.stopped))
    // Cancelled before it started, it leaves no hand-off registered with the loop.
    #expect(loop.shared.inboxLock.withLock { loop.shared.divertHandOffs.isEmpty })
    // The thread runs the loop: the given-up block runs, and starts no run of "modal".
    let ran = TestGate()
    thread.onThread { loop in
      loop.run(mode: .default, for: .milliseconds(50))
      ran.open()
    }
    let didRun = await execOnNewThread { ran.wait(timeout: .seconds(20)) }
    #expect(didRun)
    #expect(waitingBlocks(loop) == 0)
    #expect(entries.current == 0)
  }

  /// The same on the main loop, which nothing runs in this process (tests run on pool threads):
  /// a cancelled `runModal` is released with `.stopped` instead of waiting for the main thread.
  @Test func aModalRunOnTheMainLoopCancelledBeforeItStartsReturnsStopped() async throws {
    let main = RunLoopThread.main
    let before = waitingBlocks(main)
    let outcome = try await withWatchdog(timeout: .seconds(20), "cancelled runModal on the idle main loop") {
      () -> Result<RunLoopRunResult, RunLoopError> in
      let waiting = Task { () -> Result<RunLoopRunResult, RunLoopError> in
        await modalRun(on: main, mode: "modal-on-main")
      }
      try await untilBlocksWait(main, count: before + 1)
      waiting.cancel()
      return await waiting.value
    }
    #expect(outcome == .success(.stopped))
  }

  /// A task cancelled before it calls `runModal` gets `.stopped` without the loop being asked.
  @Test func aModalRunFromACancelledTaskReturnsStoppedWithoutRunning() async throws {
    let loop = try RunLoopThread(name: "modal-precancelled")
    defer { loop.shutdownAndWait() }
    let entries = AtomicCounter()
    let observer = LoopObserver(activities: [.entry]) { _, _ in entries.increment() }
    loop.add(observer, to: "modal")
    loop.add(LoopTimer(after: .seconds(3600)) { _ in }, to: "modal")
    let outcome = try await withWatchdog(timeout: .seconds(20), "runModal from a cancelled task") {
      () -> Result<RunLoopRunResult, RunLoopError> in
      let waiting = Task { () -> Result<RunLoopRunResult, RunLoopError> in
        withUnsafeCurrentTask { $0?.cancel() }
        return await modalRun(on: loop, mode: "modal")
      }
      return await waiting.value
    }
    #expect(outcome == .success(.stopped))
    let told = try loop.performAndWait { entries.current }
    #expect(told == 0)
  }
}
