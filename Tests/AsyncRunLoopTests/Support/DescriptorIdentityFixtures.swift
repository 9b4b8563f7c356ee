import Glibc
import Testing

@testable import AsyncRunLoop

// Helpers for the tests of descriptor identity with dup'd descriptors, records that left their loop and
// are added again, sleeps racing a current loop's shutdown, and `CommandSource` under races
// (invalidate, shutdown, moves, re-entrant handlers). Blocking work runs on threads of the tests'
// own (`withWatchdogOnThread`); results are checked after it returns.

/// Counts the loop's wake-ups (`afterWaiting`) and passes (`beforeTimers`) in `mode`.
final class WakeAndPassCountingObserver: Sendable {
  let wakes = AtomicCounter()
  let passes = AtomicCounter()
  let observer: LoopObserver

  init() {
    observer = LoopObserver(activities: [.afterWaiting, .beforeTimers]) { [wakes, passes] _, activity in
      if activity == .afterWaiting { wakes.increment() } else { passes.increment() }
    }
  }
}

/// A thread of the test's own whose `RunLoopThread.current` loop runs in short runs until it is
/// shut down; then the thread lives on (not running the loop) until `end()`.
final class OutlivingCurrentLoopThread: Sendable {
  private let published = Guarded<RunLoopThread?>(nil)
  private let exit = TestGate()
  let exited = TestGate()

  init() {
    ExecThread { [published, exit, exited] in
      let loop = RunLoopThread.current
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepAlive)
      published.withLock { $0 = loop }
      while !loop.isShutDown { loop.run(for: .milliseconds(3)) }
      keepAlive.invalidate()
      exit.wait(timeout: .seconds(3600))
      exited.open()
    }.detach()
  }

  func loop() -> RunLoopThread {
    while published.snapshot == nil { usleep(300) }
    return published.snapshot!
  }

  func end() {
    exit.open()
    exited.wait(timeout: .seconds(20))
  }
}
