import Glibc
import Testing

@testable import AsyncRunLoop

/// A pass skips the inbox lock at its work points while nothing has arrived
/// (`LoopShared.arrivalsWaiting`). Work another thread hands the loop during a pass, after those
/// work points looked, finds the loop awake and so wakes nothing: it must still be taken before
/// the loop sleeps. Each loop here watches only a custom source, so it sleeps on its futex, and
/// nothing else would ever wake it.
@Suite("Work handed to an awake loop is taken before it sleeps")
struct ArrivalsDuringAPassTests {
  /// A loop on the futex path (one custom source, never signalled) and that source.
  private func makeLoop(_ name: String) throws -> (RunLoopThread, InputSource) {
    let loop = try RunLoopThread(name: name)
    let keeper = InputSource { _ in }
    loop.add(keeper)
    return (loop, keeper)
  }

  /// Inside a block on `loop`: runs `handOver` on another thread and waits there until it
  /// returned, so that it arrives while this pass runs, after the work point that runs the block.
  private func handOverDuringABlock(_ loop: RunLoopThread, _ handOver: @escaping @Sendable () -> Void) {
    loop.perform {
      let done = TestGate()
      _ = startThread(detached: true) {
        handOver()
        done.open()
      }
      _ = done.wait(timeout: .seconds(20 * watchdogScale))  // (a hand-over that hangs fails the wait below)
    }
  }

  @Test func aBlockSentDuringAPassRuns() async throws {
    let (loop, keeper) = try makeLoop("arrive-block")
    defer { loop.shutdownAndWait() }
    let ran = Guarded(false)
    handOverDuringABlock(loop) { loop.perform { ran.withLock { $0 = true } } }
    #expect(await eventually("the block sent during the pass ran") { ran.snapshot })
    keeper.invalidate()
  }

  @Test func aSourceSignalledDuringAPassFires() async throws {
    let (loop, keeper) = try makeLoop("arrive-signal")
    defer { loop.shutdownAndWait() }
    let fired = Guarded(0)
    let source = InputSource { _ in fired.withLock { $0 += 1 } }
    try loop.performAndWait { loop.add(source) }
    handOverDuringABlock(loop) { source.signal() }
    #expect(await eventually("the source signalled during the pass fired") { fired.snapshot == 1 })
    source.invalidate()
    keeper.invalidate()
  }

  @Test func aJobEnqueuedDuringAPassRuns() async throws {
    let (loop, keeper) = try makeLoop("arrive-job")
    defer { loop.shutdownAndWait() }
    let ran = Guarded(false)
    handOverDuringABlock(loop) {
      Task(executorPreference: loop) { ran.withLock { $0 = true } }
    }
    #expect(await eventually("the job enqueued during the pass ran") { ran.snapshot })
    keeper.invalidate()
  }

  /// `stop()` during a pass of a nested run ends that run (`consumeStop` reads the flag first).
  @Test func aStopSentDuringAPassOfANestedRunEndsIt() async throws {
    let (loop, keeper) = try makeLoop("arrive-stop")
    defer { loop.shutdownAndWait() }
    let result = Guarded<RunLoopRunResult?>(nil)
    loop.perform {
      handOverDuringABlock(loop) { loop.stop() }
      let nested = loop.run(mode: .default, for: .seconds(3600))
      result.withLock { $0 = nested }
    }
    #expect(await eventually("the nested run ended") { result.snapshot != nil })
    #expect(result.snapshot == .stopped)
    keeper.invalidate()
  }
}
