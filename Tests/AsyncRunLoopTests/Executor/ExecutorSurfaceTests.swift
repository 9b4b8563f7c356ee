import Dispatch
import Glibc
import Testing

@_spi(Testing) @testable import AsyncRunLoop

@Suite("The executor's public surface keeps its documented promises", .serialized, .timeLimit(.minutes(10)))
struct ExecutorSurfaceTests {
  /// Promised: an actor pinned to a loop runs on the loop's thread, isolated to it; the loop
  /// answers false (never nil) off its thread; a task that prefers the loop runs there, also after
  /// a `Task.sleep`; `performAndWait` from the actor on its own loop runs inline.
  @Test func actorsAndPreferringTasksRunOnTheLoopIsolated() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "isolation") {
      () async throws -> (actor: (Bool?, Bool), off: Bool?, task: [Bool], inline: Bool) in
      let loop = try RunLoopThread(name: "iso")
      let actor = PinnedSurfaceActor(loop: loop)
      let place = await actor.whereAmI()
      let inline = try await actor.performInline()
      let task = await Task(executorPreference: loop) { () -> [Bool] in
        var seen = [loop.isOnLoopThread]
        try? await Task.sleep(for: .milliseconds(5))
        seen.append(loop.isOnLoopThread)
        await Task.yield()
        seen.append(loop.isIsolatingCurrentContext() == true)
        return seen
      }.value
      let off = await execOnNewThread { loop.isIsolatingCurrentContext() }
      await execShutdown(loop)
      return (place, off, task, inline)
    }
    guard let outcome else { return }
    #expect(outcome.actor.0 == true)
    #expect(outcome.actor.1)
    #expect(outcome.off == false)
    #expect(outcome.task == [true, true, true])
    #expect(outcome.inline)
  }

  /// Promised: `performAndWait` refuses a wait that closes a cycle: an actor on loop A waits for
  /// a block on loop B that waits for loop A; the inner call throws `wouldDeadlock` instead of
  /// hanging both loops.
  @Test func performAndWaitInACycleThroughAnActorThrowsInsteadOfHanging() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "cycle") { () async throws -> String in
      let loopA = try RunLoopThread(name: "cyc-a")
      let loopB = try RunLoopThread(name: "cyc-b")
      let actor = PinnedSurfaceActor(loop: loopA)
      let answer = await actor.waitInACycle(through: loopB)
      await execShutdown(loopA)
      await execShutdown(loopB)
      return answer
    }
    #expect(outcome == "wouldDeadlock")
  }

  /// Promised: after the loop terminated, an actor's calls still run, one at a time, on the
  /// fallback queue, isolated to the loop (`isIsolatingCurrentContext()` true there, and the
  /// loop's thread is not used); a task that prefers the terminated loop runs too.
  @Test func jobsAfterTerminationRunIsolatedOneAtATime() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "fallback") {
      () async throws -> (place: (Bool?, Bool), most: Int, calls: Int, task: Bool?) in
      let loop = try RunLoopThread(name: "fb")
      let actor = PinnedSurfaceActor(loop: loop)
      _ = await actor.whereAmI()
      await execShutdown(loop)
      let place = await actor.whereAmI()
      await withTaskGroup(of: Void.self) { group in
        for _ in 0..<8 {
          group.addTask {
            for _ in 0..<10 { await actor.slowCall() }
          }
        }
      }
      let calls = await actor.calls
      let task = await Task(executorPreference: loop) { loop.isIsolatingCurrentContext() }.value
      return (place, actor.overlap.most.withLock { $0 }, calls, task)
    }
    guard let outcome else { return }
    #expect(outcome.place.0 == true, "on the fallback the actor's call is not isolated to its loop")
    #expect(!outcome.place.1)
    #expect(outcome.most == 1, "\(outcome.most) calls of the actor overlapped")
    #expect(outcome.calls == 80)
    #expect(outcome.task == true)
  }

  /// Promised: at shutdown a `loop.clock` sleep throws `CancellationError`, and a `Task.sleep`
  /// under the loop's preference is not ended early: it completes at its deadline, elsewhere.
  /// Neither hangs.
  @Test func shutdownWithPendingSleepsResumesEverySleeper() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "sleeps at shutdown") {
      () async throws -> (clock: String, taskSleep: String, elapsed: Duration) in
      let loop = try RunLoopThread(name: "sleep")
      let clockSleep = Task { () -> String in
        do {
          try await loop.clock.sleep(until: .now.advanced(by: .seconds(60)))
          return "returned"
        } catch is CancellationError {
          return "cancelled"
        } catch {
          return "\(error)"
        }
      }
      let start = ContinuousClock.now
      let taskSleep = Task(executorPreference: loop) { () -> (String, Duration) in
        do {
          try await Task.sleep(for: .milliseconds(300))
          return ("returned", ContinuousClock.now - start)
        } catch {
          return ("\(error)", ContinuousClock.now - start)
        }
      }
      _ = await pollEveryMillisecond { loop.scheduledJobCount >= 1 }
      try await Task.sleep(for: .milliseconds(20))  // the clock sleep's timer reaches the loop
      await execShutdown(loop)
      let clock = await clockSleep.value
      let (slept, elapsed) = await taskSleep.value
      return (clock, slept, elapsed)
    }
    guard let outcome else { return }
    #expect(outcome.clock == "cancelled")
    #expect(outcome.taskSleep == "returned")
    #expect(outcome.elapsed >= .milliseconds(300), "Task.sleep ended early, after \(outcome.elapsed)")
  }

  /// Promised: `runModal` from an actor on the loop suspends the actor instead of blocking its
  /// executor, so the actor's other calls run during the modal run: one of them signals a source
  /// of the modal mode, which ends the run (`.handledSource`), well before its 10 s limit.
  @Test func anActorsOtherCallsRunDuringItsModalRun() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "modal from actor") {
      () async throws -> RunLoopRunResult in
      let loop = try RunLoopThread(name: "modal")
      let entered = TestGate()
      loop.add(LoopObserver(activities: .entry) { _, _ in entered.open() }, to: surfaceModeA)
      let source = InputSource(perform: { _ in })
      loop.add(source, to: surfaceModeA)
      let actor = PinnedSurfaceActor(loop: loop)
      async let result = actor.modalUntilSignalled()
      _ = await pollEveryMillisecond { entered.opened }
      await actor.ping(source)
      let value = try await result
      source.invalidate()
      await execShutdown(loop)
      return value
    }
    #expect(outcome == .handledSource)
  }

  /// Documented (`runModal`): modal runs from two tasks nest, and the outer one's cancellation
  /// takes effect when the inner one has returned, which is not cut short. Task A is in a modal
  /// run in mode A; task B's modal run in mode B (1 s) starts inside it; A is cancelled. B's run
  /// ends at its limit (`.timedOut`), then A's (`.stopped`), in that order. (Review round 14 took
  /// A waiting for B as a bug; it is how runs on one thread nest.)
  @Test func aCancelledModalRunEndsOnceTheModalRunNestedInItReturns() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "nested modal cancel") {
      () async throws -> (first: RunLoopRunResult, second: RunLoopRunResult, order: [String]) in
      let loop = try RunLoopThread(name: "modal2")
      let enteredA = TestGate()
      let enteredB = TestGate()
      // The runs' exits, in the order the loop thread makes them.
      let order = EventLog()
      loop.add(
        LoopObserver(activities: [.entry, .exit]) { _, activity in
          if activity == .entry { enteredA.open() } else { order.add("first") }
        }, to: surfaceModeA)
      loop.add(
        LoopObserver(activities: [.entry, .exit]) { _, activity in
          if activity == .entry { enteredB.open() } else { order.add("second") }
        }, to: surfaceModeB)
      let keepA = LoopTimer(after: .seconds(3600)) { _ in }
      let keepB = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepA, to: surfaceModeA)
      loop.add(keepB, to: surfaceModeB)
      let first = Task { () -> RunLoopRunResult in
        (try? await loop.runModal(mode: surfaceModeA, for: .seconds(20))) ?? .finished
      }
      _ = await pollEveryMillisecond { enteredA.opened }
      let second = Task { () -> RunLoopRunResult in
        (try? await loop.runModal(mode: surfaceModeB, for: .seconds(1))) ?? .finished
      }
      _ = await pollEveryMillisecond { enteredB.opened }
      first.cancel()
      let firstResult = await first.value
      let secondResult = await second.value
      keepA.invalidate()
      keepB.invalidate()
      await execShutdown(loop)
      return (firstResult, secondResult, order.snapshot)
    }
    guard let outcome else { return }
    #expect(outcome.first == .stopped)
    #expect(outcome.second == .timedOut, "the nested run was cut short: \(outcome.second)")
    #expect(outcome.order == ["second", "first"], "\(outcome.order)")
  }

  /// Promised: `runModal` on a loop that has shut down throws `RunLoopError.shutDown`.
  @Test func runModalAfterShutdownThrows() async throws {
    let loop = try RunLoopThread(name: "modal3")
    await execShutdown(loop)
    await #expect(throws: RunLoopError.self) { try await loop.runModal(mode: surfaceModeA, for: .seconds(1)) }
  }

  /// Promised: `LoopGroup.next()` hands the loops out round-robin in creation order, and
  /// `shutdownAndWait()` shuts every one down.
  @Test func loopGroupHandsLoopsOutRoundRobinAndShutsThemAllDown() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "group") {
      () throws -> (names: [String], down: [Bool]) in
      let group = try LoopGroup(count: 3, name: "g")
      let names = (0..<7).map { _ in group.next().name }
      group.shutdownAndWait()
      return (names, group.loops.map(\.isShutDown))
    }
    guard let outcome else { return }
    #expect(outcome.names == ["g-0", "g-1", "g-2", "g-0", "g-1", "g-2", "g-0"])
    #expect(outcome.down == [true, true, true])
  }
}

