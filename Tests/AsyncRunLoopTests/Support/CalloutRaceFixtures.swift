import Glibc
import Testing

@testable import AsyncRunLoop

/// Shared state between the two actors (set on the loop thread only).
final class ReviewNestingFlag: @unchecked Sendable {  // Safety: only touched on one loop thread
  var inNestedRun = false
}

actor ReviewSleepyActor: LoopActor {
  nonisolated let loop: RunLoopThread
  let mode: RunLoopMode
  init(loop: RunLoopThread, mode: RunLoopMode) {
    self.loop = loop
    self.mode = mode
  }

  func sleepThenRunNested(probe: ReviewProbeActor) async {
    try? await Task.sleep(for: .milliseconds(2))
    probe.flag.inNestedRun = true
    // Other jobs for the loop arrive while this job runs the loop nested.
    for _ in 0..<20 { Task { await probe.poke() } }
    loop.run(mode: mode, for: .milliseconds(200))
    probe.flag.inNestedRun = false
  }
}

actor ReviewProbeActor: LoopActor {
  nonisolated let loop: RunLoopThread
  nonisolated let flag = ReviewNestingFlag()
  var overlaps = 0
  init(loop: RunLoopThread) { self.loop = loop }
  func poke() {
    if flag.inNestedRun { overlaps += 1 }
  }
}
