import Glibc
import Testing

@testable import AsyncRunLoop

let silencedOtherMode: RunLoopMode = "silenced-other-mode"

let silencedSecondMode: RunLoopMode = "silenced-second-mode"

let silencedThirdMode: RunLoopMode = "silenced-third-mode"

let silencedEmptyMode: RunLoopMode = "silenced-empty-mode"

/// Whether `loop`'s thread has been joined (or detached): `shutdownAndWait()` waited for it.
func isReaped(_ loop: RunLoopThread) -> Bool {
  let state = loop.shared.threadLock.withLock { loop.shared.threadState }
  if case .reaped = state { return true }
  return false
}

/// A readable pipe whose source counts its fires (and drains, so each write fires once).
final class FireCountingPipe: Sendable {
  let read: Int32
  let write: Int32
  let fires = Locked(0)
  let source: DescriptorSource

  init() {
    let ends = makePipe()
    read = ends.read
    write = ends.write
    let fires = fires
    let descriptor = ends.read
    source = DescriptorSource(descriptor: descriptor) { _, _ in
      _ = drainDescriptor(descriptor)
      fires.withLock { $0 += 1 }
    }
  }

  var count: Int { fires.withLock { $0 } }

  func close() {
    Glibc.close(read)
    Glibc.close(write)
  }
}

/// Runs `mode` (kept alive by a far-future timer) long enough for readable descriptors of other
/// modes to report there and be silenced. Loop thread.
func runOtherModeBriefly(_ loop: RunLoopThread, _ mode: RunLoopMode = silencedOtherMode) {
  let keepAlive = LoopTimer(after: .seconds(3_600)) { _ in }
  loop.add(keepAlive, to: mode)
  loop.run(mode: mode, until: .now.advanced(by: .milliseconds(30)))
  keepAlive.invalidate()
}

/// An actor on a loop that sleeps with `LoopClock()`.
actor LoopClockSleepingActor: LoopActor {
  nonisolated let loop: RunLoopThread

  init(loop: RunLoopThread) { self.loop = loop }

  /// Sleeps `duration` with `LoopClock()`, returns when it woke.
  func sleep(_ duration: Duration) async throws -> LoopClock.Instant {
    try await LoopClock().sleep(for: duration)
    return .now
  }

  /// Sleeps 30 ms with `LoopClock()`; returns how many timer entries the loop scheduled
  /// meanwhile (read on the loop's thread before and after: no other timer is on this loop), and
  /// whether it woke on the loop. (A probe timer that counted the sleep's timer 10 ms in raced the
  /// sleep's add, which goes through the pool: under CI's load it counted 0.)
  func sleepCountingTimers() async throws -> (Int, Bool) {
    let before = loop.core.timerSequence
    try await LoopClock().sleep(for: .milliseconds(30))
    return (Int(loop.core.timerSequence - before), loop.isOnLoopThread)
  }
}