extension ExecutorSurfaceTests {
  /// Promised: a `runModal` whose block the loop accepted is never stranded by the shutdown: the
  /// block (queued behind a busy loop when `shutdown()` comes) runs in the drain, or the call is
  /// refused; either way the caller resumes (a run in the drain ends at once: the loop is
  /// shutting down).
  @Test func aModalRunQueuedWhenTheLoopShutsDownStillResumesItsCaller() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "modal at shutdown") { () async throws -> String in
      let loop = try RunLoopThread(name: "modal4")
      loop.add(LoopTimer(after: .seconds(3600)) { _ in }, to: surfaceModeA)
      let release = await execOnNewThread { blockLoop(loop) }
      let modal = Task { () -> String in
        do {
          return "\(try await loop.runModal(mode: surfaceModeA, for: .seconds(20)))"
        } catch {
          return "\(error)"
        }
      }
      // The modal run's block waits in the inbox behind the blocked loop.
      try await Task.sleep(for: .milliseconds(50))
      loop.shutdown()
      release.open()
      let answer = await modal.value
      await execShutdown(loop)
      return answer
    }
    guard let outcome else { return }
    #expect(outcome != "", "\(outcome)")
  }
}

extension ExecutorSurfaceTests {
  /// Promised: jobs are interleaved with the loop's sources and timers (a bounded number per
  /// pass): a task on the loop that yields in a tight loop does not starve a performed block, a
  /// timer, or a signal sequence's consumer (another task on the loop).
  @Test func aYieldingTaskOnTheLoopDoesNotStarveSourcesTimersOrBlocks() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "busy loop") {
      () async throws -> (block: Bool, timer: Bool, signal: Int, spins: Int) in
      let loop = try RunLoopThread(name: "busy")
      let stop = TestGate()
      let spins = AtomicCounter()
      let spinner = Task(executorPreference: loop) {
        while !stop.opened {
          spins.increment()
          await Task.yield()
        }
      }
      _ = await pollEveryMillisecond { spins.current > 100 }
      let block = await execOnNewThread { (try? loop.performAndWait { true }) ?? false }
      let fired = TestGate()
      loop.add(LoopTimer(after: .milliseconds(1)) { _ in fired.open() }, to: .common)
      let timer = await pollEveryMillisecond(timeout: .seconds(5)) { fired.opened }
      let signals = loop.signalSequence()
      let consumer = Task(executorPreference: loop) { () -> Int in
        for await count in signals { return count }
        return 0
      }
      signals.signal()
      let signal = await consumer.value
      stop.open()
      await spinner.value
      await execShutdown(loop)
      return (block, timer, signal, spins.current)
    }
    guard let outcome else { return }
    #expect(outcome.block)
    #expect(outcome.timer)
    #expect(outcome.signal == 1)
  }
}

