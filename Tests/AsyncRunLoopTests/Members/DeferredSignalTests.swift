import Glibc
import Testing

@testable import AsyncRunLoop

private let deferredModeA: RunLoopMode = "deferred-a"
private let deferredModeB: RunLoopMode = "deferred-b"

/// An object to watch with a weak reference (captured by a source's routine).
private final class DeferredToken: Sendable {}

/// One pass of `mode` on the calling loop thread.
private func onePass(_ loop: RunLoopThread, _ mode: RunLoopMode) {
  _ = loop.run(mode: mode, until: .now)
}

/// Sources signalled while none of their modes runs wait for one of them (`SignalledSources.deferred`).
/// A pass in a mode sorts them out once and then leaves them alone until a source joins a mode,
/// and a removal does not search them: these are the ways a waiting source can become due in
/// the running mode, and what a removed one leaves behind.
@Suite("Sources signalled while their modes do not run", .serialized, .timeLimit(.minutes(10)))
struct DeferredSignalTests {
  /// Two sources signalled in A, the second also in B: the first one's handler takes the second
  /// out of A. The second does not fire in A (it is no longer in the mode that runs, as an observer
  /// removed by an earlier callout is not told); its signal waits for B, where it fires once.
  @Test func aSourceTakenOutOfTheRunningModeByAnEarlierHandlerWaitsForItsOtherMode() async throws {
    let problems = try await withWatchdogOnThread(
      timeout: .seconds(20), "aSourceTakenOutOfTheRunningModeByAnEarlierHandlerWaitsForItsOtherMode"
    ) { () -> [String] in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      var problems: [String] = []
      let log = Locked<[String]>([])
      let second = InputSource(order: 1) { _ in log.withLock { $0.append("second") } }
      let first = InputSource(order: 0) { _ in
        log.withLock { $0.append("first") }
        loop.remove(second, from: deferredModeA)
      }
      loop.add(first, to: deferredModeA)
      loop.add(second, to: deferredModeA)
      loop.add(second, to: deferredModeB)
      first.signal()
      second.signal()
      onePass(loop, deferredModeA)
      let afterA = log.withLock { $0 }
      onePass(loop, deferredModeB)
      onePass(loop, deferredModeB)
      let afterB = log.withLock { $0 }
      if afterA != ["first"] { problems.append("in A: \(afterA)") }
      if afterB != ["first", "second"] { problems.append("in B: \(afterB)") }
      for member in [first, second] { member.invalidate() }
      return problems
    }
    #expect(problems == [])
  }

