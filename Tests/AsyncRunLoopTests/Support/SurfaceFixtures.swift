import Glibc
import Testing

@testable import AsyncRunLoop

// Helpers for the tests of the async sequences (buffering, consumer cancellation, the member
// ending from another thread or by the loop's shutdown, leaks), the executor (actors pinned to a
// loop, sleeps, the fallback after termination, runModal, performAndWait cycles, LoopGroup) and
// runOnMain off the main thread. Blocking work runs on threads of the tests' own; results are
// checked after the watchdog returns.

let surfaceModeA: RunLoopMode = "surface-mode-a"

let surfaceModeB: RunLoopMode = "surface-mode-b"

/// Whether the single consumer of `storage` is suspended in `next()`.
func isConsumerWaiting<S: SingleConsumerStorage>(_ storage: S) -> Bool {
  storage.lock.withLock {
    switch storage.machine.lifecycle.state {
    case .consumerWaiting, .closing(consumer: .some): return true
    default: return false
    }
  }
}

// MARK: - Executor

/// Counts callers inside an actor method at once (more than one would break the serial contract).
final class ConcurrentCallerCounter: Sendable {
  let inside = AtomicCounter()
  let most = Locked(0)
  func enter() {
    let now = inside.value.add(1, ordering: .sequentiallyConsistent).newValue
    most.withLock { $0 = max($0, now) }
  }
  func leave() { inside.value.subtract(1, ordering: .sequentiallyConsistent) }
}

/// An actor pinned to a loop.
actor PinnedSurfaceActor: LoopActor {
  nonisolated let loop: RunLoopThread
  let overlap = ConcurrentCallerCounter()
  var calls = 0
  init(loop: RunLoopThread) { self.loop = loop }

  /// Where the call runs: (isolated to the loop, on the loop's thread).
  func whereAmI() -> (isolated: Bool?, onThread: Bool) { (loop.isIsolatingCurrentContext(), loop.isOnLoopThread) }

  /// A call that takes a while; counts overlapping callers.
  func slowCall() {
    overlap.enter()
    usleep(300)
    calls += 1
    overlap.leave()
  }

  /// `performAndWait` on the actor's own loop: inline.
  func performInline() throws -> Bool { try loop.performAndWait { self.loop.isOnLoopThread } }

  /// Waits (on this loop's thread) for `other` to run a block that waits for this loop.
  func waitInACycle(through other: RunLoopThread) -> String {
    do {
      return try other.performAndWait { () throws -> String in
        try self.loop.performAndWait { "ran" }
      }
    } catch RunLoopError.wouldDeadlock {
      return "wouldDeadlock"
    } catch {
      return "\(error)"
    }
  }

  /// A modal run in `mode` that ends when `source` fires (or after 10 s).
  func modalUntilSignalled() async throws -> RunLoopRunResult {
    try await loop.runModal(mode: surfaceModeA, for: .seconds(10), returnAfterSourceHandled: true)
  }

  func ping(_ source: InputSource) { source.signal() }
}

extension PinnedSurfaceActor {
  /// `performAndWait` on the actor's loop from the actor (inline on the loop thread; on the
  /// fallback after termination, where it must throw rather than wait).
  func performInlineOrThrow() throws -> Bool { try loop.performAndWait { true } }
}

extension PinnedSurfaceActor {
  /// The actor's state read through a dynamic isolation check (`assumeIsolated`): traps unless
  /// the caller runs isolated to the actor's loop.
  nonisolated func callsAssumingIsolation() -> Int { assumeIsolated { $0.calls } }

  /// The same from inside an isolated call (on the fallback after termination).
  func callsThroughDynamicCheck() -> Int { callsAssumingIsolation() }
}

extension PinnedSurfaceActor {
  /// Sleeps (the actor's executor schedules the job on the loop's timers); returns the time slept.
  func sleep(for duration: Duration) async -> Duration {
    let start = ContinuousClock.now
    try? await Task.sleep(for: duration)
    return ContinuousClock.now - start
  }
}
