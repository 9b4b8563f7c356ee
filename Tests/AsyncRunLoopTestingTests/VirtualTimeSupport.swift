import AsyncRunLoop
import AsyncRunLoopTesting

@testable import AsyncRunLoop

/// An ordered log of events, appended from any thread (callouts on the loop thread, the test).
final class EventLog: Sendable {
  private let storage = LockedValue<[String]>([])

  func callAsFunction(_ entry: String) { storage.withLock { $0.append(entry) } }

  var entries: [String] { storage.withLock { $0 } }
}

extension VirtualTimeLoop {
  /// Virtual time since `VirtualTimeLoop.defaultOrigin`, in whole milliseconds (for logs).
  var elapsedMilliseconds: Int64 { (now.nanoseconds - Self.defaultOrigin.nanoseconds) / 1_000_000 }
}

extension LoopClock.Instant {
  /// Milliseconds since `VirtualTimeLoop.defaultOrigin` (for logs).
  var virtualMilliseconds: Int64 { (nanoseconds - VirtualTimeLoop.defaultOrigin.nanoseconds) / 1_000_000 }
}
