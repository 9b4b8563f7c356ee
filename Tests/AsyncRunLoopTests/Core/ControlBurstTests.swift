import Glibc
import Testing

@testable import AsyncRunLoop

/// Bursts of registration changes from other threads, larger than one inbox chunk
/// (`LoopInbox.controlChunkCapacity`): still applied in the order each thread made them, with
/// one `cancel` for every `schedule`.
@Suite("Bursts of cross-thread changes")
struct ControlBurstTests {
  /// A source that counts its schedule and cancel routines.
  final class CountedSource: Sendable {
    let schedules = AtomicCounter()
    let cancels = AtomicCounter()
    let source: InputSource

    init() {
      let schedules = self.schedules
      let cancels = self.cancels
      source = InputSource(
        schedule: { _, _, _ in schedules.increment() }, cancel: { _, _ in cancels.increment() }, perform: { _ in })
    }
  }

  /// Three threads add and remove their own sources 1,000 times each while the loop is blocked,
  /// so that about 24,000 changes wait in the inbox at once (some two dozen chunks). Each add
  /// after a removal is a new stay on the loop: its schedule runs, and the removal's cancel.
  @Test func aBurstAcrossManyChunksKeepsEachThreadsOrder() async throws {
    let loop = try RunLoopThread(name: "burst")
    defer { loop.shutdown() }
    let rounds = 1_000
    let perThread = 4
    let sources = (0..<3).map { _ in (0..<perThread).map { _ in CountedSource() } }
    let outcome = await execOnNewThread { () -> [[(schedules: Int, cancels: Int, modes: Int)]] in
      let release = blockLoop(loop)
      race(
        sources.map { own in
          {
            for round in 0..<rounds {
              for counted in own { loop.add(counted.source) }
              // The last round leaves the even-numbered sources in the mode.
              for (index, counted) in own.enumerated() where round < rounds - 1 || index % 2 == 1 {
                loop.remove(counted.source)
              }
            }
          }
        })
      release.open()
      let modes = try! loop.performAndWait {
        sources.map { own in own.map { loop.core.modeCount(of: $0.source) } }
      }
      return sources.enumerated().map { thread, own in
        own.enumerated().map { index, counted in
          (counted.schedules.current, counted.cancels.current, modes[thread][index])
        }
      }
    }
    for (thread, own) in outcome.enumerated() {
      for (index, counts) in own.enumerated() {
        let stays = index % 2 == 0 ? 1 : 0
        #expect(counts.schedules == rounds, "thread \(thread) source \(index)")
        #expect(counts.cancels == rounds - stays, "thread \(thread) source \(index)")
        #expect(counts.modes == stays, "thread \(thread) source \(index)")
      }
    }
    for own in sources { for counted in own { counted.source.invalidate() } }
  }

  /// Three threads perform 3,000 blocks each into a blocked loop (about nine chunks), every other
  /// one for a mode the loop is not running: the default-mode blocks run once each in their
  /// thread's order, and the others wait, in order, for a run of their mode.
  @Test func aBurstOfBlocksAcrossChunksRunsEachOnceInOrder() async throws {
    let other: RunLoopMode = "burst-other"
    let perThread = 3_000
    let outcome = await execOnNewThread { () -> (default: [[Int]], other: [[Int]]) in
      let loop = try! RunLoopThread(name: "burst-blocks")
      defer { loop.shutdownAndWait() }
      let ran = Guarded<[[Int]]>(Array(repeating: [], count: 3))
      let release = blockLoop(loop)
      race(
        (0..<3).map { thread in
          {
            for index in 0..<perThread {
              let mode: RunLoopMode = index % 2 == 0 ? .default : other
              loop.perform(inModes: [mode]) { ran.withLock { $0[thread].append(index) } }
            }
          }
        })
      release.open()
      let inDefault = try! loop.performAndWait { ran.withLock { $0 } }
      let inOther = try! loop.performAndWait { () -> [[Int]] in
        ran.withLock { $0 = Array(repeating: [], count: 3) }
        _ = loop.run(mode: other, until: .now.advanced(by: .milliseconds(200)))
        return ran.withLock { $0 }
      }
      return (inDefault, inOther)
    }
    let evens = Array(stride(from: 0, to: perThread, by: 2))
    let odds = Array(stride(from: 1, to: perThread, by: 2))
    for thread in 0..<3 {
      // Compared as Bools: a failure prints counts, not 3,000 numbers.
      let defaultInOrder = outcome.default[thread] == evens
      let otherInOrder = outcome.other[thread] == odds
      #expect(defaultInOrder, "thread \(thread): \(outcome.default[thread].count) default-mode blocks, not in order")
      #expect(otherInOrder, "thread \(thread): \(outcome.other[thread].count) other-mode blocks, not in order")
    }
  }