  /// A source signalled in B while A runs waits; added to A by a handler of another source (a
  /// join after A's pass sorted it out), it fires in A's next pass, once, even though A's passes
  /// in between found nothing new.
  @Test func aWaitingSourceThatJoinsTheRunningModeFiresThere() async throws {
    let problems = try await withWatchdogOnThread(
      timeout: .seconds(20), "aWaitingSourceThatJoinsTheRunningModeFiresThere"
    ) { () -> [String] in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      var problems: [String] = []
      func check(_ holds: Bool, _ what: String = "", line: Int = #line) {
        if !holds { problems.append("line \(line) \(what)") }
      }
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: deferredModeA)
      let fires = AtomicCounter()
      let waiting = InputSource { _ in fires.increment() }
      loop.add(waiting, to: deferredModeB)
      let mover = InputSource { _ in loop.add(waiting, to: deferredModeA) }
      loop.add(mover, to: deferredModeA)
      waiting.signal()
      onePass(loop, deferredModeA)
      onePass(loop, deferredModeA)  // sorted out already: nothing new
      let beforeJoin = fires.current
      mover.signal()
      onePass(loop, deferredModeA)  // the mover's handler adds it to A
      onePass(loop, deferredModeA)
      let afterJoin = fires.current
      onePass(loop, deferredModeB)
      check(beforeJoin == 0)
      check(afterJoin == 1)
      check(fires.current == 1, "fired again in B: one signal, one fire")
      for member in [waiting, mover] { member.invalidate() }
      keep.invalidate()
      return problems
    }
    #expect(problems == [])
  }

  /// The same when the waiting source is in `.common` only while A is outside the common set:
  /// A joining the common set brings it into A, and A's next pass fires it.
  @Test func aWaitingCommonSourceFiresWhenItsModeJoinsTheCommonSet() async throws {
    let problems = try await withWatchdogOnThread(
      timeout: .seconds(20), "aWaitingCommonSourceFiresWhenItsModeJoinsTheCommonSet"
    ) { () -> [String] in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      var problems: [String] = []
      func check(_ holds: Bool, _ what: String = "", line: Int = #line) {
        if !holds { problems.append("line \(line) \(what)") }
      }
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: deferredModeA)
      let fires = AtomicCounter()
      let waiting = InputSource { _ in fires.increment() }
      loop.add(waiting, to: .common)
      waiting.signal()
      onePass(loop, deferredModeA)
      onePass(loop, deferredModeA)
      let before = fires.current
      loop.addModeToCommonModes(deferredModeA)
      onePass(loop, deferredModeA)
      check(before == 0)
      check(fires.current == 1)
      waiting.invalidate()
      keep.invalidate()
      return problems
    }
    #expect(problems == [])
  }

  /// A handler in A runs the loop nested in B: the source waiting for B fires there, and not
  /// again when the outer run goes on in A.
  @Test func aRunNestedInAnotherModeFiresTheSourceWaitingForIt() async throws {
    let problems = try await withWatchdogOnThread(
      timeout: .seconds(20), "aRunNestedInAnotherModeFiresTheSourceWaitingForIt"
    ) { () -> [String] in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      var problems: [String] = []
      func check(_ holds: Bool, _ what: String = "", line: Int = #line) {
        if !holds { problems.append("line \(line) \(what)") }
      }
      let keepA = LoopTimer(after: .seconds(3600)) { _ in }
      let keepB = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepA, to: deferredModeA)
      loop.add(keepB, to: deferredModeB)
      let log = EventLog()
      let waiting = InputSource { _ in log.add("waiting") }
      loop.add(waiting, to: deferredModeB)
      let nester = InputSource { _ in
        log.add("nester")
        _ = loop.run(mode: deferredModeB, until: .now)
        log.add("nested run ended")
      }
      loop.add(nester, to: deferredModeA)
      waiting.signal()
      onePass(loop, deferredModeA)
      nester.signal()
      onePass(loop, deferredModeA)
      onePass(loop, deferredModeA)
      check(log.snapshot == ["nester", "waiting", "nested run ended"])
      for member in [waiting, nester] { member.invalidate() }
      keepA.invalidate()
      keepB.invalidate()
      return problems
    }
    #expect(problems == [])
  }

  /// 3,000 sources signalled in B wait while A runs; removed from B (half) and invalidated (the
  /// rest) on the loop thread, none fires when B runs, each cancel routine runs once, and none is
  /// kept alive by the loop (the waiting list may still hold their detached records).
  @Test func waitingSourcesRemovedOrInvalidatedNeverFireAndAreReleased() async throws {
    let problems = try await withWatchdogOnThread(
      timeout: .seconds(20), "waitingSourcesRemovedOrInvalidatedNeverFireAndAreReleased"
    ) { () -> [String] in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      var problems: [String] = []
      func check(_ holds: Bool, _ what: String = "", line: Int = #line) {
        if !holds { problems.append("line \(line) \(what)") }
      }
      let keepA = LoopTimer(after: .seconds(3600)) { _ in }
      let keepB = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepA, to: deferredModeA)
      loop.add(keepB, to: deferredModeB)
      let fires = AtomicCounter()
      let cancels = AtomicCounter()
      let count = 3_000
      var weakTokens: [() -> DeferredToken?] = []
      do {
        var sources: [InputSource] = []
        for _ in 0..<count {
          let token = DeferredToken()
          weak let weakToken = token
          weakTokens.append { weakToken }
          let source = InputSource(
            cancel: { _, _ in cancels.increment() },
            perform: { _ in
              withExtendedLifetime(token) {}
              fires.increment()
            })
          loop.add(source, to: deferredModeB)
          sources.append(source)
        }
        for source in sources { source.signal() }
        onePass(loop, deferredModeA)
        for (index, source) in sources.enumerated() {
          if index % 2 == 0 { loop.remove(source, from: deferredModeB) } else { source.invalidate() }
        }
      }
      onePass(loop, deferredModeB)
      onePass(loop, deferredModeA)
      check(fires.current == 0)
      check(cancels.current == count)
      check(weakTokens.filter { $0() != nil }.count == 0, "sources kept alive after they left the loop")
      #expect(loop.core.modeTable.allRecords.count == 2)  // the two timers
      keepA.invalidate()
      keepB.invalidate()
      return problems
    }
    #expect(problems == [])
  }

  /// A waiting source removed from B and added again (a new stay) while still signalled fires
  /// once when B runs: the stale entry of its old stay is skipped, the signal is the source's.
  @Test func aWaitingSourceReaddedFiresOnceForItsSignal() async throws {
    let problems = try await withWatchdogOnThread(timeout: .seconds(20), "aWaitingSourceReaddedFiresOnceForItsSignal") {
      () -> [String] in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      var problems: [String] = []
      func check(_ holds: Bool, _ what: String = "", line: Int = #line) {
        if !holds { problems.append("line \(line) \(what)") }
      }
      let keepA = LoopTimer(after: .seconds(3600)) { _ in }
      let keepB = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepA, to: deferredModeA)
      loop.add(keepB, to: deferredModeB)
      let fires = AtomicCounter()
      let waiting = InputSource { _ in fires.increment() }
      loop.add(waiting, to: deferredModeB)
      waiting.signal()
      onePass(loop, deferredModeA)
      loop.remove(waiting, from: deferredModeB)
      loop.add(waiting, to: deferredModeB)
      onePass(loop, deferredModeA)
      onePass(loop, deferredModeB)
      onePass(loop, deferredModeB)
      check(fires.current == 1)
      waiting.invalidate()
      keepA.invalidate()
      keepB.invalidate()
      return problems
    }
    #expect(problems == [])
  }
}
