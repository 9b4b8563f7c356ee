import Glibc
import Testing

@testable import AsyncRunLoop

/// "Every job and block the loop accepted runs": a drain that is not cut short by its cap runs
/// every job accepted before the shutdown on the loop's own thread — also more than one round's
/// batches — and a loop is drained once, whoever asks again.
@Suite(.timeLimit(.minutes(5)))
struct DrainRunsEveryAcceptedJobTests {
  /// More jobs than two batches of `jobsPerPass` wait when the loop is shut down: none is handed
  /// to the fallback queue (each runs on the loop's thread). Three batches, the last of one job:
  /// a round runs two, so the drain needs a second round.
  @Test func everyJobAcceptedBeforeShutdownRunsOnTheLoopsThread() async throws {
    let loop = try RunLoopThread(name: "drain-every-job")
    let count = 2 * LoopCore.jobsPerPass + 1
    // The drain's cap is a second of wall time; a sanitized run on a loaded machine can spend
    // longer on the first round, and then the cap hands the rest on (its own tests prove that).
    // This one is about an uncut drain: an hour.
    try loop.performAndWait { loop.core.drainCapNanoseconds = 3_600_000_000_000 }
    let outcome = try await withWatchdog(timeout: .seconds(60), "draining \(count) jobs") { () -> (Int, Int) in
      let inBlock = TestGate()
      let release = TestGate()
      loop.perform {
        inBlock.open()
        _ = release.wait(timeout: .seconds(30))
      }
      _ = await execOnNewThread { inBlock.wait(timeout: .seconds(30)) }
      let onLoop = AtomicCounter()
      let elsewhere = AtomicCounter()
      var tasks: [Task<Void, Never>] = []
      for _ in 0..<count {
        tasks.append(
          Task(executorPreference: loop) {
            if loop.isOnLoopThread { onLoop.increment() } else { elsewhere.increment() }
          })
      }
      while loop.shared.inboxLock.withLock({ loop.shared.inbox.jobs.count }) < count {
        try await Task.sleep(for: .milliseconds(1))
      }
      loop.shutdown()
      release.open()
      for task in tasks { await task.value }
      return (onLoop.current, elsewhere.current)
    }
    await execOnNewThread { loop.shutdownAndWait() }
    #expect(outcome?.0 == count)
    #expect(outcome?.1 == 0)
  }

  /// A loop is drained once: asked to drain again after it terminated (a later `runMainLoop()` on
  /// a shut-down main loop does that), the drain does nothing — and the thread's own drain when
  /// it exits is then a no-op too.
  @Test func aLoopIsDrainedOnceWhoeverAsksAgain() async throws {
    let thread = ParkedLoopThread()
    defer { thread.end() }
    let loop = await thread.loop()
    let cancels = AtomicCounter()
    let source = InputSource(cancel: { _, _ in cancels.increment() }, perform: { _ in })
    let drained = TestGate()
    thread.onThread { loop in
      loop.add(source, to: .default)
      loop.shutdown()
      loop.core.drainForShutdown()
      loop.core.drainForShutdown()  // again: a no-op
      drained.open()
    }
    let didDrain = await execOnNewThread { drained.wait(timeout: .seconds(20)) }
    #expect(didDrain)
    thread.exit.open()
    let exited = await execOnNewThread { thread.exited.wait(timeout: .seconds(20)) }
    #expect(exited)
    #expect(cancels.current == 1)
    #expect(loop.shared.inboxLock.withLock { loop.shared.inbox.life.phase } == .terminated)
  }
}
