import Dispatch
import Glibc
import Testing

@testable import AsyncRunLoop

extension ModalRunsAndWaitsFromLoopActorsTests {
  /// A job on the loop (an actor method) runs the loop nested, synchronously, in the default mode
  /// (which runs no jobs, as documented); a task on the global executor then asks the loop for a
  /// modal run in mode B, and calls an actor on the loop. Documented (`runModal`): a modal run
  /// that starts inside one of the loop's jobs is nested in it and, like any run there, runs no
  /// jobs until the job returns: the modal run runs (its timer fires) to its 2 s limit, the calls
  /// wait, and they are served once the job has returned. (Review round 14 expected the calls
  /// served during the modal run: no second job may start while one is on the stack.)
  @Test
  func aModalRunThatStartsInsideARunNestedInAJobRunsNoJobsUntilTheJobReturns() async throws {
    let loop = try RunLoopThread(name: "m2")
    defer { loop.shutdownAndWait() }
    let holder = CallCountingActor(loop: loop)
    let callee = CallCountingActor(loop: loop)
    let started = TestGate()
    let releaseHolder = TestGate()
    let callsDone = TestGate()
    let outcome = try await withWatchdog(timeout: .seconds(30), "modal run inside a nested run") {
      () async throws -> (servedDuringModal: Bool, result: RunLoopRunResult, modalTicks: Int, servedAfter: Bool) in
      let holding = Task { await holder.holdInNestedRun(mode: .default, started: started, release: releaseHolder) }
      _ = await execOnNewThread { started.wait(timeout: .seconds(10)) }
      let modalTicks = AtomicCounter()
      let modal = Task.detached { () async throws -> RunLoopRunResult in
        let watcher = LoopTimer(after: .zero, repeatingEvery: .milliseconds(1)) { _ in
          modalTicks.increment()
          if callsDone.opened { RunLoopThread.current.stop() }
        }
        loop.add(watcher, to: loopThreadModeB)
        defer { watcher.invalidate() }
        return try await loop.runModal(mode: loopThreadModeB, for: .seconds(2))
      }
      _ = await execOnNewThread { usleep(50_000) }  // the modal run starts (inside the nested run)
      let calls = Task.detached { () async -> Void in
        for _ in 0..<10 { _ = await callee.call() }
        callsDone.open()
      }
      let served = await execOnNewThread { callsDone.wait(timeout: .seconds(1)) }
      let result = try await modal.value
      releaseHolder.open()
      await holding.value
      let servedAfter = await execOnNewThread { callsDone.wait(timeout: .seconds(10 * watchdogScale)) }
      await calls.value
      return (served, result, modalTicks.current, servedAfter)
    }
    guard let outcome else { return }
    #expect(!outcome.servedDuringModal, "a job ran inside the holder's job")
    #expect(outcome.result == .timedOut)
    #expect(outcome.modalTicks > 0, "the modal run did not run")
    #expect(outcome.servedAfter, "the calls were not served after the holder's job returned")
  }
}

extension ModalRunsAndWaitsFromLoopActorsTests {
  /// An actor on a loop is in a modal run (`runModal`) when another thread shuts the loop down,
  /// while other tasks keep calling the actor. Promised: the modal run ends (its caller resumes,
  /// on the loop's executor, in the drain or on the fallback), every call returns once, isolated,
  /// and nothing hangs.
  @Test func aModalRunFromAnActorEndsAtShutdownAndEveryCallReturns() async throws {
    for round in 0..<3 {
      let loop = try RunLoopThread(name: "m3")
      let actor = CallCountingActor(loop: loop)
      let never = TestGate()
      let outcome = try await withWatchdog(timeout: .seconds(30), "modal run vs shutdown, round \(round)") {
        () async -> (modal: String, returned: Int, misisolated: Int) in
        let modal = Task { () async -> String in
          do { return "\(try await actor.modal(mode: loopThreadModeA, until: never).result)" } catch {
            return "\(error)"
          }
        }
        _ = await actor.call()
        startThread(detached: true) {
          usleep(UInt32(2_000 + 3_000 * round))
          loop.shutdown()
        }
        let returned = await withTaskGroup(of: Int.self) { group in
          for _ in 0..<2 {
            group.addTask {
              var count = 0
              for _ in 0..<400 {
                _ = await actor.call()
                count += 1
              }
              return count
            }
          }
          return await group.reduce(0, +)
        }
        return (await modal.value, returned, await actor.misisolated)
      }
      loop.shutdownAndWait()
      guard let outcome else { return }
      #expect(outcome.returned == 800, "round \(round)")
      #expect(outcome.misisolated == 0, "round \(round)")
      #expect(
        ["stopped", "timedOut"].contains(outcome.modal) || outcome.modal.contains("has shut down"),
        "round \(round): \(outcome.modal)")
    }
  }
}

