import Dispatch
import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("Deep nesting and current loops", .serialized, .timeLimit(.minutes(10)))
struct DeepNestingTests {
  /// SPEC §10: inside one of the loop's jobs no other job starts, also in a run nested in a
  /// source handler, block, timer or observer of the job's own nested run.
  @Test(arguments: [DeepNestCallout.source, .block, .timer, .observer])
  func noJobRunsInARunNestedInACalloutOfAJobsNestedRun(kind: DeepNestCallout) async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "deep nest \(kind)") { () async throws -> [String] in
      let loop = try RunLoopThread(name: "deep")
      let log = EventLog()
      let actor = NestingLoopActor(loop: loop, log: log)
      await actor.deepNest(kind)
      #expect(await pollEveryMillisecond { log.count("inner") == 1 })
      await execShutdown(loop)
      return log.snapshot
    }
    #expect(outcome == ["outer-start", "callout-start", "callout-end", "outer-end", "inner"])
  }

  /// A `RunLoopThread.current` loop of a plain thread serves an actor while the thread runs it;
  /// the thread then stops running it and exits (no `shutdown()`): every call completes once, in
  /// order, on the loop thread or (after the exit) on the fallback.
  @Test func actorOnACurrentLoopSurvivesItsThreadExiting() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "current loop thread exit") {
      () async throws -> (entries: [Int], offLoop: Int, shutDown: Bool) in
      let published = Guarded<RunLoopThread?>(nil)
      let stop = AtomicCounter()
      let thread = startThread {
        let loop = RunLoopThread.current
        published.withLock { $0 = loop }
        while stop.current == 0 { _ = loop.run(mode: .default, for: .milliseconds(2)) }
      }
      #expect(await pollEveryMillisecond { published.snapshot != nil })
      guard let loop = published.snapshot else { return ([], 0, false) }
      let actor = CallLoggingActor(loop: loop)
      let offLoop = AtomicCounter()
      let caller = Task {
        for value in 0..<2000 {
          if value == 500 { stop.increment() }
          if await !actor.append(value) { offLoop.increment() }
        }
      }
      await execOnNewThread { joinThread(thread) }
      await caller.value
      return (await actor.entries, offLoop.current, loop.isShutDown)
    }
    guard let outcome else { return }
    #expect(outcome.entries == Array(0..<2000))
    #expect(outcome.offLoop == 0)
    #expect(outcome.shutDown)
  }

  /// `LoopClock()` used by a task on a loop that shuts down under the sleep: the sleep goes on
  /// elsewhere and ends without an error (documented).
  @Test func defaultClockSleepOnALoopThatShutsDownCompletes() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "LoopClock() across shutdown") {
      () async throws -> Bool in
      let loop = try RunLoopThread(name: "default-clock")
      let started = AtomicCounter()
      let sleeper = Task(executorPreference: loop) { () -> Bool in
        started.increment()
        do {
          try await LoopClock().sleep(for: .milliseconds(40))
          return true
        } catch { return false }
      }
      #expect(await pollEveryMillisecond { started.current == 1 })
      await execShutdown(loop)
      return await sleeper.value
    }
    #expect(outcome == true)
  }

  /// `runOnMainAndWait` from a plain thread while the main loop is not running throws
  /// `wouldDeadlock` instead of hanging.
  @Test func runOnMainAndWaitOffMainThrowsWhenTheMainLoopIsNotRunning() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(10), "runOnMainAndWait") { () -> Bool in
      guard !RunLoopThread.isMainLoopRunning else { return true }
      do {
        _ = try runOnMainAndWait { 1 }
        return false
      } catch let error as RunLoopError {
        if case .wouldDeadlock = error { return true }
        return false
      } catch { return false }
    }
    #expect(outcome == true)
  }
}
