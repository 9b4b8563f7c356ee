import Glibc
import Testing

@testable import AsyncRunLoop

/// A loop actor whose method suspends in a continuation that a raw thread resumes.
actor ResumptionCheckingActor: LoopActor {
  nonisolated let loop: RunLoopThread
  init(loop: RunLoopThread) { self.loop = loop }

  /// Hands the continuation to `park` and, resumed, reports whether it is back on its loop.
  func suspend(_ park: @escaping @Sendable (CheckedContinuation<Void, Never>) -> Void) async -> Bool {
    await withCheckedContinuation { park($0) }
    return loop.isOnLoopThread
  }

  /// Sleeps inside the actor and, woken, reports whether it is back on its loop.
  func nap() async -> Bool {
    try? await Task.sleep(for: .milliseconds(2))
    return loop.isOnLoopThread
  }

  /// Waits for the next element of a source sequence of this loop inside the actor.
  func next(of sequence: SourceSequence<Int>) async -> Int? {
    for await element in sequence { return element }
    return nil
  }
}

/// Whether the global executor is the fixed-width cooperative pool (its threads can all be
/// blocked). The test harness turns it off (`CTestHarness`) unless the environment sets it.
var runsOnTheFixedWidthCooperativePool: Bool {
  guard let raw = getenv("SWIFT_DEBUG_CONCURRENCY_ENABLE_COOPERATIVE_QUEUES") else { return false }
  return ["true", "1", "yes"].contains(String(cString: raw).lowercased())
}
