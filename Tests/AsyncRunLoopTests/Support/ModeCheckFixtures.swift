import Glibc
import Testing

@testable import AsyncRunLoop

// Helpers for the tests of the mode check every callout now makes against the member's binding
// (`MemberBinding.keeps`), the per-loop numbering of a member's last sent change, loop-thread
// `setFireDate`, and runs of an emptied mode.

/// How a timer stays in `.default` while the way the loop holds it there changes behind a burst.
enum DefaultModeRoute: String, Sendable, CustomTestStringConvertible {
  /// In `.default` through `.common`; then added to `.default` by name and removed from `.common`.
  case commonToName
  /// In `.default` by name; then added to `.common` and removed from `.default` by name.
  case nameToCommon
  var testDescription: String { rawValue }
}

/// Helpers shared by the suites that conform (they call them as `Self.name` or by name).
protocol ReAddOrderMeasures {}

extension ReAddOrderMeasures {
  static func reAddOrder(viaOtherLoop: Bool) throws -> [String]? {
    try withWatchdogSync(timeout: .seconds(20), "cross-loop order") { () -> [String] in
      let loopA = try RunLoopThread(name: "order-a")
      defer { loopA.shutdownAndWait() }
      let loopB = try RunLoopThread(name: "order-b")
      defer { loopB.shutdownAndWait() }
      let log = EventLog()
      let member = InputSource(
        schedule: { _, loop, _ in log.add("schedule \(loop.name)") },
        cancel: { _, loop in log.add("cancel \(loop.name)") },
        perform: { _ in })
      loopA.add(member)
      try loopA.performAndWait {}
      let trigger = InputSource(
        schedule: { _, loop, _ in loop.add(member) },  // on A's thread, inside A's application
        perform: { _ in })
      let release = blockLoop(loopA)
      loopA.add(trigger)
      loopA.remove(member)
      if viaOtherLoop {
        loopB.add(member)
        try loopB.performAndWait {}
        loopB.remove(member)
        try loopB.performAndWait {}
      }
      release.open()
      for _ in 0..<3 { try loopA.performAndWait {} }
      let onA = log.snapshot.filter { $0.hasSuffix("order-a") }
      member.invalidate()
      trigger.invalidate()
      try loopA.performAndWait {}
      return onA
    }
  }

  static func descriptorReAdd(viaOtherLoop: Bool) throws -> [String]? {
    try withWatchdogSync(timeout: .seconds(20), "cross-loop descriptor") { () -> [String] in
      let loopA = try RunLoopThread(name: "desc-a")
      defer { loopA.shutdownAndWait() }
      let loopB = try RunLoopThread(name: "desc-b")
      defer { loopB.shutdownAndWait() }
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let told = AtomicCounter()
      let failure = Guarded<String>("none")
      let descriptor = DescriptorSource(descriptor: pipe.read) { source, _ in
        drainDescriptor(source.descriptor)
        told.increment()
      }
      try loopA.add(descriptor)
      try loopA.performAndWait {}
      let trigger = InputSource(
        schedule: { _, loop, _ in
          do throws(SystemCallError) {
            try loop.add(descriptor)
          } catch {
            failure.withLock { $0 = "\(error)" }
          }
        },
        perform: { _ in })
      let release = blockLoop(loopA)
      loopA.add(trigger)
      loopA.remove(descriptor)
      if viaOtherLoop {
        try loopB.add(descriptor)
        try loopB.performAndWait {}
        loopB.remove(descriptor)
        try loopB.performAndWait {}
      }
      release.open()
      for _ in 0..<3 { try loopA.performAndWait {} }
      writeByte(pipe.write)
      try loopA.performAndWait { _ = loopA.run(mode: .default, until: .now) }
      for _ in 0..<2 { try loopA.performAndWait {} }
      let result = [failure.snapshot, "\(told.current)", "\(descriptor.isValid)"]
      descriptor.invalidate()
      trigger.invalidate()
      try loopA.performAndWait {}
      return result
    }
  }
}
