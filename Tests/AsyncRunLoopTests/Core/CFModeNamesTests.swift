import Glibc
import Testing

@testable import AsyncRunLoop

/// The predefined modes carry CFRunLoop's names (Foundation's `RunLoop.Mode` raw values), so a
/// mode name that crosses from Foundation or CF code means the same mode here.
@Suite struct CFModeNamesTests {
  @Test func predefinedModesHaveCFRunLoopsRawValues() {
    #expect(RunLoopMode.default.rawValue == "kCFRunLoopDefaultMode")
    #expect(RunLoopMode.common.rawValue == "kCFRunLoopCommonModes")
    #expect(RunLoopMode.default.description == "kCFRunLoopDefaultMode")
    #expect(RunLoopMode.common.description == "kCFRunLoopCommonModes")
  }

  @Test func modesMadeFromCFNamesAreThePredefinedModes() {
    #expect(RunLoopMode(rawValue: "kCFRunLoopDefaultMode") == .default)
    #expect(RunLoopMode("kCFRunLoopCommonModes") == .common)
    let literal: RunLoopMode = "kCFRunLoopDefaultMode"
    #expect(literal == .default)
    #expect(Set<RunLoopMode>([.default, "kCFRunLoopDefaultMode", .common, "kCFRunLoopCommonModes"]).count == 2)
  }

  /// A timer added under the CF names, as a port of Foundation code would, fires in a run of
  /// `.default`: once for the default-mode name, once for the common-modes name.
  @Test func membersAddedUnderCFNamesFireInTheDefaultMode() throws {
    let loop = try RunLoopThread(name: "cf-mode-names")
    defer { loop.shutdownAndWait() }
    let fires = Guarded([String]())
    let byDefaultName = LoopTimer(after: .milliseconds(1)) { _ in fires.withLock { $0.append("default name") } }
    let byCommonName = LoopTimer(after: .milliseconds(1)) { _ in fires.withLock { $0.append("common name") } }
    loop.add(byDefaultName, to: RunLoopMode(rawValue: "kCFRunLoopDefaultMode"))
    loop.add(byCommonName, to: RunLoopMode(rawValue: "kCFRunLoopCommonModes"))
    waitUntil("both timers fired") { fires.withLock { $0.count } == 2 }
    #expect(Set(fires.withLock { $0 }) == ["default name", "common name"])
    let modes = try loop.performAndWait { loop.commonModes.map(\.rawValue) }
    #expect(modes == ["kCFRunLoopDefaultMode"])
  }
}
