import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("Blocks and changes wait behind the change barrier", .serialized, .timeLimit(.minutes(10)))
struct ChangeBarrierTests {
  /// Three threads each add 1,500 sources to a blocked loop (some 4,500 changes: several chunks,
  /// many bounded passes of 256) and, every 200 adds, perform a block that checks that every add
  /// its thread sent before it was applied (its schedule routine ran). Promised: a block runs only
  /// once every change sent before it was applied.
  @Test func blocksAfterManyChangesSeeThemAllAppliedAcrossChunksAndPasses() async throws {
    let loop = try RunLoopThread(name: "barrier")
    let outcome = await execOnNewThread { () -> (ran: Int, wrong: [String], scheduled: [Int]) in
      let scheduled = (0..<3).map { _ in AtomicCounter() }
      let wrong = Locked<[String]>([])
      let ran = AtomicCounter()
      let sources = Locked<[InputSource]>([])
      let release = blockLoop(loop)
      race(
        (0..<3).map { thread in
          {
            var own: [InputSource] = []
            for index in 0..<1_500 {
              let source = InputSource(schedule: { _, _, _ in scheduled[thread].increment() }) { _ in }
              own.append(source)
              loop.add(source, to: index % 2 == 0 ? .default : barrierModeA)
              if index % 200 == 199 {
                let expected = index + 1
                let modes: [RunLoopMode] = index % 400 == 199 ? [.default] : [.common]
                loop.perform(inModes: modes) {
                  ran.increment()
                  let seen = scheduled[thread].current
                  if seen < expected { wrong.withLock { $0.append("thread \(thread): \(seen) of \(expected)") } }
                }
              }
            }
            sources.withLock { $0 += own }
          }
        })
      release.open()
      _ = try? loop.performAndWait {}
      let result = (ran.current, wrong.withLock { $0 }, scheduled.map(\.current))
      loop.shutdownAndWait()
      return result
    }
    #expect(outcome.wrong == [], "a block ran before a change sent before it was applied")
    #expect(outcome.ran == 21)
    #expect(outcome.scheduled == [1_500, 1_500, 1_500])
  }

  /// Jobs too: a task that prefers the loop, started after 1,000 adds from the same thread into a
  /// blocked loop, runs after they are applied.
  @Test func aJobAfterManyChangesSeesThemApplied() async throws {
    let loop = try RunLoopThread(name: "barrier-job")
    let scheduled = AtomicCounter()
    let sources = Locked<[InputSource]>([])
    let release = await execOnNewThread { () -> TestGate in
      let release = blockLoop(loop)
      for _ in 0..<1_000 {
        let source = InputSource(schedule: { _, _, _ in scheduled.increment() }) { _ in }
        sources.withLock { $0.append(source) }
        loop.add(source)
      }
      return release
    }
    let task = Task(executorPreference: loop) { scheduled.current }
    release.open()
    let seen = await task.value
    #expect(seen == 1_000, "the job ran before the adds sent before it were applied")
    await execShutdown(loop)
  }

