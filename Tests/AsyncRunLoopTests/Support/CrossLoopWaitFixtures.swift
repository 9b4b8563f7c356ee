import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

// Helpers for the tests of the wait-for graph of `performAndWait` (commit da03454), `performAndWait`
// racing `shutdown()`, descriptor sources sharing a number, custom input source routines and
// observers. Gates and polls only, never timing assertions.

struct TestBlockError: Error {}

/// Runs `body` on `loop`'s thread (from a thread of the test's own) and returns its result.
func runOnLoopThread<T: Sendable>(_ loop: RunLoopThread, _ body: @escaping @Sendable () -> T) async -> T? {
  await execOnNewThread { try? loop.performAndWait { body() } }
}

/// What a call that may throw `RunLoopError` gave back, in a comparable form.
func describeOutcome<T>(_ result: Result<T, any Error>) -> String {
  switch result {
  case .success(let value): return "value \(value)"
  case .failure(let error as RunLoopError):
    switch error {
    case .shutDown: return "shutDown"
    case .wouldDeadlock: return "wouldDeadlock"
    }
  case .failure(let error): return "other \(error)"
  }
}

/// A `RunLoopThread.current` loop on a thread of the test's own that keeps making short runs of
/// `.default` (a keep-alive timer holds the mode open) until `finish()`, which joins the thread:
/// the loop's exit drain has run when it returns.
final class ShortRunsCurrentLoopThread: Sendable {
  private let published = Guarded<RunLoopThread?>(nil)
  private let quitting = Guarded(false)
  private let thread: ExecThread

  init() {
    thread = ExecThread { [published, quitting] in
      let loop = RunLoopThread.current
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepAlive)
      published.withLock { $0 = loop }
      while !quitting.withLock({ $0 }) {
        // Shut down, a run ends at once: do not burn a core meanwhile.
        if loop.run(for: .milliseconds(2)) != .timedOut { usleep(1_000) }
      }
      keepAlive.invalidate()
    }
  }

  /// The thread's loop (blocks until it exists: call from a thread of the test's own).
  func loopBlocking() -> RunLoopThread {
    while published.snapshot == nil { usleep(200) }
    return published.snapshot!
  }

  /// Lets the thread exit and joins it (its loop has drained when this returns).
  func finish() {
    quitting.withLock { $0 = true }
    thread.join()
  }
}
