import Glibc
import Testing

@testable import AsyncRunLoop

/// A nested run makes passes of its own and applies the changes that wait before it.
@Suite("A nested run makes passes of its own and applies the changes that wait before it")
struct NestedRunBudgetTests {
  /// A schedule routine (the 6th of a held burst of 1,000 adds) runs one pass nested in the
  /// default mode and one in another mode: each applies exactly its own budget (256) of the
  /// changes that wait, none twice; the outer pass then goes on, and a block sent after the burst
  /// sees all 1,000 scheduled. A removal burst afterwards cancels each exactly once.
  @Test func aScheduleRoutineRunningTheLoopNestedAppliesItsOwnBudgetOnce() throws {
    let budget = LoopChangeQueue.perPass
    let outcome = try withWatchdogSync(timeout: .seconds(20), "nested schedule") {
      () -> (deltas: [Int], atBlock: Int, miscounted: [String]) in
      let loop = try RunLoopThread(name: "nested-schedule")
      defer { loop.shutdownAndWait() }
      let scheduled = AtomicCounter()
      let deltas = Guarded<[Int]>([])
      let sources = (0..<1_000).map { index in
        RoutineCountingSource(index: index) { index, loop in
          scheduled.increment()
          guard index == 5 else { return }
          for mode in [RunLoopMode.default, "other"] {
            let before = scheduled.current
            _ = loop.run(mode: mode, until: .now)
            let after = scheduled.current
            deltas.withLock { $0.append(after - before) }
          }
        }
      }
      let atBlock = Guarded(-1)
      burstBehindHeldLoop(sources.map(\.source), on: loop) {
        loop.perform { atBlock.withLock { $0 = scheduled.current } }
      }
      try loop.performAndWait {}
      for counted in sources { loop.remove(counted.source) }
      try loop.performAndWait {}
      let found = miscounted(sources, schedules: 1, cancels: 1)
      for counted in sources { counted.source.invalidate() }
      return (deltas.snapshot, atBlock.snapshot, found)
    }
    #expect(outcome?.deltas == [budget, budget])
    #expect(outcome?.atBlock == 1_000)
    #expect(outcome?.miscounted == [])
  }

  /// A job sent after a held burst of 1,000 adds (an actor pinned to the loop, called from
  /// another thread) runs in a run nested in a schedule routine of the burst (such runs run jobs),
  /// but only once every add of the burst is applied: the nested passes apply 256 each meanwhile.
  @Test func aJobAfterABurstRunsInANestedRunOnlyOnceTheBurstIsApplied() throws {
    let outcome = try withWatchdogSync(timeout: .seconds(20), "nested job") {
      () -> (jobSaw: Int, perRun: [Int], miscounted: [String]) in
      let loop = try RunLoopThread(name: "nested-job")
      defer { loop.shutdownAndWait() }
      let actor = ModeCountReadingActor(loop: loop)
      let scheduled = AtomicCounter()
      let jobSaw = Guarded(-1)
      let jobSent = TestGate()
      let perRun = Guarded<[Int]>([])
      let sources = (0..<1_000).map { index in
        RoutineCountingSource(index: index) { index, loop in
          scheduled.increment()
          guard index == 5 else { return }
          _ = jobSent.wait(timeout: .seconds(10))
          for _ in 0..<5 {
            let before = scheduled.current
            _ = loop.run(mode: .default, until: .now)
            let applied = scheduled.current - before
            perRun.withLock { $0.append(applied) }
          }
        }
      }
      let release = blockLoop(loop)
      for counted in sources { loop.add(counted.source) }
      Task {
        await actor.record(scheduled, into: jobSaw)
      }
      waitUntil(timeout: .seconds(10), "the job") { loop.shared.inboxLock.withLock { !loop.shared.inbox.jobs.isEmpty } }
      jobSent.open()
      release.open()
      try loop.performAndWait {}
      waitUntil(timeout: .seconds(10), "the job to run") { jobSaw.snapshot >= 0 }
      for counted in sources { counted.source.invalidate() }
      try loop.performAndWait {}
      return (jobSaw.snapshot, perRun.snapshot, miscounted(sources, schedules: 1, cancels: 1))
    }
    #expect(outcome?.jobSaw == 1_000)
    #expect(outcome?.perRun == [256, 256, 256, 226, 0])
    #expect(outcome?.miscounted == [])
  }