extension ExecutorSurfaceTests {
  /// Promised: each run has its own state: a modal run asked to return after a source fired
  /// (`returnAfterSourceHandled`) does not return `.handledSource` because a source fired in
  /// another task's modal run that the loop nested inside it; it runs to its own limit
  /// (`.timedOut`).
  @Test func aSourceHandledInANestedModalRunDoesNotEndTheOuterOne() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "nested handled source") {
      () async throws -> (outer: String, inner: String) in
      let loop = try RunLoopThread(name: "modal5")
      let enteredA = TestGate()
      loop.add(LoopObserver(activities: .entry) { _, _ in enteredA.open() }, to: surfaceModeA)
      let keepA = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepA, to: surfaceModeA)
      let sourceB = InputSource(perform: { _ in })
      loop.add(sourceB, to: surfaceModeB)
      let outer = Task { () -> String in
        do {
          return
            "\(try await loop.runModal(mode: surfaceModeA, for: .milliseconds(600), returnAfterSourceHandled: true))"
        } catch { return "\(error)" }
      }
      _ = await pollEveryMillisecond { enteredA.opened }
      sourceB.signal()
      let inner = Task { () -> String in
        do {
          return
            "\(try await loop.runModal(mode: surfaceModeB, for: .milliseconds(100), returnAfterSourceHandled: true))"
        } catch { return "\(error)" }
      }
      let innerResult = await inner.value
      let outerResult = await outer.value
      keepA.invalidate()
      sourceB.invalidate()
      await execShutdown(loop)
      return (outerResult, innerResult)
    }
    guard let outcome else { return }
    #expect(outcome.inner == "\(RunLoopRunResult.handledSource)")
    #expect(outcome.outer == "\(RunLoopRunResult.timedOut)")
  }
}

