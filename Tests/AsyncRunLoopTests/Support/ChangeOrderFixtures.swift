import Glibc
import Testing

@testable import AsyncRunLoop

/// The event log the change-order and member-promise suites record into.
typealias Log = EventLog

/// Helpers shared by the suites that conform (they call them as `Self.name` or by name).
protocol ChangeBurstSending {}

extension ChangeBurstSending {
  /// `count` cross-thread registration changes (an observer added and removed in turn).
  static func sendChanges(_ loop: RunLoopThread, count: Int) -> LoopObserver {
    let observer = LoopObserver(activities: .exit) { _, _ in }
    for index in 0..<count {
      if index % 2 == 0 { loop.add(observer, to: .default) } else { loop.remove(observer, from: .default) }
    }
    return observer
  }
}