  /// An observer callout (beforeTimers, armed once a held burst of 1,000 adds was sent) runs one
  /// pass nested in another mode: it applies exactly 256 of the waiting changes; the observer is
  /// not told inside its own callout; everything is applied exactly once.
  @Test func anObserverRunningTheLoopNestedWhileABurstWaitsAppliesABudget() throws {
    let budget = LoopChangeQueue.perPass
    let outcome = try withWatchdogSync(timeout: .seconds(20), "nested observer") {
      () -> (deltas: [Int], atBlock: Int, miscounted: [String]) in
      let loop = try RunLoopThread(name: "nested-observer")
      defer { loop.shutdownAndWait() }
      let scheduled = AtomicCounter()
      let sources = (0..<1_000).map { index in RoutineCountingSource(index: index) { _, _ in scheduled.increment() } }
      let armed = Guarded(false)
      let deltas = Guarded<[Int]>([])
      let observer = LoopObserver(activities: .beforeTimers) { _, _ in
        guard
          armed.withLock({ value in
            defer { value = false }; return value
          })
        else { return }
        let before = scheduled.current
        _ = loop.run(mode: "other", until: .now)
        let after = scheduled.current
        deltas.withLock { $0.append(after - before) }
      }
      loop.add(observer)
      let atBlock = Guarded(-1)
      burstBehindHeldLoop(sources.map(\.source), on: loop) {
        loop.perform { atBlock.withLock { $0 = scheduled.current } }
        armed.withLock { $0 = true }
      }
      try loop.performAndWait {}
      observer.invalidate()
      for counted in sources { counted.source.invalidate() }
      try loop.performAndWait {}
      return (deltas.snapshot, atBlock.snapshot, miscounted(sources, schedules: 1, cancels: 1))
    }
    #expect(outcome?.deltas == [budget])
    #expect(outcome?.atBlock == 1_000)
    #expect(outcome?.miscounted == [])
  }

  /// A due timer added first in a held burst of 1,000 adds fires in the pass that applied it; its
  /// callout runs one pass nested: exactly 256 more are applied there; a block sent after the
  /// burst runs neither in that nested run nor before the last add.
  @Test func aTimerCalloutRunningTheLoopNestedWhileABurstWaitsAppliesABudget() throws {
    let budget = LoopChangeQueue.perPass
    let outcome = try withWatchdogSync(timeout: .seconds(20), "nested timer") {
      () -> (deltas: [Int], atBlock: [Int], miscounted: [String]) in
      let loop = try RunLoopThread(name: "nested-timer")
      defer { loop.shutdownAndWait() }
      let scheduled = AtomicCounter()
      let sources = (0..<1_000).map { index in RoutineCountingSource(index: index) { _, _ in scheduled.increment() } }
      let deltas = Guarded<[Int]>([])
      let timer = LoopTimer(after: .zero) { _ in
        let before = scheduled.current
        _ = loop.run(mode: .default, until: .now)
        let after = scheduled.current
        deltas.withLock { $0.append(after - before) }
      }
      let atBlock = Guarded<[Int]>([])
      burstBehindHeldLoop(sources.map(\.source), on: loop) {
        loop.add(timer)
      } then: {
        loop.perform { atBlock.withLock { $0.append(scheduled.current) } }
      }
      try loop.performAndWait {}
      timer.invalidate()
      for counted in sources { counted.source.invalidate() }
      try loop.performAndWait {}
      return (deltas.snapshot, atBlock.snapshot, miscounted(sources, schedules: 1, cancels: 1))
    }
    #expect(outcome?.deltas == [budget])
    #expect(outcome?.atBlock == [1_000])
    #expect(outcome?.miscounted == [])
  }

  /// A block sent while a burst of 1,000 adds waits runs the loop nested three passes (in a
  /// second block sent before the burst): each nested pass applies its own 256, and the block
  /// sent after the burst runs only in the last of them, once every add is applied, exactly once.
  @Test func aBlockAfterABurstRunsInANestedRunOnlyOnceTheBurstIsApplied() throws {
    let outcome = try withWatchdogSync(timeout: .seconds(20), "nested block") {
      () -> (perRun: [Int], blockRanAt: [Int], miscounted: [String]) in
      let loop = try RunLoopThread(name: "nested-block")
      defer { loop.shutdownAndWait() }
      let scheduled = AtomicCounter()
      let sources = (0..<1_000).map { index in RoutineCountingSource(index: index) { _, _ in scheduled.increment() } }
      let perRun = Guarded<[Int]>([])
      let blockRanAt = Guarded<[Int]>([])
      let started = TestGate()
      let sent = TestGate()
      loop.perform {
        started.open()
        _ = sent.wait(timeout: .seconds(20))
        for _ in 0..<5 {
          let before = scheduled.current
          _ = loop.run(mode: .default, until: .now)
          let applied = scheduled.current - before
          perRun.withLock { $0.append(applied) }
        }
      }
      _ = started.wait(timeout: .seconds(20))
      for counted in sources { loop.add(counted.source) }
      loop.perform { blockRanAt.withLock { $0.append(scheduled.current) } }
      sent.open()
      try loop.performAndWait {}
      for counted in sources { counted.source.invalidate() }
      try loop.performAndWait {}
      return (perRun.snapshot, blockRanAt.snapshot, miscounted(sources, schedules: 1, cancels: 1))
    }
    #expect(outcome?.perRun == [256, 256, 256, 232, 0])
    #expect(outcome?.blockRanAt == [1_000])
    #expect(outcome?.miscounted == [])
  }