extension ExecutorSurfaceTests {
  /// Promised: jobs run in every mode ("so actors on the loop keep working during a nested modal
  /// run"), and a `Task.sleep` under the loop's preference is one of its jobs, scheduled on its
  /// timers. So a 10 ms `Task.sleep` of a task that prefers the loop, made while another task
  /// holds the loop in a 3 s modal run of a mode outside the common set, completes long before
  /// that run ends (other jobs of the loop do run meanwhile). It does not: the sleep's timer is
  /// added to `.common` only, so the sleeper waits for the whole modal run (for an unlimited
  /// modal run, forever). An actor's sleep on the same loop (the runtime does not schedule it on
  /// the loop's timers) completes on time. (A `loop.clock` sleep is documented to use the common
  /// modes.) Fails every run.
  @Test
  func taskSleepsOnTheLoopCompleteDuringAModalRunOfAnotherMode() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "sleep during modal") {
      () async throws -> (task: Duration, actor: Duration, modalEnded: Bool, yielded: Bool) in
      let loop = try RunLoopThread(name: "modal6")
      let enteredA = TestGate()
      loop.add(LoopObserver(activities: .entry) { _, _ in enteredA.open() }, to: surfaceModeA)
      let keepA = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepA, to: surfaceModeA)
      let modalEnded = TestGate()
      let modal = Task {
        _ = try? await loop.runModal(mode: surfaceModeA, for: .seconds(3))
        modalEnded.open()
      }
      _ = await pollEveryMillisecond { enteredA.opened }
      let yielded = await Task(executorPreference: loop) { () -> Bool in
        await Task.yield()  // a job of the loop runs during the modal run
        return loop.isOnLoopThread
      }.value
      let actor = PinnedSurfaceActor(loop: loop)
      async let actorSlept = actor.sleep(for: .milliseconds(10))
      let taskSlept = await Task(executorPreference: loop) { () -> Duration in
        let start = ContinuousClock.now
        try? await Task.sleep(for: .milliseconds(10))
        return ContinuousClock.now - start
      }.value
      let actorDuration = await actorSlept
      let endedFirst = modalEnded.opened
      await modal.value
      keepA.invalidate()
      await execShutdown(loop)
      return (taskSlept, actorDuration, endedFirst, yielded)
    }
    guard let outcome else { return }
    #expect(outcome.yielded, "no job ran during the modal run")
    #expect(!outcome.modalEnded, "the sleeps ended only after the modal run")
    #expect(outcome.task < .seconds(2), "a 10 ms Task.sleep took \(outcome.task)")
    #expect(outcome.actor < .seconds(2), "an actor's 10 ms Task.sleep took \(outcome.actor)")
  }
}

