import Glibc
import Testing

@testable import AsyncRunLoop

/// `LoopGroup.shutdown()`: every loop shuts down as with `RunLoopThread.shutdown()`, without the
/// caller waiting, from any thread, including one of the group's own loops.
@Suite struct LoopGroupShutdownTests {
  @Test func shutdownShutsEveryLoopDownAndTheirThreadsExit() throws {
    let group = try LoopGroup(count: 3, name: "grp-exit")
    for loop in group.loops { #expect(!loop.isShutDown) }
    #expect(threadCount(named: "grp-exit-0") == 1)
    group.shutdown()
    for loop in group.loops { #expect(loop.isShutDown) }  // at once: shutdown() marks before it returns
    for index in 0..<3 {
      waitUntil("loop \(index)'s thread exited") { threadCount(named: "grp-exit-\(index)") == 0 }
    }
  }

  @Test func blocksAcceptedBeforeShutdownRunExactlyOnce() throws {
    let group = try LoopGroup(count: 2, name: "grp-drain")
    let counts = Guarded([0, 0])
    let performed = 200
    for (index, loop) in group.loops.enumerated() {
      for _ in 0..<performed {
        #expect(loop.perform(inModes: [.common]) { counts.withLock { $0[index] += 1 } })
      }
    }
    group.shutdown()
    for loop in group.loops { #expect(!loop.perform(inModes: [.common]) {}) }  // refused once shut down
    group.shutdownAndWait()  // after shutdown(): only waits
    #expect(counts.withLock { $0 } == [performed, performed])
  }

  @Test func shutdownFromOneOfTheGroupsLoopsDoesNotWait() throws {
    let group = try LoopGroup(count: 2, name: "grp-self")
    let returned = TestGate()
    let accepted = group.loops[0].perform(inModes: [.common]) { [group] in
      group.shutdown()  // on loop 0's own thread: it must not wait for itself
      returned.open()
    }
    #expect(accepted)
    #expect(returned.wait(timeout: .seconds(20 * watchdogScale)))
    group.shutdownAndWait()
    for loop in group.loops { #expect(loop.isShutDown) }
    #expect(threadCount(named: "grp-self-0") == 0)
    #expect(threadCount(named: "grp-self-1") == 0)
  }

  @Test func shutdownTwiceIsANoOp() throws {
    let group = try LoopGroup(count: 1, name: "grp-twice")
    group.shutdown()
    group.shutdown()
    group.shutdownAndWait()
    #expect(group.loops[0].isShutDown)
    // Joined: its kernel task disappears (slowly under a sanitizer); wait for it as the ring tests do.
    waitUntil(timeout: .seconds(10), "the group's thread gone") { threadCount(named: "grp-twice-0") == 0 }
    #expect(threadCount(named: "grp-twice-0") == 0)
  }
}
