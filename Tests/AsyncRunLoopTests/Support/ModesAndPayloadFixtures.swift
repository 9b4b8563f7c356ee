import Glibc
import Testing

@testable import AsyncRunLoop

// Helpers for the tests of the smaller member records (a timer's extra entries with their unowned back
// reference, descriptor state in the kind's payload, the 32-bit common order and its renumbering)
// and cross-thread changes as values. Blocking work runs on threads of the tests' own
// (`withWatchdogOnThread`, whose thread's current loop the body drives); results are checked after
// it returns.

let payloadModeA: RunLoopMode = "payload-mode-a"

let payloadModeB: RunLoopMode = "payload-mode-b"

let payloadModeC: RunLoopMode = "payload-mode-c"

/// A repeating timer that is never due by itself (an hour): the tests make it due with
/// `setFireDate(.now)`, so every fire is one the test asked for.
func makeParkedTimer(_ handler: @escaping @Sendable (LoopTimer) -> Void) -> LoopTimer {
  LoopTimer(after: .seconds(3600), repeatingEvery: .seconds(3600), handler: handler)
}

/// Counts the loop's passes (`beforeTimers`) in the modes it is added to.
final class PassCountingObserver: Sendable {
  let passes = AtomicCounter()
  let observer: LoopObserver

  init() {
    observer = LoopObserver(activities: [.beforeTimers]) { [passes] _, _ in passes.increment() }
  }
}

/// A custom source that counts its own schedule and cancel calls (per loop name).
final class ScheduleCountingSource: Sendable {
  let counts = Locked<[String: (schedule: Int, cancel: Int)]>([:])
  let source: InputSource

  init() {
    let counts = counts
    source = InputSource(
      schedule: { _, loop, _ in counts.withLock { $0[loop.name, default: (0, 0)].schedule += 1 } },
      cancel: { _, loop in counts.withLock { $0[loop.name, default: (0, 0)].cancel += 1 } }
    ) { _ in }
  }

  /// The loops where this source's schedules and cancels do not pair up (`open` loops may hold
  /// it still: one schedule more than cancels there).
  func unpaired(open: Set<String> = []) -> [String] {
    counts.withLock { counts in
      counts.compactMap { loop, pair in
        let expected = open.contains(loop) ? 1 : 0
        return pair.schedule - pair.cancel == expected && pair.schedule - pair.cancel >= 0
          ? nil : "\(loop): schedule \(pair.schedule), cancel \(pair.cancel)"
      }
    }
  }
}