extension ExecutorSurfaceTests {
  /// Promised: `shutdown()` ends every run of the loop at every nesting level: two tasks' modal
  /// runs (the second nested in the first) both return `.stopped` at the shutdown, long before
  /// their 20 s limits.
  @Test func shutdownEndsNestedModalRunsOfTwoTasks() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "shutdown ends modal runs") {
      () async throws -> [String] in
      let loop = try RunLoopThread(name: "modal7")
      let enteredA = TestGate()
      let enteredB = TestGate()
      loop.add(LoopObserver(activities: .entry) { _, _ in enteredA.open() }, to: surfaceModeA)
      loop.add(LoopObserver(activities: .entry) { _, _ in enteredB.open() }, to: surfaceModeB)
      loop.add(LoopTimer(after: .seconds(3600)) { _ in }, to: surfaceModeA)
      loop.add(LoopTimer(after: .seconds(3600)) { _ in }, to: surfaceModeB)
      let first = Task { () -> String in
        do { return "\(try await loop.runModal(mode: surfaceModeA, for: .seconds(20)))" } catch { return "\(error)" }
      }
      _ = await pollEveryMillisecond { enteredA.opened }
      let second = Task { () -> String in
        do { return "\(try await loop.runModal(mode: surfaceModeB, for: .seconds(20)))" } catch { return "\(error)" }
      }
      _ = await pollEveryMillisecond { enteredB.opened }
      await execShutdown(loop)
      return [await first.value, await second.value]
    }
    guard let outcome else { return }
    #expect(outcome == ["\(RunLoopRunResult.stopped)", "\(RunLoopRunResult.stopped)"])
  }
}

// MARK: - Executor

