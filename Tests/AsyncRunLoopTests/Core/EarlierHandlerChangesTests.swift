import Glibc
import Testing

@testable import AsyncRunLoop

/// A handler's changes to sources later in the same pass take effect at once.
@Suite(
  "A handler's changes to sources later in the same pass take effect at once", .serialized, .timeLimit(.minutes(10)))
struct EarlierHandlerChangesTests {
  /// S1's handler takes S2 out of the running mode A (S2 stays in B) and runs B nested: S2 fires
  /// exactly once, in B, and not again in a later run of B.
  @Test func aSourceTakenOutOfTheModeByAnEarlierHandlerFiresOnceInItsOtherMode() throws {
    let loop = try RunLoopThread(name: "step4")
    let running = Locked(silencedOtherMode.rawValue)
    let log = Locked([String]())
    let second = InputSource(order: 1) { _ in log.withLock { $0.append("S2 in \(running.withLock { $0 })") } }
    let first = InputSource(order: 0) { _ in
      log.withLock { $0.append("S1") }
      loop.remove(second, from: silencedOtherMode)
      running.withLock { $0 = silencedSecondMode.rawValue }
      loop.run(mode: silencedSecondMode, until: .now)
      running.withLock { $0 = silencedOtherMode.rawValue }
    }
    let entries = try loop.performAndWait { () -> [String] in
      loop.add(first, to: silencedOtherMode)
      loop.add(second, to: silencedOtherMode)
      loop.add(second, to: silencedSecondMode)
      first.signal()
      second.signal()
      loop.run(mode: silencedOtherMode, until: .now)
      running.withLock { $0 = silencedSecondMode.rawValue }
      loop.run(mode: silencedSecondMode, until: .now)
      loop.run(mode: silencedSecondMode, until: .now)
      return log.withLock { $0 }
    }
    #expect(entries == ["S1", "S2 in \(silencedSecondMode.rawValue)"])
    first.invalidate()
    second.invalidate()
    loop.shutdownAndWait()
  }

  /// S1's handler moves S2 from A to `.common` (A is a common mode; S2 stays in B, so it stays on
  /// the loop): S2 is still in A and fires there once; runs of B and of another common mode do not
  /// fire it again.
  @Test func aSourceMovedToCommonByAnEarlierHandlerFiresOnceInTheRunningMode() throws {
    let loop = try RunLoopThread(name: "tocommon")
    let fires = Locked(0)
    let second = InputSource(order: 1) { _ in fires.withLock { $0 += 1 } }
    let first = InputSource(order: 0) { _ in
      loop.remove(second, from: .default)
      loop.add(second, to: .common)
    }
    let (inDefault, total) = try loop.performAndWait { () -> (Int, Int) in
      loop.addModeToCommonModes(silencedThirdMode)
      loop.add(first, to: .default)
      loop.add(second, to: .default)
      loop.add(second, to: silencedSecondMode)
      first.signal()
      second.signal()
      loop.run(mode: .default, until: .now)
      let inDefault = fires.withLock { $0 }
      loop.run(mode: silencedThirdMode, until: .now)
      loop.run(mode: silencedSecondMode, until: .now)
      loop.run(mode: .default, until: .now)
      return (inDefault, fires.withLock { $0 })
    }
    #expect(inDefault == 1)
    #expect(total == 1)
    first.invalidate()
    second.invalidate()
    loop.shutdownAndWait()
  }

  /// S1's handler removes S2 from its only mode (S2 leaves the loop) and adds it to `.common`: it
  /// joins again still signalled and fires exactly once, in a mode that holds it.
  @Test func aSourceReaddedByAnEarlierHandlerAfterLeavingTheLoopFiresOnce() throws {
    let loop = try RunLoopThread(name: "readd")
    let fires = Locked(0)
    let second = InputSource(order: 1) { _ in fires.withLock { $0 += 1 } }
    let first = InputSource(order: 0) { _ in
      loop.remove(second, from: .default)
      loop.add(second, to: .common)
    }
    let total = try loop.performAndWait { () -> Int in
      loop.addModeToCommonModes(silencedThirdMode)
      loop.add(first, to: .default)
      loop.add(second, to: .default)
      first.signal()
      second.signal()
      for _ in 0..<3 {
        loop.run(mode: .default, until: .now)
        loop.run(mode: silencedThirdMode, until: .now)
      }
      return fires.withLock { $0 }
    }
    #expect(total == 1)
    first.invalidate()
    second.invalidate()
    loop.shutdownAndWait()
  }

  /// S1's handler removes S2 from A and invalidates it: S2 never fires, its cancel runs once.
  @Test func aSourceInvalidatedByAnEarlierHandlerNeverFires() throws {
    let loop = try RunLoopThread(name: "inval")
    let fires = Locked(0)
    let cancels = Locked(0)
    let second = InputSource(order: 1, cancel: { _, _ in cancels.withLock { $0 += 1 } }) { _ in
      fires.withLock { $0 += 1 }
    }
    let first = InputSource(order: 0) { _ in
      loop.remove(second, from: silencedOtherMode)
      second.invalidate()
    }
    try loop.performAndWait {
      loop.add(first, to: silencedOtherMode)
      loop.add(second, to: silencedOtherMode)
      loop.add(second, to: silencedSecondMode)
      first.signal()
      second.signal()
      loop.run(mode: silencedOtherMode, until: .now)
      loop.run(mode: silencedSecondMode, until: .now)
    }
    #expect(fires.withLock { $0 } == 0)
    #expect(cancels.withLock { $0 } == 1)
    first.invalidate()
    loop.shutdownAndWait()
  }

  /// Promise (invalidate: no callout starts after it returns; loop-thread changes take effect at
  /// once): ten sources of one order in `.common`, all signalled for the same pass; the first
  /// one's perform invalidates the even ones and removes the odd ones from the mode being run.
  /// Exactly the first one performs in that pass; the removed ones keep their signal and perform
  /// once each in another common mode they are still in (added by name).
  @Test func aPerformThatInvalidatesAndRemovesTheRestOfItsPass() async throws {
    let report = try await withWatchdogOnThread(timeout: .seconds(20), "perform vs its pass") { () throws -> [String] in
      let loop = try RunLoopThread(name: "pass")
      defer { loop.shutdownAndWait() }
      return try loop.performAndWait { () -> [String] in
        let mode = RunLoopMode("pass-run")
        let other = RunLoopMode("pass-other")
        loop.addModeToCommonModes(mode)
        loop.addModeToCommonModes(other)
        let performed = Guarded<[Int]>([])
        let pool = Guarded<[InputSource]>([])
        let sources = (0..<10).map { index in
          InputSource { _ in
            performed.withLock { $0.append(index) }
            guard index == 0 else { return }
            for (other, source) in pool.snapshot.enumerated().dropFirst() {
              if other % 2 == 0 { source.invalidate() } else { loop.remove(source, from: mode) }
            }
          }
        }
        pool.withLock { $0 = sources }
        for source in sources {
          loop.add(source, to: mode)
          loop.add(source, to: other)
        }
        for source in sources { source.signal() }
        loop.run(mode: mode, until: .now)
        var wrong: [String] = []
        if performed.snapshot != [0] { wrong.append("in \(mode): \(performed.snapshot)") }
        performed.withLock { $0.removeAll() }
        loop.run(mode: other, until: .now)
        if performed.snapshot != [1, 3, 5, 7, 9] { wrong.append("in \(other): \(performed.snapshot)") }
        for source in sources { source.invalidate() }
        return wrong
      }
    }
    #expect(report == [])
  }
}
