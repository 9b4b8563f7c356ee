import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

@Suite("Custom input source routines", .timeLimit(.minutes(10)))
struct InputSourceRoutineTests {
  let modeM = RunLoopMode("src-m")

  /// Moves a source A → B → A from the test's thread (each add right after the removal it
  /// follows, as the docs allow), optionally invalidating it right after the last add, and
  /// returns each loop's routine calls ("s <mode>" / "c"), each checked to run on that loop's
  /// thread with that loop as argument.
  private func moveAround(invalidateAtOnce: Bool, rounds: Int) async throws -> [String] {
    let loopA = try RunLoopThread(name: "sc-a")
    let loopB = try RunLoopThread(name: "sc-b")
    let mode = modeM
    var wrong: [String] = []
    for round in 0..<rounds {
      let log = Guarded<[String: [String]]>([:])
      let source = InputSource(
        schedule: { _, loop, mode in
          let here = RunLoopThread.currentIfExists === loop && loop.isOnLoopThread
          log.withLock { $0[loop.name, default: []].append("s \(mode.rawValue)\(here ? "" : " off-thread")") }
        },
        cancel: { _, loop in
          let here = RunLoopThread.currentIfExists === loop && loop.isOnLoopThread
          log.withLock { $0[loop.name, default: []].append("c\(here ? "" : " off-thread")") }
        },
        perform: { _ in })
      loopA.add(source, to: mode)
      loopA.add(source)  // a second mode on the same loop: no second schedule
      loopA.remove(source, from: mode)
      loopA.remove(source)
      loopB.add(source)
      loopB.remove(source)
      loopA.add(source, to: mode)
      if invalidateAtOnce { source.invalidate() }
      _ = await runOnLoopThread(loopA) { 0 }
      _ = await runOnLoopThread(loopB) { 0 }
      _ = await runOnLoopThread(loopA) { 0 }
      source.invalidate()
      _ = await runOnLoopThread(loopA) { 0 }
      let seen = log.snapshot
      let expected: [String: [String]] = [
        "sc-a": ["s src-m", "c", "s src-m", "c"], "sc-b": ["s kCFRunLoopDefaultMode", "c"],
      ]
      if seen != expected { wrong.append("round \(round): \(seen)") }
    }
    await execShutdown(loopA)
    await execShutdown(loopB)
    return wrong
  }

  /// schedule once per loop joined and cancel once per loop left, in that order per loop, on
  /// that loop's thread, with the mode it joined in; also when it moves between loops at once.
  @Test func scheduleAndCancelPairPerLoopWhenMovedBetweenLoops() async throws {
    let wrong = try await moveAround(invalidateAtOnce: false, rounds: 8)
    #expect(wrong == [])
  }

  /// The same moves with `invalidate()` right after the last add ("an add made before an
  /// invalidation is still scheduled (and then cancelled)"). Failed in 2-5 of 8 rounds before
  /// stale adds were ignored: a loop applying the queued adds after the invalidation detached the
  /// record at its first add, then attached it again at the second (an extra schedule with the
  /// wrong mode), which also used up a pending join, so a later loop got no schedule at all.
  @Test func scheduleAndCancelPairPerLoopWhenMovedThenInvalidated() async throws {
    let wrong = try await moveAround(invalidateAtOnce: true, rounds: 8)
    #expect(wrong == [])
  }

  /// signal() before add fires once after the add; signal() on an invalidated source is a no-op.
  @Test func signalBeforeAddFiresOnceAndAfterInvalidateNever() async throws {
    let thread = CommandedCurrentLoopThread()
    defer { thread.quit() }
    let outcome = await thread.exec { loop -> [Int] in
      let performed = Locked(0)
      let source = InputSource { _ in performed.withLock { $0 += 1 } }
      source.signal()
      source.signal()
      loop.add(source)
      _ = loop.run(for: .milliseconds(30))
      let afterAdd = performed.withLock { $0 }
      let gone = InputSource { _ in performed.withLock { $0 += 100 } }
      loop.add(gone)
      gone.invalidate()
      gone.signal()
      let signalled = gone.isSignalled ? 1 : 0
      _ = loop.run(for: .milliseconds(30))
      source.invalidate()
      return [afterAdd, signalled, performed.withLock { $0 }]
    }
    #expect(outcome == [1, 0, 1])
  }