@Suite("The executor under races", .serialized, .timeLimit(.minutes(10)))
struct ExecutorRaceTests {
  /// Promised: no hung awaits. Calls to an actor pinned to a loop, made by one task in order and
  /// racing the loop's shutdown, each complete once, in order.
  @Test func actorCallsRacingShutdownCompleteOnceInOrder() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "actor calls racing shutdown") {
      () async throws -> (entries: [Int], offLoop: Int) in
      let loop = try RunLoopThread(name: "actor")
      let actor = CallLoggingActor(loop: loop)
      let offLoop = AtomicCounter()
      let caller = Task {
        // (1,000 calls, not 3,000: each is two hops through the shared cooperative pool, and
        // with other tests holding it the 3,000 once outlasted the watchdog.)
        for value in 0..<1000 where await !actor.append(value) { offLoop.increment() }
      }
      try await Task.sleep(for: .milliseconds(2))
      await execShutdown(loop)
      await caller.value
      return (await actor.entries, offLoop.current)
    }
    guard let outcome else { return }
    #expect(outcome.entries == Array(0..<1000))
    #expect(outcome.offLoop == 0)
  }

  /// Promised: `Task.sleep` in an actor pinned to a loop that shuts down meanwhile still completes
  /// (at its deadline, elsewhere): nobody hangs, nothing throws.
  @Test func actorSleepAcrossShutdownCompletes() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "actor sleep across shutdown") {
      () async throws -> [Int] in
      let loop = try RunLoopThread(name: "actor-sleep")
      let actor = CallLoggingActor(loop: loop)
      let sleepers = (0..<4).map { value in Task { try await actor.sleepThenAppend(value) } }
      try await Task.sleep(for: .milliseconds(5))
      await execShutdown(loop)
      for sleeper in sleepers { try await sleeper.value }
      return await actor.entries.sorted()
    }
    #expect(outcome == [0, 1, 2, 3])
  }

  /// Promised: a sleep on a loop's `clock` ends with `CancellationError` when the loop shuts down;
  /// `Task.sleep` under the loop's task-executor preference completes.
  @Test func loopClockSleepThrowsAtShutdownAndPreferredSleepCompletes() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "sleeps across shutdown") {
      () async throws -> (Bool, Bool) in
      let loop = try RunLoopThread(name: "clock")
      let clockSleep = Task { () -> Bool in
        do {
          try await loop.clock.sleep(for: .seconds(3600))
          return false
        } catch { return error is CancellationError }
      }
      let preferred = Task(executorPreference: loop) { () -> Bool in
        do {
          try await Task.sleep(for: .milliseconds(30))
          return true
        } catch { return false }
      }
      try await Task.sleep(for: .milliseconds(5))
      await execShutdown(loop)
      return (await clockSleep.value, await preferred.value)
    }
    #expect(outcome?.0 == true)
    #expect(outcome?.1 == true)
  }

  /// Promised: jobs run in every mode, so an actor on the loop keeps answering while the loop is
  /// in a modal run (`runModal`) of a mode the actor knows nothing about; cancelling the modal
  /// task ends that run with `.stopped`.
  @Test func actorAnswersDuringAModalRunOfAnotherMode() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "actor during modal run") {
      () async throws -> (RunLoopRunResult?, Int) in
      let loop = try RunLoopThread(name: "modal")
      let hold = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(hold, to: endRaceModeA)
      let inModal = AtomicCounter()
      let observer = LoopObserver(activities: [.entry], repeats: true) { _, _ in inModal.increment() }
      loop.add(observer, to: endRaceModeA)
      let actor = CallLoggingActor(loop: loop)
      let modal = Task { try? await loop.runModal(mode: endRaceModeA) }
      #expect(await pollEveryMillisecond { inModal.current == 1 })
      for value in 0..<50 { _ = await actor.append(value) }
      modal.cancel()
      let result = await modal.value
      let count = await actor.entries.count
      await execShutdown(loop)
      return (result, count)
    }
    #expect(outcome?.0 == .stopped)
    #expect(outcome?.1 == 50)
  }

  /// SPEC §10: a run nested in one of the loop's own jobs runs no jobs; a job enqueued meanwhile
  /// runs after the outer job returns.
  @Test func jobsEnqueuedDuringANestedRunInAJobRunAfterIt() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "nested run in a job") {
      () async throws -> [String] in
      let loop = try RunLoopThread(name: "nested")
      let log = EventLog()
      let actor = NestingLoopActor(loop: loop, log: log)
      await actor.nest()
      await execShutdown(loop)
      return log.snapshot
    }
    #expect(outcome == ["outer-start", "outer-end", "inner"])
  }

  /// Off the loop `isIsolatingCurrentContext()` is false and on it true; `assumeIsolated` of an
  /// actor pinned to the loop holds in a source handler there.
  @Test func assumeIsolatedHoldsInAHandlerOnTheLoop() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "assumeIsolated in a handler") {
      () async throws -> (Bool?, Int) in
      let loop = try RunLoopThread(name: "iso")
      let actor = CallLoggingActor(loop: loop)
      let handled = AtomicCounter()
      let commands = CommandSource<Int> { value in
        actor.assumeIsolated { isolated in
          _ = isolated.append(value)
        }
        handled.increment()
      }
      loop.add(commands.source, to: .common)
      for value in 0..<10 { commands.post(value) }
      #expect(await pollEveryMillisecond { handled.current == 10 })
      let offLoop = loop.isIsolatingCurrentContext()
      let entries = await actor.entries
      await execShutdown(loop)
      return (offLoop, entries.count)
    }
    #expect(outcome?.0 == false)
    #expect(outcome?.1 == 10)
  }

  /// `LoopGroup.next()` hands out every loop round-robin; after `shutdownAndWait()` actors on its
  /// loops still answer (fallback), exactly once per call.
  @Test func loopGroupRoundRobinAndActorsAfterShutdown() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "loop group") { () async throws -> (Bool, Int) in
      let group = try LoopGroup(count: 3, name: "group")
      let picked = (0..<6).map { _ in ObjectIdentifier(group.next()) }
      let expected = (group.loops + group.loops).map { ObjectIdentifier($0) }
      let actors = group.loops.map { CallLoggingActor(loop: $0) }
      await execOnNewThread { group.shutdownAndWait() }
      for actor in actors { _ = await actor.append(1) }
      var total = 0
      for actor in actors { total += await actor.entries.count }
      return (picked == expected, total)
    }
    #expect(outcome?.0 == true)
    #expect(outcome?.1 == 3)
  }
}
