import Glibc
import Testing

@testable import AsyncRunLoop

// MARK: - 5. Sources signalled while their modes do not run

@Suite("A signalled source whose mode does not run waits for it", .serialized, .timeLimit(.minutes(10)))
struct DeferredSignalledSourceTests {
  /// Runs `loop` in `mode` (from a performed block) with a keep-alive timer, returning after a
  /// source fired or 5 s; `entered` opens once the run has made a pass and slept.
  private static func runM(
    _ loop: RunLoopThread, entered: TestGate, result: Guarded<RunLoopRunResult?>
  ) {
    loop.perform {
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: drainModeM)
      let observer = LoopObserver(activities: .beforeWaiting) { _, _ in entered.open() }
      loop.add(observer, to: drainModeM)
      let value = loop.run(mode: drainModeM, for: .seconds(5), returnAfterSourceHandled: true)
      observer.invalidate()
      keep.invalidate()
      result.withLock { $0 = value }
    }
  }

  /// A source in `.common` is signalled while the loop runs a mode outside the common set (the
  /// pass defers it and sleeps); then that mode joins the common set. Promised: the mode receives
  /// the source, which fires there once (the run returns `.handledSource`).
  @Test func aDeferredSourceFiresWhenTheRunningModeJoinsTheCommonSet() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "mode joins common") {
      () throws -> (result: RunLoopRunResult?, performs: Int) in
      let loop = try RunLoopThread(name: "s1")
      defer { loop.shutdownAndWait() }
      let performs = AtomicCounter()
      let source = InputSource(perform: { _ in performs.increment() })
      loop.add(source, to: .common)
      let entered = TestGate()
      let result = Guarded<RunLoopRunResult?>(nil)
      Self.runM(loop, entered: entered, result: result)
      _ = entered.wait(timeout: .seconds(10))
      source.signal()
      usleep(20_000)  // a pass in M defers it and sleeps again
      loop.addModeToCommonModes(drainModeM)
      _ = waitUntil(timeout: .seconds(10), "the run ended") { result.snapshot != nil }
      source.invalidate()
      return (result.snapshot, performs.current)
    }
    guard let outcome else { return }
    #expect(outcome.result == .handledSource)
    #expect(outcome.performs == 1)
  }

  /// A source in mode X is signalled while the loop runs mode M (deferred), then removed from X
  /// and added to M. Promised: the signal stays with the source for where it joins next: it fires
  /// once in M.
  @Test func aDeferredSourceReaddedToTheRunningModeFiresOnce() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "re-added deferred source") {
      () throws -> (result: RunLoopRunResult?, performs: Int, log: [String]) in
      let loop = try RunLoopThread(name: "s2")
      defer { loop.shutdownAndWait() }
      let performs = AtomicCounter()
      let log = EventLog()
      let source = InputSource(
        schedule: { _, _, mode in log.add("schedule \(mode)") }, cancel: { _, _ in log.add("cancel") },
        perform: { _ in performs.increment() })
      loop.add(source, to: drainModeX)
      let entered = TestGate()
      let result = Guarded<RunLoopRunResult?>(nil)
      Self.runM(loop, entered: entered, result: result)
      _ = entered.wait(timeout: .seconds(10))
      source.signal()
      usleep(20_000)
      loop.remove(source, from: drainModeX)
      loop.add(source, to: drainModeM)
      _ = waitUntil(timeout: .seconds(10), "the run ended") { result.snapshot != nil }
      usleep(20_000)
      source.invalidate()
      return (result.snapshot, performs.current, log.snapshot)
    }
    guard let outcome else { return }
    #expect(outcome.result == .handledSource)
    #expect(outcome.performs == 1, "\(outcome.log)")
  }

  /// A source in mode X is signalled while loop A runs mode M (deferred), then moved to loop B's
  /// default mode (B idles in it). Promised: it fires once, on B, never on A.
  @Test func aDeferredSourceMovedToAnotherLoopFiresOnceThere() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "moved deferred source") {
      () throws -> (fires: [String], result: RunLoopRunResult?) in
      let loopA = try RunLoopThread(name: "s3a")
      let loopB = try RunLoopThread(name: "s3b")
      defer {
        loopA.shutdownAndWait()
        loopB.shutdownAndWait()
      }
      let fires = Guarded<[String]>([])
      let source = InputSource(perform: { _ in fires.withLock { $0.append(RunLoopThread.current.name) } })
      loopA.add(source, to: drainModeX)
      let entered = TestGate()
      let result = Guarded<RunLoopRunResult?>(nil)
      Self.runM(loopA, entered: entered, result: result)
      _ = entered.wait(timeout: .seconds(10))
      source.signal()
      usleep(20_000)
      loopA.remove(source, from: drainModeX)
      loopB.add(source)
      _ = waitUntil(timeout: .seconds(10), "fired") { !fires.snapshot.isEmpty }
      loopA.stop()
      _ = waitUntil(timeout: .seconds(10), "A's run ended") { result.snapshot != nil }
      usleep(20_000)
      source.invalidate()
      return (fires.snapshot, result.snapshot)
    }
    guard let outcome else { return }
    #expect(outcome.fires == ["s3b"])
    #expect(outcome.result == .stopped)
  }

  /// A source in mode X only is signalled while the loop runs M (deferred); a timer in M then runs
  /// X nested, and later M keeps running. Promised: the source fires once, in the nested run of X,
  /// and not again in M; a second signal while M runs is deferred again and fires on the next
  /// nested run of X.
  @Test func aDeferredSourceFiresOnceInANestedRunOfItsMode() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "nested run of the deferred mode") {
      () throws -> [String] in
      let loop = try RunLoopThread(name: "s4")
      defer { loop.shutdownAndWait() }
      let log = EventLog()
      let nestedDepth = Guarded(0)
      let source = InputSource(perform: { _ in log.add(nestedDepth.snapshot > 0 ? "fired nested" : "fired outer") })
      loop.add(source, to: drainModeX)
      let entered = TestGate()
      let result = Guarded<RunLoopRunResult?>(nil)
      let nester = LoopTimer(after: .seconds(3600), repeatingEvery: .seconds(3600)) { _ in
        nestedDepth.withLock { $0 += 1 }
        _ = RunLoopThread.current.run(mode: drainModeX, for: .milliseconds(20))
        nestedDepth.withLock { $0 -= 1 }
        log.add("nested done")
      }
      loop.add(nester, to: drainModeM)
      Self.runM(loop, entered: entered, result: result)
      _ = entered.wait(timeout: .seconds(10))
      for _ in 0..<2 {
        source.signal()
        usleep(20_000)
        nester.setFireDate(.now)
        _ = waitUntil(timeout: .seconds(10), "nested run done") { log.count("nested done") >= 1 }
        usleep(20_000)
        log.add("round")
        log.entries.withLock { $0.removeAll { $0 == "nested done" } }
      }
      loop.stop()
      _ = waitUntil(timeout: .seconds(10), "the run ended") { result.snapshot != nil }
      nester.invalidate()
      source.invalidate()
      return log.snapshot
    }
    guard let outcome else { return }
    #expect(outcome == ["fired nested", "round", "fired nested", "round"])
  }
}
