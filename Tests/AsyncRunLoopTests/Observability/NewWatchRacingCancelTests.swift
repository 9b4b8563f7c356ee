import Glibc
import Testing

@testable import AsyncRunLoop

/// A watch made while the loop's previous watch is being cancelled on another thread is watched:
/// the cancel never takes the loop away from the watcher thread under the new watch.
@Suite("A new watch racing the old one's cancel")
struct NewWatchRacingCancelTests {
  @Test func aWatchMadeWhileTheOldOneIsCancelledIsWatched() throws {
    let loop = try RunLoopThread(name: "cancel-vs-new-watch")
    let observation = loop.shared.observation
    for round in 0..<2_000 {
      let old = loop.watchStalls(threshold: .seconds(3600))
      let ready = AtomicCounter()
      // Two real threads meet, then one cancels while the other makes the new watch.
      let cancelling = startThread {
        ready.increment()
        while ready.current < 2 { sched_yield() }
        old.cancel()
      }
      ready.increment()
      while ready.current < 2 { sched_yield() }
      let watch = loop.watchStalls(threshold: .milliseconds(50))
      pthread_join(cancelling, nil)
      guard StallWatcher.shared.watches(observation) else {
        Issue.record("round \(round): a watch is on a loop the watcher no longer looks at")
        break
      }
      watch.cancel()
    }
    loop.shutdownAndWait()
  }
}