  /// A call on the loop thread comes after every change another thread sent before it, even when
  /// nothing else woke the loop in between: here the removal is sent while the loop runs a
  /// block, and the same block (told once the removal was sent) adds the source again.
  @Test func aLoopThreadAddComesAfterARemovalSentBeforeIt() async throws {
    let log = await execOnNewThread { () -> [String] in
      let loop = try! RunLoopThread(name: "burst-order")
      defer { loop.shutdownAndWait() }
      let events = EventLog()
      let source = InputSource(
        schedule: { _, _, _ in events.add("schedule") }, cancel: { _, _ in events.add("cancel") }, perform: { _ in })
      loop.add(source)
      try! loop.performAndWait {}  // scheduled
      let blockStarted = TestGate()
      let removalSent = TestGate()
      let added = TestGate()
      loop.perform {
        blockStarted.open()
        _ = removalSent.wait(timeout: .seconds(20))
        loop.add(source)  // on the loop thread: the removal sent before must come first
        added.open()
      }
      _ = blockStarted.wait(timeout: .seconds(20))  // the removal reaches a loop busy in the block
      loop.remove(source)
      removalSent.open()
      _ = added.wait(timeout: .seconds(20))
      try! loop.performAndWait {}
      source.invalidate()
      try! loop.performAndWait {}
      return events.entries.withLock { $0 }
    }
    #expect(log == ["schedule", "cancel", "schedule", "cancel"])
  }

  /// "At most 256 per pass" holds for the pass as a whole, not for each of its calls that apply
  /// changes (the run's start, step 2, each work point, the one after the wake): 1,000 adds sent
  /// while the loop runs a block are applied 256 per one-pass run nested in that block (a run
  /// whose time limit has passed makes exactly one pass).
  @Test func aBurstSentWhileTheLoopIsHeldIsAppliedAtMostABudgetPerPass() async throws {
    let budget = LoopChangeQueue.perPass
    let total = 1_000
    let perPass = await execOnNewThread { () -> [Int] in
      let loop = try! RunLoopThread(name: "burst-budget")
      defer { loop.shutdownAndWait() }
      let scheduled = AtomicCounter()
      let sources = (0..<total).map { _ in
        InputSource(schedule: { _, _, _ in scheduled.increment() }, cancel: { _, _ in }, perform: { _ in })
      }
      let blockStarted = TestGate()
      let sent = TestGate()
      let finished = TestGate()
      let counted = Guarded<[Int]>([])
      loop.perform {
        blockStarted.open()
        _ = sent.wait(timeout: .seconds(20 * watchdogScale))
        var before = scheduled.current
        for _ in 0..<(total / budget + 3) {
          _ = loop.run(mode: .default, until: .now)
          let now = scheduled.current
          counted.withLock { $0.append(now - before) }
          before = now
        }
        finished.open()
      }
      _ = blockStarted.wait(timeout: .seconds(20 * watchdogScale))
      for source in sources { loop.add(source) }  // all wait in the inbox
      sent.open()
      _ = finished.wait(timeout: .seconds(20 * watchdogScale))  // (a block performed now would run in those runs)
      for source in sources { source.invalidate() }
      return counted.snapshot
    }
    let expected = [budget, budget, budget, total - 3 * budget, 0, 0]
    #expect(perPass == expected, "changes applied per one-pass run: \(perPass)")
  }
}
