import Glibc
import Testing

@testable import AsyncRunLoop

// Helpers for the tests of observers kept in one bucket per order (`ModeContents`), a shutdown drain
// past its cap still taking invalidations (`LoopInbox.control`), and a refused add of a member
// already bound to that loop keeping the earlier add (`RunLoopThread.bind`).

/// Counts its own deinits: captured by a member's closures, it tells whether they were released.
final class DeinitCountingToken: Sendable {
  let freed: AtomicCounter
  init(_ freed: AtomicCounter) { self.freed = freed }
  deinit { freed.increment() }
}

/// The books of one `CommandSource<Int>` under test (holds nothing of the source).
/// Starts `loop`'s shutdown drain and holds it in a block (performed in a mode the loop never
/// runs, so only the drain runs it); returns the gate that ends the block once the drain is in it.
func holdDrain(_ loop: RunLoopThread) -> TestGate {
  let inDrain = TestGate()
  let endDrain = TestGate()
  loop.perform(inModes: ["never-run"]) {
    inDrain.open()
    _ = endDrain.wait(timeout: .seconds(20))
  }
  loop.shutdown()
  _ = inDrain.wait(timeout: .seconds(20))
  return endDrain
}

/// Waits until the drain of `loop` refuses changes (its cap, read from the loop).
func waitForDrainCap(_ loop: RunLoopThread) {
  let cap = loop.shared.inboxLock.withLock { loop.shared.inbox.refusesChangesFrom }
  waitUntil(timeout: .seconds(5), "the drain's cap") { LoopClock.monotonicNanoseconds() > cap }
}
