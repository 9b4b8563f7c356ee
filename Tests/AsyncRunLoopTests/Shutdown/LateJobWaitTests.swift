import Glibc
import Testing

@testable import AsyncRunLoop

/// Where a scheduled job waits once its loop has shut down (`RunLoopThread.atDeadline`): never
/// early, and never dropped, however far its deadline.
@Suite("LateJobWait: jobs waiting for their deadline off a shut-down loop")
struct LateJobWaitTests {
  /// Counts its releases. (Not a weak reference: a weak reference to an object that stays alive,
  /// as this one must, leaves a side table that LeakSanitizer cannot trace, and reports.)
  private final class Canary: Sendable {
    let released: AtomicCounter
    init(released: AtomicCounter) { self.released = released }
    deinit { released.increment() }
  }

  /// A deadline Dispatch cannot represent (it overflows to `DISPATCH_TIME_FOREVER`, whose blocks
  /// Dispatch drops) keeps its closure alive and never calls it. Before the fix the closure, and
  /// the sleeping task's wake-up job it held, was released at once (LeakSanitizer reported the
  /// task as leaked).
  @Test(arguments: [Int64.max, Int64.max - 1, Int64.max / 2])
  func aFarDeadlineKeepsItsClosureAndNeverCallsIt(deadline: Int64) async {
    let called = AtomicCounter()
    let released = AtomicCounter()
    do {
      let canary = Canary(released: released)
      let body: @Sendable () -> Void = {
        withExtendedLifetime(canary) {}
        called.increment()
      }
      RunLoopThread.atDeadline(deadline, body)
    }
    // Dispatch hands a dropped block back at once; give it time to have done so.
    try? await Task.sleep(for: .milliseconds(50))
    #expect(released.current == 0, "the closure waiting for its deadline was dropped")
    #expect(called.current == 0)
  }

  /// A near deadline calls the closure once, not before the deadline; a past one calls it inline.
  @Test func aNearDeadlineCallsOnceNeverEarly() async {
    let deadline = LoopClock.monotonicNanoseconds() + 20_000_000
    let calledAt = Locked<[Int64]>([])
    RunLoopThread.atDeadline(deadline) { calledAt.withLock { $0.append(LoopClock.monotonicNanoseconds()) } }
    #expect(await pollAsync { !calledAt.withLock { $0.isEmpty } })
    try? await Task.sleep(for: .milliseconds(30))
    let calls = calledAt.withLock { $0 }
    #expect(calls.count == 1)
    #expect(calls.allSatisfy { $0 >= deadline }, "called before its deadline")
    let inline = AtomicCounter()
    RunLoopThread.atDeadline(LoopClock.monotonicNanoseconds() - 1) { inline.increment() }
    #expect(inline.current == 1)
  }
}
