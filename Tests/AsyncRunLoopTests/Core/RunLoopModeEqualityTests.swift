import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("RunLoopMode equality", .serialized)
struct RunLoopModeEqualityTests {
  /// Promised: modes made from the same name, in any of the public ways, are equal and hash
  /// alike; the internal every-mode equals none of them; `commonModes` holds `.default`.
  @Test func modesFromTheSameNameAreEqualAndHashAlike() throws {
    let names = ["kCFRunLoopDefaultMode", "kCFRunLoopCommonModes", "x", "AsyncRunLoop.everyMode", ""]
    for name in names {
      let made = [RunLoopMode(name), RunLoopMode(rawValue: name), RunLoopMode(stringLiteral: name)]
      for left in made {
        for right in made {
          #expect(left == right)
          #expect(left.hashValue == right.hashValue)
        }
        #expect(left.rawValue == name)
        #expect(left.description == name)
        #expect(RunLoopMode(rawValue: left.rawValue) == left)
      }
      #expect(Set(made).count == 1)
    }
    #expect(RunLoopMode.default == "kCFRunLoopDefaultMode")
    #expect(RunLoopMode.common == "kCFRunLoopCommonModes")
    #expect(RunLoopMode.everyMode != RunLoopMode(RunLoopMode.everyMode.rawValue))
    #expect(RunLoopMode.everyMode == RunLoopMode.everyMode)
    var table: [RunLoopMode: Int] = [:]
    table[RunLoopMode(RunLoopMode.everyMode.rawValue)] = 1
    table[.everyMode] = 2
    #expect(table.count == 2)
    #expect(table[RunLoopMode(rawValue: RunLoopMode.everyMode.rawValue)] == 1)
    let loop = try RunLoopThread(name: "m1")
    defer { loop.shutdownAndWait() }
    loop.addModeToCommonModes(RunLoopMode(rawValue: "racing-mode-x"))
    loop.addModeToCommonModes("racing-mode-x")
    let common = try loop.performAndWait { loop.commonModes }
    #expect(common.contains(.default))
    #expect(common.contains(racingModeX))
    #expect(!common.contains(.everyMode))
    #expect(common.filter { $0 == racingModeX }.count == 1)
  }
}