  /// A schedule routine (the 6th of a held burst of 1,000 adds) runs an empty mode without a time
  /// limit: the nested run does not finish (nor sleep) while changes wait, applies the rest of the
  /// burst and then finishes, with every add applied exactly once.
  @Test func aNestedRunOfAnEmptyModeFinishesOnlyOnceTheBurstIsApplied() throws {
    let outcome = try withWatchdogSync(timeout: .seconds(20), "nested empty mode") {
      () -> (result: [String], atReturn: [Int], miscounted: [String]) in
      let loop = try RunLoopThread(name: "nested-empty")
      defer { loop.shutdownAndWait() }
      let scheduled = AtomicCounter()
      let result = Guarded<[String]>([])
      let atReturn = Guarded<[Int]>([])
      let sources = (0..<1_000).map { index in
        RoutineCountingSource(index: index) { index, loop in
          scheduled.increment()
          guard index == 5 else { return }
          let ended = loop.run(mode: "empty")
          result.withLock { $0.append("\(ended)") }
          atReturn.withLock { $0.append(scheduled.current) }
        }
      }
      burstBehindHeldLoop(sources.map(\.source), on: loop) {}
      try loop.performAndWait {}
      for counted in sources { counted.source.invalidate() }
      try loop.performAndWait {}
      return (result.snapshot, atReturn.snapshot, miscounted(sources, schedules: 1, cancels: 1))
    }
    #expect(outcome?.result == ["\(RunLoopRunResult.finished)"])
    #expect(outcome?.atReturn == [1_000])
    #expect(outcome?.miscounted == [])
  }

  /// A /dev/null source added from another thread behind 300 adds is refused by epoll; its
  /// `[.error]` handler runs the loop nested one pass while 700 more adds wait and, meanwhile,
  /// another thread sends further adds and removals of that same source: the handler is told
  /// once, the source ends invalid, and every add of the burst is applied exactly once.
  @Test func anErrorHandlerRunningTheLoopNestedWhileItsSourceIsChanged() throws {
    let outcome = try withWatchdogSync(timeout: .seconds(20), "error handler nested") { () -> [String] in
      let loop = try RunLoopThread(name: "error-nested")
      defer { loop.shutdownAndWait() }
      let devNull = open("/dev/null", O_RDONLY | O_CLOEXEC)
      defer { close(devNull) }
      let told = Guarded<[String]>([])
      let inHandler = TestGate()
      let changed = TestGate()
      let source = DescriptorSource(descriptor: devNull) { _, got in
        told.withLock { $0.append("\(got)") }
        inHandler.open()
        _ = changed.wait(timeout: .seconds(10))
        _ = loop.run(mode: .default, until: .now)
      }
      let sources = (0..<1_000).map { _ in RoutineCountingSource() }
      let release = blockLoop(loop)
      for counted in sources[..<300] { loop.add(counted.source) }
      var found: [String] = []
      do throws(SystemCallError) { try loop.add(source) } catch { found.append("add threw \(error)") }
      for counted in sources[300...] { loop.add(counted.source) }
      release.open()
      _ = inHandler.wait(timeout: .seconds(10))
      loop.remove(source)
      try? loop.add(source, to: "error-other")
      loop.remove(source, from: "error-other")
      try? loop.add(source)
      changed.open()
      try loop.performAndWait {}
      try loop.performAndWait {}
      if told.snapshot != ["[error]"] { found.append("told \(told.snapshot)") }
      if source.isValid { found.append("still valid") }
      let modes = try loop.performAndWait { loop.core.modeCount(of: source) }
      if modes != 0 { found.append("in \(modes) modes") }
      for counted in sources { counted.source.invalidate() }
      try loop.performAndWait {}
      found += miscounted(sources, schedules: 1, cancels: 1)
      return found
    }
    #expect(outcome == [])
  }
}