  /// A signal from inside its own perform routine fires it again exactly once: not lost, and the
  /// loop does not spin on it (it sleeps afterwards).
  @Test func aSignalFromItsOwnPerformFiresOnceMore() async throws {
    let thread = CommandedCurrentLoopThread()
    defer { thread.quit() }
    let outcome = await thread.exec { loop -> (Int, Int) in
      let performed = Locked(0)
      let source = InputSource { source in
        let count = performed.withLock { value -> Int in
          value += 1
          return value
        }
        if count == 1 { source.signal() }
      }
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepAlive)
      loop.add(source)
      let sleeps = Locked(0)
      // The run ends at the first sleep after the second perform (not at a time limit, which a
      // loaded or sanitized run can reach before the loop ever gets to sleep).
      let observer = LoopObserver(activities: .beforeWaiting) { _, _ in
        sleeps.withLock { $0 += 1 }
        if performed.withLock({ $0 }) >= 2 { loop.stop() }
      }
      loop.add(observer)
      source.signal()
      _ = loop.run(for: .seconds(10))
      observer.invalidate()
      source.invalidate()
      keepAlive.invalidate()
      return (performed.withLock { $0 }, sleeps.withLock { $0 })
    }
    #expect(outcome.0 == 2)
    #expect(outcome.1 >= 1 && outcome.1 < 20, "passes that slept: \(outcome.1)")
  }

  /// Ready sources fire lower order first, equal orders in signalling order, in one pass.
  @Test func readySourcesFireByOrderThenSignallingOrder() async throws {
    let thread = CommandedCurrentLoopThread()
    defer { thread.quit() }
    let order = await thread.exec { loop -> [String] in
      let log = Locked<[String]>([])
      let passes = Locked(0)
      func make(_ name: String, _ order: Int) -> InputSource {
        InputSource(order: order) { _ in log.withLock { $0.append("\(name)@\(passes.withLock { $0 })") } }
      }
      let sources = [make("three", 3), make("one", 1), make("twoA", 2), make("twoB", 2), make("minus", -5)]
      for source in sources { loop.add(source) }
      let observer = LoopObserver(activities: .beforeSources) { _, _ in passes.withLock { $0 += 1 } }
      loop.add(observer)
      // Signalling order: three, twoB, one, minus, twoA.
      for index in [0, 3, 1, 4, 2] { sources[index].signal() }
      _ = loop.run(for: .seconds(5), returnAfterSourceHandled: true)
      observer.invalidate()
      for source in sources { source.invalidate() }
      return log.withLock { $0 }
    }
    #expect(order == ["minus@1", "one@1", "twoB@1", "twoA@1", "three@1"])
  }

  /// A source in two modes (by name, and through `.common`) fires once per signal, whichever of
  /// its modes runs.
  @Test func aSourceInSeveralModesFiresOncePerSignal() async throws {
    let thread = CommandedCurrentLoopThread()
    defer { thread.quit() }
    let mode = modeM
    let counts = await thread.exec { loop -> [Int] in
      let performed = Locked(0)
      let source = InputSource { _ in performed.withLock { $0 += 1 } }
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepAlive)
      loop.add(keepAlive, to: mode)
      loop.add(source)
      loop.add(source, to: mode)
      loop.add(source, to: .common)
      source.signal()
      _ = loop.run(for: .seconds(5), returnAfterSourceHandled: true)
      _ = loop.run(mode: mode, for: .milliseconds(20))
      _ = loop.run(for: .milliseconds(20))
      let first = performed.withLock { $0 }
      source.signal()
      _ = loop.run(mode: mode, for: .seconds(5), returnAfterSourceHandled: true)
      _ = loop.run(for: .milliseconds(20))
      let second = performed.withLock { $0 }
      source.invalidate()
      keepAlive.invalidate()
      return [first, second]
    }
    #expect(counts == [1, 2])
  }
}