  /// Three threads perform 3,000 blocks each (in `.default`, in `barrierModeA` or in `.common`, in
  /// turn) while the loop runs nested: some blocks run the loop in `barrierModeA` or `.default`, a timer
  /// runs it in `barrierModeA`, a source's handler runs it in `.default`. Every block runs exactly once,
  /// in one of its modes, and each thread's blocks for the same modes run in the order performed.
  @Test func burstsOfBlocksWhileTheLoopRunsNestedRunEachOnceInOrderInTheirModes() async throws {
    let loop = try RunLoopThread(name: "burst")
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "bursts of blocks") {
      () -> (counts: [Int], wrongMode: Int, outOfOrder: Int, nested: Int) in
      let modeStack = Locked<[RunLoopMode]>([.default])
      let runs = Locked<[[Int]]>(Array(repeating: [], count: 9))  // per thread and mode kind
      let wrongMode = AtomicCounter()
      let nested = AtomicCounter()
      let perThread = 3_000
      @Sendable func runNested(_ mode: RunLoopMode) {
        modeStack.withLock { $0.append(mode) }
        let keep = LoopTimer(after: .seconds(3600)) { _ in }
        loop.add(keep, to: mode)
        _ = loop.run(mode: mode, until: .now.advanced(by: .microseconds(300)))
        keep.invalidate()
        modeStack.withLock { _ = $0.popLast() }
        nested.increment()
      }
      let ticker = LoopTimer(after: .milliseconds(1), repeatingEvery: .milliseconds(1)) { _ in runNested(barrierModeA) }
      loop.add(ticker)
      let kick = Locked<InputSource?>(nil)
      let source = InputSource { _ in runNested(.default) }
      kick.withLock { $0 = source }
      loop.add(source)
      _ = try? loop.performAndWait {}
      let kinds: [[RunLoopMode]] = [[.default], [barrierModeA], [.common]]
      race(
        (0..<3).map { thread in
          {
            for index in 0..<perThread {
              let kind = index % 3
              loop.perform(inModes: kinds[kind]) {
                let mode = modeStack.withLock { $0.last! }
                let allowed = kind == 0 ? mode == .default : kind == 1 ? mode == barrierModeA : mode == .default
                if !allowed { wrongMode.increment() }
                runs.withLock { $0[thread * 3 + kind].append(index) }
                if index % 250 == 0 { runNested(index % 500 == 0 ? barrierModeA : .default) }
              }
              if index % 400 == 0 { source.signal() }
            }
          }
        })
      // barrierModeA blocks run only in nested runs in barrierModeA: keep them coming until every block ran.
      let deadline = ContinuousClock.now.advanced(by: .seconds(10))
      while runs.withLock({ $0.map(\.count).reduce(0, +) }) < 3 * perThread && ContinuousClock.now < deadline {
        usleep(2_000)
      }
      ticker.invalidate()
      source.invalidate()
      _ = try? loop.performAndWait {}
      let all = runs.withLock { $0 }
      var outOfOrder = 0
      for list in all where list != list.sorted() || Set(list).count != list.count { outOfOrder += 1 }
      let result = (all.map(\.count), wrongMode.current, outOfOrder, nested.current)
      loop.shutdownAndWait()
      return result
    }
    guard let outcome else { return }
    #expect(outcome.counts == Array(repeating: 1_000, count: 9), "blocks ran \(outcome.counts) times")
    #expect(outcome.wrongMode == 0, "blocks ran outside their modes")
    #expect(outcome.outOfOrder == 0, "lists out of order")
    print("bursts of blocks: \(outcome.nested) nested runs")
  }

  /// `performAndWait` from a thread returns only after the blocks that thread performed before it
  /// (for the same mode) ran, and after the changes it sent before it were applied, also when
  /// they are more than a chunk and a pass.
  @Test func performAndWaitComesAfterTheThreadsOwnBlocksAndChanges() async throws {
    let loop = try RunLoopThread(name: "paw")
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "performAndWait order") {
      () -> [String] in
      var wrong: [String] = []
      let sources = Locked<[InputSource]>([])
      for round in 0..<20 {
        let ran = AtomicCounter()
        let scheduled = AtomicCounter()
        let count = 300 + round * 97
        for index in 0..<count {
          loop.perform { ran.increment() }
          if index % 2 == 0 {
            let source = InputSource(schedule: { _, _, _ in scheduled.increment() }) { _ in }
            sources.withLock { $0.append(source) }
            loop.add(source)
          }
        }
        let seen = try? loop.performAndWait { (ran.current, scheduled.current) }
        if seen?.0 != count || seen?.1 != (count + 1) / 2 {
          wrong.append("round \(round): \(String(describing: seen)) of \(count)")
        }
      }
      loop.shutdownAndWait()
      return wrong
    }
    #expect(outcome == [])
  }

  /// Shutdown while thousands of blocks and changes wait in a blocked loop (three threads keep
  /// performing through the shutdown). Every block that `perform` accepted runs exactly once,
  /// none after `shutdownAndWait` returns, refused ones never; every added source is cancelled
  /// once; nothing hangs.
  @Test func shutdownWhileThousandsOfBlocksAndChangesWaitRunsEachAcceptedBlockOnce() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "shutdown with waiting work") {
      () throws -> [String] in
      var wrong: [String] = []
      for round in 0..<4 {
        let loop = try RunLoopThread(name: "sd")
        let accepted = AtomicCounter()
        let ran = Locked<[Int: Int]>([:])
        let refused = Locked<Set<Int>>([])
        let schedules = AtomicCounter()
        let cancels = AtomicCounter()
        let returned = Locked(false)
        let lateRuns = AtomicCounter()
        let release = blockLoop(loop)
        let sources = Locked<[InputSource]>([])
        race(
          (0..<3).map { thread in
            {
              for index in 0..<2_500 {
                let id = thread * 10_000 + index
                let modes: [RunLoopMode] = index % 2 == 0 ? [.default] : [barrierModeB]  // barrierModeB never runs
                let took = loop.perform(inModes: modes) {
                  if returned.withLock({ $0 }) { lateRuns.increment() }
                  ran.withLock { $0[id, default: 0] += 1 }
                }
                if took { accepted.increment() } else { refused.withLock { _ = $0.insert(id) } }
                if index % 3 == 0 {
                  let source = InputSource(
                    schedule: { _, _, _ in schedules.increment() }, cancel: { _, _ in cancels.increment() }
                  ) { _ in }
                  sources.withLock { $0.append(source) }
                  loop.add(source)
                }
                if thread == 0 && index == 1_200 + round * 300 {
                  loop.shutdown()
                  release.open()
                }
              }
            }
          })
        loop.shutdownAndWait()
        returned.withLock { $0 = true }
        usleep(5_000)
        let runs = ran.withLock { $0 }
        let twice = runs.values.filter { $0 != 1 }.count
        let refusedRan = refused.withLock { $0 }.filter { runs[$0] != nil }.count
        if runs.count != accepted.current || twice != 0 || refusedRan != 0 || lateRuns.current != 0 {
          wrong.append(
            "round \(round): accepted \(accepted.current), ran \(runs.count), twice \(twice), refused ran "
              + "\(refusedRan), late \(lateRuns.current)")
        }
        if schedules.current != cancels.current {
          wrong.append("round \(round): \(schedules.current) schedules, \(cancels.current) cancels")
        }
      }
      return wrong
    }
    #expect(outcome == [])
  }
}