@Suite("Modal runs and waits from actors on the loop", .serialized, .timeLimit(.minutes(10)))
struct ModalRunsAndWaitsFromLoopActorsTests {
  /// An actor on a loop runs the loop modally (`runModal`) from one of its methods, and other
  /// tasks call the actor 2,000 times meanwhile (more than a chunk of jobs). Promised: "the loop
  /// keeps running executor jobs during it, the caller's actor's other work included": the calls
  /// are served during the modal run (which ends when they are done), each once, isolated; a
  /// `performAndWait` from the actor on its own loop runs inline.
  @Test func aModalRunFromAnActorOnTheLoopServesTheActorsOtherCalls() async throws {
    let loop = try RunLoopThread(name: "m1")
    defer { loop.shutdownAndWait() }
    let actor = CallCountingActor(loop: loop)
    let callsDone = TestGate()
    let outcome = try await withWatchdog(timeout: .seconds(30), "modal run with calls") {
      () async throws -> (served: Int, result: RunLoopRunResult, returned: Int, nested: Int, misisolated: Int) in
      async let modal = actor.modal(mode: loopThreadModeA, until: callsDone)
      // Let the modal run start (its first calls are served inside it either way).
      _ = await actor.call()
      let returned = await withTaskGroup(of: Int.self) { group in
        for _ in 0..<4 {
          group.addTask {
            var count = 0
            for _ in 0..<500 {
              _ = await actor.call()
              count += 1
            }
            return count
          }
        }
        return await group.reduce(0, +)
      }
      let nested = try await actor.nestedPerformAndWait()
      callsDone.open()
      let (served, result) = try await modal
      return (served, result, returned, nested, await actor.misisolated)
    }
    guard let outcome else { return }
    #expect(outcome.returned == 2_000)
    #expect(outcome.served >= 2_000)
    #expect(outcome.result == .stopped)
    #expect(outcome.nested == 7)
    #expect(outcome.misisolated == 0)
  }
}

@Suite("Modal runs asked for by actors on the loop", .serialized, .timeLimit(.minutes(10)))
struct ModalRunsAskedForByLoopActorsTests {
  /// Promised (`runModal`): an actor on the loop asking its own loop for a modal run is not
  /// blocked: its other calls run during the run, and one of them can stop it.
  @Test func anActorsOwnModalRunLetsItsOtherCallsRun() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "actor's own modal run") {
      () async throws -> (RunLoopRunResult?, Int, Int) in
      let loop = try RunLoopThread(name: "own-modal")
      let hold = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(hold, to: endRaceModeA)
      let entries = AtomicCounter()
      let observer = LoopObserver(activities: [.entry], repeats: true) { _, _ in entries.increment() }
      loop.add(observer, to: endRaceModeA)
      let actor = OwnLoopModalActor(loop: loop)
      let modal = Task { await actor.modal() }
      #expect(await pollEveryMillisecond { entries.current == 1 })
      for _ in 0..<10 { await actor.poke(stopping: false) }
      await actor.poke(stopping: true)
      let result = await modal.value
      let pokes = await actor.pokes
      await execShutdown(loop)
      return (result, pokes, entries.current)
    }
    #expect(outcome?.0 == .stopped)
    #expect(outcome?.1 == 11)
    #expect(outcome?.2 == 1)
  }

  /// SPEC §6: a modal run asked to return after one source returns `.handledSource` when a
  /// source sequence in its mode releases a post; a timer firing in it does not end it.
  @Test func modalRunReturnsAfterASourceSequenceFiresButNotAfterATimer() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "modal handled source") {
      () async throws -> (RunLoopRunResult?, Int, [Int]) in
      let loop = try RunLoopThread(name: "modal-src")
      let fired = AtomicCounter()
      let timer = LoopTimer(after: .milliseconds(1), repeatingEvery: .milliseconds(1)) { _ in fired.increment() }
      loop.add(timer, to: endRaceModeA)
      let sequence = loop.sourceSequence(of: Int.self, modes: [endRaceModeA])
      let actor = OwnLoopModalActor(loop: loop)
      let modal = Task { await actor.modal(returnAfterSourceHandled: true) }
      #expect(await pollEveryMillisecond { fired.current >= 3 })
      _ = sequence.post(5)
      let result = await modal.value
      timer.invalidate()
      sequence.invalidate()
      var seen: [Int] = []
      for await value in sequence { seen.append(value) }
      await execShutdown(loop)
      return (result, fired.current, seen)
    }
    #expect(outcome?.0 == .handledSource)
    #expect(outcome?.2 == [5])
  }

  /// Order of one thread's `runOnMain` calls relative to its `DispatchQueue.main.async` blocks,
  /// and an `await runOnMain` after them sees all of them (the main queue drains in the test
  /// process).
  @Test func runOnMainKeepsOneThreadsOrderWithMainQueueBlocks() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "runOnMain order") { () async throws -> [Int] in
      let log = Guarded<[Int]>([])
      await execOnNewThread {
        for value in 0..<200 {
          if value % 2 == 0 {
            runOnMain { log.withLock { $0.append(value) } }
          } else {
            DispatchQueue.main.async { log.withLock { $0.append(value) } }
          }
        }
      }
      let seen = await runOnMain { log.snapshot }
      return seen
    }
    #expect(outcome == Array(0..<200))
  }
}
