import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("The 32-bit common order of changes wraps safely", .serialized, .timeLimit(.minutes(10)))
struct CommonOrderTests {
  /// Observers of equal order in `.common` are told, in a mode that joins the common set later,
  /// in the order they were added to `.common`, across two wraps of the 32-bit count: one left
  /// `.common` and came back (last), one was removed from `.default` by name only (kept), one
  /// left `.common` for good; timers due together fire in that order too.
  @Test func modesJoiningTheCommonSetLaterKeepTheOrderAcrossTwoWraps() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "common order") {
      () -> (first: [String], second: [String], timers: [String]) in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      let log = Locked<[String]>([])
      let observers = (0..<11).map { index in
        LoopObserver(activities: .entry) { _, _ in log.withLock { $0.append("o\(index)") } }
      }
      let timerLog = Locked<[String]>([])
      // Due after the two short runs below (which must not fire them): the run in B fires them.
      // (Scaled: under a sanitizer the setup alone can take longer than 300 ms.)
      let due = LoopClock.Instant.now.advanced(by: .milliseconds(300) * watchdogScale)
      let timers = (0..<11).map { index in
        LoopTimer(fireAt: due, repeatingEvery: .seconds(3600)) { _ in timerLog.withLock { $0.append("t\(index)") } }
      }
      let modeTable = loop.core.modeTable
      modeTable.setCommonOrderCountForTesting(UInt32.max - 3)
      for index in 0..<8 {
        loop.add(observers[index], to: .common)
        loop.add(timers[index], to: .common)
      }
      loop.remove(observers[1], from: .common)
      loop.remove(timers[1], from: .common)
      loop.remove(observers[2], from: .default)  // by name: still in the common set
      loop.remove(timers[2], from: .default)
      loop.remove(observers[5], from: .common)  // for good
      loop.remove(timers[5], from: .common)
      loop.add(observers[1], to: .common)  // back, last
      loop.add(timers[1], to: .common)
      func tellEntry(_ mode: RunLoopMode) -> [String] {
        log.withLock { $0.removeAll() }
        let keep = LoopTimer(after: .seconds(3600)) { _ in }
        loop.add(keep, to: mode)
        _ = loop.run(mode: mode, until: .now.advanced(by: .milliseconds(5)))
        keep.invalidate()
        return log.withLock { $0 }
      }
      loop.addModeToCommonModes(payloadModeA)
      let first = tellEntry(payloadModeA)
      // As if 2^32 more adds had happened: the next adds wrap again.
      modeTable.setCommonOrderCountForTesting(UInt32.max - 1)
      for index in 8..<11 {
        loop.add(observers[index], to: .common)
        loop.add(timers[index], to: .common)
      }
      loop.addModeToCommonModes(payloadModeB)
      let second = tellEntry(payloadModeB)
      // Only B runs the timers (out of default and A by name; B holds them through the set).
      for timer in timers {
        loop.remove(timer, from: .default)
        loop.remove(timer, from: payloadModeA)
      }
      timerLog.withLock { $0.removeAll() }
      _ = loop.run(mode: payloadModeB, until: due.advanced(by: .milliseconds(50)))
      for member in observers { member.invalidate() }
      for timer in timers { timer.invalidate() }
      return (first, second, timerLog.withLock { $0 })
    }
    #expect(outcome?.first == ["o0", "o2", "o3", "o4", "o6", "o7", "o1"])
    #expect(outcome?.second == ["o0", "o2", "o3", "o4", "o6", "o7", "o1", "o8", "o9", "o10"])
    #expect(outcome?.timers == ["t0", "t2", "t3", "t4", "t6", "t7", "t1", "t8", "t9", "t10"])
  }

  /// Many members of every kind in `.common` with the count at its wrap: the renumbering keeps
  /// every one of them in the set (each still leaves only by a removal of `.common`).
  @Test func theRenumberingKeepsEveryCommonMemberOnTheLoop() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "renumbering") { () -> [String] in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      var problems: [String] = []
      let pairs = PairLog()
      let sources = (0..<50).map { _ in
        InputSource(schedule: { _, loop, _ in pairs.schedule(loop) }, cancel: { _, loop in pairs.cancel(loop) }) { _ in
        }
      }
      let timers = (0..<50).map { _ in makeParkedTimer { _ in } }
      loop.core.modeTable.setCommonOrderCountForTesting(UInt32.max - 60)
      for index in 0..<50 {
        loop.add(sources[index], to: .common)
        loop.add(timers[index], to: .common)
      }
      // Out of .default by name: only the common set keeps them on the loop.
      for index in 0..<50 {
        loop.remove(sources[index], from: .default)
        loop.remove(timers[index], from: .default)
      }
      loop.addModeToCommonModes(payloadModeC)
      for index in 0..<50 {
        if loop.core.modes(of: sources[index]) != [payloadModeC] { problems.append("source \(index)") }
        if loop.core.modes(of: timers[index]) != [payloadModeC] { problems.append("timer \(index)") }
      }
      for index in 0..<50 {
        loop.remove(sources[index], from: .common)
        loop.remove(timers[index], from: .common)
      }
      if loop.core.modeTable.allRecords.count != 0 {
        problems.append("records left: \(loop.core.modeTable.allRecords.count)")
      }
      problems += pairs.unpaired
      for source in sources { source.invalidate() }
      for timer in timers { timer.invalidate() }
      return problems
    }
    #expect(outcome == [])
  }
}
