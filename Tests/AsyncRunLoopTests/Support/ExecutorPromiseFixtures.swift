import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

// Acceptance round 3: the executor, modal-run, shutdown and main-thread promises of the public
// API and its doc comments, each attacked with the interleaving that would break it.

/// Counts the jobs of one loop that are on the stack at once (only ever touched on that loop's
/// thread, or on the fallback queue after it terminated): more than one breaks the serial contract.
final class JobOverlapCounter: Sendable {
  private let state = Locked((current: 0, maximum: 0, total: 0))
  func enter() {
    state.withLock {
      $0.current += 1
      $0.maximum = max($0.maximum, $0.current)
      $0.total += 1
    }
  }
  func leave() { state.withLock { $0.current -= 1 } }
  var maximum: Int { state.withLock { $0.maximum } }
  var total: Int { state.withLock { $0.total } }
}

/// An actor on a loop whose methods record, through a shared `JobOverlapCounter`, whether a job of the
/// loop started while another one was on the stack.
actor SerialCheckingWorker: LoopActor {
  nonisolated let loop: RunLoopThread
  nonisolated let overlap: JobOverlapCounter
  private(set) var calls = 0

  init(loop: RunLoopThread, overlap: JobOverlapCounter) {
    self.loop = loop
    self.overlap = overlap
  }

  /// One synchronous job.
  func poke() {
    overlap.enter()
    defer { overlap.leave() }
    loop.checkIsolated()
    calls += 1
  }

  /// A modal run of `mode` from this actor (the actor is suspended, not blocked).
  func modal(_ mode: RunLoopMode, for duration: Duration) async throws(RunLoopError) -> RunLoopRunResult {
    try await loop.runModal(mode: mode, for: duration)
  }

  /// Runs the loop nested inside this job (blocking it): no other job of the loop may start.
  func nestedRun(_ mode: RunLoopMode, for duration: Duration) -> RunLoopRunResult {
    overlap.enter()
    defer { overlap.leave() }
    return loop.run(mode: mode, for: duration)
  }

  /// Sleeps on the loop's clock; returns how it ended and whether it resumed on the loop.
  func sleepOnTheLoopClock(for duration: Duration) async -> (cancelled: Bool, onLoop: Bool) {
    do {
      try await loop.clock.sleep(for: duration)
      return (false, loop.isOnLoopThread)
    } catch {
      return (error is CancellationError, loop.isOnLoopThread)
    }
  }
}
