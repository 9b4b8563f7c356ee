import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("Cross-thread changes are values applied in order", .serialized, .timeLimit(.minutes(10)))
struct CrossThreadChangesAsValuesTests {
  /// Four threads add, remove, invalidate and reschedule their own members while the loop's own
  /// timer runs the loop nested in another mode from its callout; after each batch of a thread's
  /// calls, a `performAndWait` from that thread sees exactly the modes its calls left. At the
  /// end every source's schedules and cancels pair up and every member is released.
  @Test func aThreadsChangesAreAllAppliedBeforeItsPerformAndWait() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "ordered changes") {
      () throws -> (problems: [String], released: Bool) in
      let loop = try RunLoopThread(name: "order")
      defer { loop.shutdownAndWait() }
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: payloadModeC)
      let churner = LoopTimer(after: .milliseconds(1), repeatingEvery: .milliseconds(1)) { _ in
        _ = RunLoopThread.current.run(mode: payloadModeC, for: .milliseconds(1))
      }
      loop.add(churner, to: .default)
      loop.add(churner, to: payloadModeA)
      let problems = Locked<[String]>([])
      let weakMembers = Locked<[() -> Bool]>([])  // true while the member is alive
      let modes: [RunLoopMode] = [payloadModeA, payloadModeB, .default]
      let threads = (0..<4).map { thread in
        startThread {
          var random = SeededRandom(state: UInt64(thread + 1) &* 0x9E37_79B9)
          var sources = (0..<5).map { _ in ScheduleCountingSource() }
          var timers = (0..<4).map { _ in makeParkedTimer { _ in } }
          var sourceModes = [Set<RunLoopMode>](repeating: [], count: 5)
          var timerModes = [Set<RunLoopMode>](repeating: [], count: 4)
          var retired: [ScheduleCountingSource] = []
          func watch(_ object: AnyObject) {
            weak let weakObject = object
            let probe: () -> Bool = { weakObject != nil }
            weakMembers.withLock { $0.append(probe) }
          }
          for source in sources { watch(source.source) }
          for timer in timers { watch(timer) }
          _ = repeatRounds(150, budget: .milliseconds(800)) { round in
            for _ in 0..<20 {
              let mode = modes[random.next(3)]
              if random.next(2) == 0 {
                let index = random.next(5)
                switch random.next(7) {
                case 0, 1, 2:
                  loop.add(sources[index].source, to: mode)
                  sourceModes[index].insert(mode)
                case 3, 4, 5:
                  loop.remove(sources[index].source, from: mode)
                  sourceModes[index].remove(mode)
                default:
                  sources[index].source.invalidate()
                  retired.append(sources[index])
                  sources[index] = ScheduleCountingSource()
                  watch(sources[index].source)
                  sourceModes[index] = []
                }
              } else {
                let index = random.next(4)
                switch random.next(8) {
                case 0, 1, 2:
                  loop.add(timers[index], to: mode)
                  timerModes[index].insert(mode)
                case 3, 4:
                  loop.remove(timers[index], from: mode)
                  timerModes[index].remove(mode)
                case 5, 6:
                  timers[index].setFireDate(random.next(2) == 0 ? .now : .now.advanced(by: .seconds(3600)))
                default:
                  timers[index].invalidate()
                  timers[index] = makeParkedTimer { _ in }
                  watch(timers[index])
                  timerModes[index] = []
                }
              }
            }
            let expectedSources = sourceModes
            let expectedTimers = timerModes
            let currentSources = sources.map(\.source)
            let currentTimers = timers
            let seen = try? loop.performAndWait { () -> [String] in
              var wrong: [String] = []
              for (index, source) in currentSources.enumerated()
              where Set(loop.core.modes(of: source)) != expectedSources[index] {
                wrong.append("thread \(thread) round \(round) source \(index): \(loop.core.modes(of: source))")
              }
              for (index, timer) in currentTimers.enumerated()
              where Set(loop.core.modes(of: timer)) != expectedTimers[index] {
                wrong.append("thread \(thread) round \(round) timer \(index): \(loop.core.modes(of: timer))")
              }
              return wrong
            }
            problems.withLock { $0 += seen ?? ["thread \(thread): performAndWait refused"] }
          }
          for source in sources { source.source.invalidate() }
          for timer in timers { timer.invalidate() }
          _ = try? loop.performAndWait {}
          for source in sources + retired {
            let unpaired = source.unpaired()
            if !unpaired.isEmpty { problems.withLock { $0.append("thread \(thread) source: \(unpaired)") } }
          }
        }
      }
      for thread in threads { joinThread(thread) }
      let records = try loop.performAndWait { loop.core.modeTable.allRecords.count }
      if records != 2 { problems.withLock { $0.append("records left: \(records) (2 expected)") } }
      churner.invalidate()
      keep.invalidate()
      try loop.performAndWait {}
      let alive = weakMembers.withLock { $0.filter { $0() }.count }
      return (problems.withLock { $0 }, alive == 0)
    }
    #expect(outcome?.problems == [])
    #expect(outcome?.released == true, "removed or invalidated members are still held")
  }

  /// Stale adds: sources move A→B→A between two loops as fast as the calls go, some invalidated
  /// right after the last add. Each loop schedules and cancels each source in pairs; in the end
  /// the valid ones are in loop one's mode A only, and loop two holds nothing.
  @Test func sourcesMovedBetweenLoopsQuicklyPairTheirRoutinesOnEachLoop() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "stale adds") { () throws -> [String] in
      let one = try RunLoopThread(name: "one")
      let two = try RunLoopThread(name: "two")
      defer {
        one.shutdownAndWait()
        two.shutdownAndWait()
      }
      let problems = Locked<[String]>([])
      let kept = Locked<[ScheduleCountingSource]>([])
      let threads = (0..<3).map { thread in
        startThread {
          var random = SeededRandom(state: UInt64(thread + 11))
          var all: [ScheduleCountingSource] = []
          var valid: [ScheduleCountingSource] = []
          _ = repeatRounds(300, budget: .milliseconds(600)) { _ in
            let source = ScheduleCountingSource()
            all.append(source)
            one.add(source.source, to: payloadModeA)
            one.remove(source.source, from: payloadModeA)
            two.add(source.source, to: payloadModeB)
            two.remove(source.source, from: payloadModeB)
            one.add(source.source, to: payloadModeA)
            if random.next(3) == 0 {
              source.source.invalidate()
            } else {
              valid.append(source)
            }
          }
          _ = try? one.performAndWait {}
          _ = try? two.performAndWait {}
          for source in all {
            let isValid = source.source.isValid
            let unpaired = source.unpaired(open: isValid ? ["one"] : [])
            if !unpaired.isEmpty { problems.withLock { $0.append("thread \(thread): \(unpaired)") } }
          }
          kept.withLock { $0 += valid }
        }
      }
      for thread in threads { joinThread(thread) }
      let valid = kept.withLock { $0 }
      let onOne = try one.performAndWait { () -> (records: Int, wrong: Int) in
        (one.core.modeTable.allRecords.count, valid.filter { one.core.modes(of: $0.source) != [payloadModeA] }.count)
      }
      let onTwo = try two.performAndWait { two.core.modeTable.allRecords.count }
      var result = problems.withLock { $0 }
      if onOne.records != valid.count { result.append("loop one holds \(onOne.records), \(valid.count) valid") }
      if onOne.wrong != 0 { result.append("\(onOne.wrong) valid sources not in A only") }
      if onTwo != 0 { result.append("loop two holds \(onTwo)") }
      for source in valid { source.source.invalidate() }
      try one.performAndWait {}
      for source in valid where !source.unpaired().isEmpty { result.append("after invalidation: \(source.unpaired())") }
      return result
    }
    #expect(outcome == [])
  }

  /// Shutdown races threads that add, remove, invalidate and reschedule members of every kind
  /// (a descriptor source too): no crash, no hang, every schedule gets exactly one cancel, and
  /// once the threads let go of them every member is released.
  @Test func shutdownRacingChangesLosesNoCancelAndLeaksNothing() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "shutdown race") {
      () throws -> (problems: [String], alive: Int) in
      var problems: [String] = []
      var alive = 0
      for round in 0..<6 {
        let loop = try RunLoopThread(name: "race")
        let counted = Locked<[ScheduleCountingSource]>([])
        let probes = Locked<[() -> Bool]>([])
        let done = Locked(false)
        let pipe = makePipe()
        let churner = LoopTimer(after: .milliseconds(1), repeatingEvery: .milliseconds(1)) { _ in
          _ = RunLoopThread.current.run(mode: payloadModeC, for: .milliseconds(1))
        }
        loop.add(churner, to: .default)
        loop.add(churner, to: payloadModeC)
        let workers = (0..<3).map { thread in
          startThread {
            var random = SeededRandom(state: UInt64(round * 7 + thread + 1))
            var step = 0
            // Until a while after the shutdown (and at least 100 steps, at most 5,000).
            while step < 5_000 && (step < 100 || !done.withLock({ $0 })) {
              step += 1
              let mode: RunLoopMode = [payloadModeA, .default, .common][random.next(3)]
              switch random.next(4) {
              case 0:
                let source = ScheduleCountingSource()
                counted.withLock { $0.append(source) }
                loop.add(source.source, to: mode)
                if random.next(2) == 0 { loop.remove(source.source, from: mode) }
                if random.next(2) == 0 { source.source.invalidate() }
              case 1:
                let timer = LoopTimer(after: .microseconds(random.next(500)), repeatingEvery: .milliseconds(1)) { _ in }
                weak let weakTimer = timer
                probes.withLock { $0.append { weakTimer != nil } }
                loop.add(timer, to: mode)
                loop.add(timer, to: payloadModeC)
                timer.setFireDate(.now)
                if random.next(2) == 0 { loop.remove(timer, from: mode) }
                if random.next(2) == 0 { timer.invalidate() }
              case 2:
                let observer = LoopObserver(activities: .all) { _, _ in }
                weak let weakObserver = observer
                probes.withLock { $0.append { weakObserver != nil } }
                loop.add(observer, to: mode)
                if random.next(2) == 0 { observer.invalidate() }
              default:
                let source = DescriptorSource(descriptor: pipe.read) { _, _ in }
                weak let weakSource = source
                probes.withLock { $0.append { weakSource != nil } }
                try? loop.add(source, to: mode)
                if random.next(2) == 0 { source.invalidate() }
              }
              if step % 50 == 49 { sched_yield() }
            }
          }
        }
        usleep(UInt32(1_000 + round * 1_000))
        loop.shutdown()
        usleep(2_000)
        done.withLock { $0 = true }
        for worker in workers { joinThread(worker) }
        loop.shutdownAndWait()
        close(pipe.read)
        close(pipe.write)
        for source in counted.withLock({ $0 }) {
          // Shut down: no loop holds any source any more (one removed from its last mode before
          // the shutdown stays valid, on no loop).
          let unpaired = source.unpaired()
          if !unpaired.isEmpty { problems.append("round \(round): \(unpaired)") }
          if source.source.isValid && source.source.boundLoop != nil {
            problems.append("round \(round): a source is still on the shut-down loop")
          }
        }
        churner.invalidate()
        alive += probes.withLock { $0.filter { $0() }.count }
      }
      return (problems, alive)
    }
    #expect(outcome?.problems == [])
    #expect(outcome?.alive == 0, "members still held after the loop shut down")
  }
}
