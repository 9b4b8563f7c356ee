import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

// Review round 7: a shut-down `RunLoopThread.current` loop handing its jobs to the fallback
// (commit e66260e), the exact order of one pass, common modes, descriptor sources, and waits
// across loops. Gates and polls only, never timing assertions.

/// A thread of the test's own that binds a `RunLoopThread.current` loop and then runs the
/// closures the test sends it, one at a time, until told to exit (its loop then drains).
final class R7Thread: Sendable {
  private let commands = Guarded<[@Sendable (RunLoopThread) -> Void]>([])
  private let quitting = Guarded(false)
  private let published = Guarded<RunLoopThread?>(nil)
  /// Opens when the thread's body returned (the loop's exit drain follows on that thread).
  let bodyEnded = TestGate()

  init() {
    ExecThread { [commands, quitting, published, bodyEnded] in
      let loop = RunLoopThread.current
      published.withLock { $0 = loop }
      while true {
        let next = commands.withLock { $0.isEmpty ? nil : $0.removeFirst() }
        if let next {
          next(loop)
          continue
        }
        if quitting.withLock({ $0 }) { break }
        usleep(300)
      }
      bodyEnded.open()
    }.detach()
  }

  /// The thread's loop (polls off the cooperative pool).
  func loop() async -> RunLoopThread {
    await execOnNewThread { [published] in
      while published.withLock({ $0 }) == nil { usleep(300) }
      return published.withLock { $0! }
    }
  }

  /// Sends `body` to the thread without waiting for it.
  func send(_ body: @escaping @Sendable (RunLoopThread) -> Void) {
    commands.withLock { $0.append(body) }
  }

  /// Runs `body` on the thread and returns its result (awaited without blocking the pool).
  func exec<T: Sendable>(_ body: @escaping @Sendable (RunLoopThread) -> T) async -> T {
    await withCheckedContinuation { (continuation: CheckedContinuation<T, Never>) in
      send { loop in continuation.resume(returning: body(loop)) }
    }
  }

  /// Lets the thread exit (its loop drains on it as it ends).
  func quit() { quitting.withLock { $0 = true } }
}

/// An actor on a loop that records overlapping jobs and whether one is in progress.
actor R7Actor: LoopActor {
  nonisolated let loop: RunLoopThread
  nonisolated let overlap: Round3Overlap
  /// A job of this actor is running now (readable from anywhere).
  nonisolated let inJob = Guarded(false)
  private(set) var calls = 0

  init(loop: RunLoopThread, overlap: Round3Overlap = Round3Overlap()) {
    self.loop = loop
    self.overlap = overlap
  }

  /// One short job; returns whether it ran isolated to the loop.
  func call() -> Bool {
    overlap.enter()
    defer { overlap.leave() }
    calls += 1
    return loop.isIsolatingCurrentContext() == true
  }

  /// A job that stays on the stack until `release` opens; returns whether it ran on the loop's
  /// own thread.
  func hold(entered: TestGate, release: TestGate) -> Bool {
    overlap.enter()
    inJob.withLock { $0 = true }
    entered.open()
    _ = release.wait(timeout: .seconds(20))
    inJob.withLock { $0 = false }
    overlap.leave()
    calls += 1
    return loop.isOnLoopThread
  }

  /// Runs the loop nested inside this job (opens `entered` from inside the nested run).
  func nestedRun(_ mode: RunLoopMode, entered: TestGate) -> RunLoopRunResult {
    overlap.enter()
    defer { overlap.leave() }
    // Shut down before this job ran (the test's shutdown gave up waiting for the nested run),
    // this runs on the fallback, where `run` would trap: report that, and do not take the
    // whole test process down with it.
    guard loop.isOnLoopThread else {
      calls += 1
      return .finished
    }
    let marker = LoopTimer(after: .zero) { _ in entered.open() }
    loop.add(marker, to: mode)
    let result = loop.run(mode: mode, for: .seconds(20))
    marker.invalidate()
    calls += 1
    return result
  }

  /// A modal run of `mode` while this actor is suspended.
  func modal(_ mode: RunLoopMode) async throws(RunLoopError) -> RunLoopRunResult {
    // The limit only ends the run if the shutdown never comes (scaled: the 20 calls before it
    // took over 20 s under ThreadSanitizer in a full run).
    try await loop.runModal(mode: mode, for: .seconds(20) * watchdogScale)
  }
}

/// Which callout a run nested on a current loop's thread is made from.
enum R7NestingSite: String, CaseIterable, Sendable {
  case job, block, timer, observer
}

@Suite("ReviewRound7: current-loop fallback, one pass, common modes, descriptors, waits", .timeLimit(.minutes(10)))
struct ReviewRound7Tests {
  let modeM = RunLoopMode("r7-m")
  let modeNever = RunLoopMode("r7-never")

  // MARK: - 1. A shut-down current loop's jobs on the fallback

  /// Once a current loop's jobs run on the fallback, its thread must not also count as isolated
  /// to the loop while one of those jobs runs: the README promises `assumeIsolated` in performed
  /// blocks and callouts on the loop, so a block the thread runs at its exit drain (or an
  /// observer told in a run entered after the shutdown, or the thread's own code) would touch an
  /// actor's state while the actor's job runs on the fallback.
  @Test func theThreadAndTheFallbackNeverBothClaimIsolation() async throws {
    let thread = R7Thread()
    let loop = await thread.loop()
    let actor = R7Actor(loop: loop)
    let fromDrainBlock = Guarded<(isolated: Bool, jobRunning: Bool)?>(nil)
    let accepted = loop.perform(inModes: [modeNever]) {
      fromDrainBlock.withLock { $0 = (loop.isIsolatingCurrentContext() == true, actor.inJob.snapshot) }
    }
    #expect(accepted)
    loop.shutdown()
    let entered = TestGate()
    let release = TestGate()
    let holder = Task { await actor.hold(entered: entered, release: release) }
    #expect(await execOnNewThread { entered.wait(timeout: .seconds(20) * watchdogScale) })
    // The thread's own code, out of a run.
    let plain = await thread.exec { loop in (loop.isIsolatingCurrentContext() == true, actor.inJob.snapshot) }
    // An observer told in a run the thread enters after the shutdown.
    let observed = await thread.exec { loop -> (isolated: Bool, jobRunning: Bool, told: Int) in
      let seen = Guarded<(Bool, Bool, Int)>((false, false, 0))
      let observer = LoopObserver(activities: .all) { _, _ in
        seen.withLock {
          $0 = ($0.0 || loop.isIsolatingCurrentContext() == true, $0.1 || actor.inJob.snapshot, $0.2 + 1)
        }
      }
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(observer)
      loop.add(keepAlive)
      _ = loop.run(for: .seconds(5))
      observer.invalidate()
      keepAlive.invalidate()
      return seen.snapshot
    }
    thread.quit()
    _ = await execOnNewThread {
      waitUntil(timeout: .seconds(20), "the drain's block") { fromDrainBlock.snapshot != nil }
    }
    release.open()
    #expect(await holder.value == false, "the held job ran on the loop's thread")
    #expect(!(plain.0 && plain.1), "the thread's own code claims isolation while a fallback job runs")
    #expect(observed.told == 0 || !(observed.isolated && observed.jobRunning), "an observer callout claims isolation")
    let drain = fromDrainBlock.snapshot
    #expect(drain != nil)
    if let drain { #expect(!(drain.isolated && drain.jobRunning), "a drain block claims isolation") }
  }

  /// A run nested on the thread (in an actor's job, a performed block, a timer's or an
  /// observer's callout) while another thread shuts the loop down and tasks keep calling an actor
  /// on it: every call completes exactly once, never two of the loop's jobs at once, none waits
  /// for the thread to exit, and the nested run ends.
  @Test(arguments: R7NestingSite.allCases)
  func aShutdownDuringANestedRunLosesNoCallAndNeverOverlaps(site: R7NestingSite) async throws {
    let rounds = 20
    for round in 0..<rounds {
      let thread = R7Thread()
      let loop = await thread.loop()
      let overlap = Round3Overlap()
      let actor = R7Actor(loop: loop, overlap: overlap)
      let nestedEntered = TestGate()
      let nestedResult = Guarded<RunLoopRunResult?>(nil)
      let outerResult = Guarded<RunLoopRunResult?>(nil)
      let mode = modeM
      // The thread runs the loop until the shutdown; the nested run happens from `site`.
      thread.send { loop in
        let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
        loop.add(keepAlive)
        loop.add(keepAlive, to: mode)
        var members: [any Sendable] = []
        switch site {
        case .job:
          break
        case .block:
          loop.perform {
            let marker = LoopTimer(after: .zero) { _ in nestedEntered.open() }
            loop.add(marker, to: mode)
            nestedResult.withLock { $0 = loop.run(mode: mode, for: .seconds(20)) }
            marker.invalidate()
          }
        case .timer:
          let timer = LoopTimer(after: .zero) { _ in
            let marker = LoopTimer(after: .zero) { _ in nestedEntered.open() }
            loop.add(marker, to: mode)
            nestedResult.withLock { $0 = loop.run(mode: mode, for: .seconds(20)) }
            marker.invalidate()
          }
          loop.add(timer)
          members.append(timer)
        case .observer:
          let observer = LoopObserver(activities: .beforeWaiting, repeats: false) { _, _ in
            let marker = LoopTimer(after: .zero) { _ in nestedEntered.open() }
            loop.add(marker, to: mode)
            nestedResult.withLock { $0 = loop.run(mode: mode, for: .seconds(20)) }
            marker.invalidate()
          }
          loop.add(observer)
          members.append(observer)
        }
        outerResult.withLock { $0 = loop.run(for: .seconds(20) * watchdogScale) }
        keepAlive.invalidate()
        withExtendedLifetime(members) {}
      }
      let (tasks, calls) = (3, 30)
      let isolated = Locked(0)
      let outcome: Void? = try await withWatchdog(timeout: .seconds(20), "\(site) round \(round)") {
        await withTaskGroup(of: Void.self) { group in
          if site == .job {
            group.addTask {
              let result = await actor.nestedRun(mode, entered: nestedEntered)
              nestedResult.withLock { $0 = result }
            }
          }
          for _ in 0..<tasks {
            group.addTask {
              for _ in 0..<calls {
                if await actor.call() { isolated.withLock { $0 += 1 } }
              }
            }
          }
          group.addTask {
            await execOnNewThread {
              _ = nestedEntered.wait(timeout: .seconds(20) * watchdogScale)
              usleep(UInt32(100 * (round % 6)))
              loop.shutdown()
            }
          }
        }
      }
      #expect(outcome != nil)
      #expect(await actor.calls == tasks * calls + (site == .job ? 1 : 0))
      #expect(isolated.withLock { $0 } == tasks * calls)
      #expect(overlap.maximum == 1, "\(site) round \(round): two of the loop's jobs or callouts overlapped")
      #expect(nestedResult.snapshot == .stopped)
      _ = await execOnNewThread { waitUntil("the outer run to end") { outerResult.snapshot != nil } }
      #expect(outerResult.snapshot == .stopped)
      #expect(!thread.bodyEnded.opened)
      thread.quit()
    }
  }

  /// A modal run asked by an actor on the current loop, ended by a shutdown from another thread:
  /// it returns `.stopped`, the actor goes on (on the fallback), and calls made meanwhile and
  /// afterwards all complete, one at a time.
  @Test func aModalRunEndedByShutdownLetsTheActorGoOnOnTheFallback() async throws {
    let thread = R7Thread()
    let loop = await thread.loop()
    let overlap = Round3Overlap()
    let actor = R7Actor(loop: loop, overlap: overlap)
    let mode = modeM
    let inModal = TestGate()
    let outerResult = Guarded<RunLoopRunResult?>(nil)
    thread.send { loop in
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      let marker = LoopObserver(activities: .beforeWaiting) { _, _ in inModal.open() }
      loop.add(keepAlive)
      loop.add(keepAlive, to: mode)
      loop.add(marker, to: mode)
      // The limit only ends the run if the shutdown never comes: as long as the watchdog (under
      // a sanitizer and the whole suite, the modal run and 20 calls took over 20 s once).
      outerResult.withLock { $0 = loop.run(for: .seconds(20) * watchdogScale) }
      keepAlive.invalidate()
      marker.invalidate()
    }
    let outcome = try await withWatchdog(timeout: .seconds(20), "a modal run ended by shutdown") {
      () async throws -> (RunLoopRunResult, Int) in
      async let modal = actor.modal(mode)
      await execOnNewThread { _ = inModal.wait(timeout: .seconds(20)) }
      var during = 0
      for _ in 0..<20 {
        if await actor.call() { during += 1 }
      }
      loop.shutdown()
      let result = try await modal
      for _ in 0..<20 {
        if await actor.call() { during += 1 }
      }
      return (result, during)
    }
    #expect(outcome?.0 == .stopped)
    #expect(outcome?.1 == 40)
    #expect(overlap.maximum == 1)
    _ = await execOnNewThread { waitUntil("the outer run to end") { outerResult.snapshot != nil } }
    #expect(outerResult.snapshot == .stopped)
    #expect(!thread.bodyEnded.opened)
    thread.quit()
  }

  /// Jobs accepted while the thread was out of a run, then more while it runs again after the
  /// shutdown, then more after its thread exited: every job runs once, in the order enqueued
  /// from one task, never on the thread once it was shut down with the thread out of a run.
  @Test func jobsKeepTheirOrderAcrossTheDiversionAndTheThreadsExit() async throws {
    let thread = R7Thread()
    let loop = await thread.loop()
    let order = Guarded<[Int]>([])
    let onThread = Locked(0)
    // Tasks that prefer the loop, started in order from one task: their first jobs reach the
    // loop in this order.
    func start(_ range: Range<Int>) -> [Task<Void, Never>] {
      range.map { index in
        Task(executorPreference: loop) {
          if loop.isOnLoopThread { onThread.withLock { $0 += 1 } }
          order.withLock { $0.append(index) }
        }
      }
    }
    var tasks = start(0..<30)
    _ = await execOnNewThread {
      waitUntil("30 jobs waiting") { loop.shared.inboxLock.withLock { loop.shared.inbox.jobs.count } >= 30 }
    }
    loop.shutdown()
    let rerun = await thread.exec { loop -> RunLoopRunResult in
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepAlive)
      defer { keepAlive.invalidate() }
      return loop.run(for: .seconds(5))
    }
    tasks += start(30..<60)
    thread.quit()
    await execOnNewThread { _ = thread.bodyEnded.wait(timeout: .seconds(20)) }
    tasks += start(60..<90)
    let allTasks = tasks
    let done: Void? = try await withWatchdog(timeout: .seconds(20), "every job") {
      for task in allTasks { await task.value }
    }
    #expect(done != nil)
    #expect(rerun == .stopped || rerun == .finished)
    #expect(order.snapshot.count == 90)
    #expect(Set(order.snapshot).count == 90)
    #expect(order.snapshot == Array(0..<90), "the jobs ran out of order")
    #expect(onThread.withLock { $0 } == 0)
  }

  /// `performAndWait` on a current loop whose thread is out of a run, then `shutdown()` from a
  /// third thread: the documented outcome is `RunLoopError.shutDown` ("if the loop has shut down
  /// (or shuts down before running it)"), not a wait for the thread to exit.
  @Test func performAndWaitOnACurrentLoopShutDownBeforeRunningItThrows() async throws {
    let thread = R7Thread()
    let loop = await thread.loop()
    let outcome = Guarded<Result<Int, any Error>?>(nil)
    let waiter = TestGate()
    ExecThread {
      waiter.open()
      let result = Result { try loop.performAndWait { 7 } }
      outcome.withLock { $0 = result }
    }.detach()
    await execOnNewThread {
      _ = waiter.wait(timeout: .seconds(20))
      _ = waitUntil("the block waiting") { loop.shared.inboxLock.withLock { !loop.shared.inbox.performs.isEmpty } }
    }
    loop.shutdown()
    // The thread runs the loop again ("runs the block when its thread next runs it").
    let rerun = await thread.exec { loop -> RunLoopRunResult in
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepAlive)
      defer { keepAlive.invalidate() }
      return loop.run(for: .milliseconds(100))
    }
    #expect(rerun == .stopped)
    let returned = await execOnNewThread {
      waitUntil(timeout: .seconds(5), "performAndWait to return after the shutdown") { outcome.snapshot != nil }
    }
    #expect(returned)
    thread.quit()  // unblocks it otherwise
    _ = await execOnNewThread { waitUntil("performAndWait after the thread exits") { outcome.snapshot != nil } }
    if case .failure(let error)? = outcome.snapshot {
      #expect(error as? RunLoopError == .shutDown(loop: loop.name))
    } else {
      Issue.record("performAndWait returned \(String(describing: outcome.snapshot)) instead of throwing shutDown")
    }
  }

  // MARK: - 2. The exact order of one pass

  /// Runs `body` on a fresh current-loop thread with an observer of every activity in
  /// `observedMode`, and returns the log (activities and what `body` logged) and its result.
  private func logged<T: Sendable>(
    _ observedMode: RunLoopMode = .default,
    _ body: @escaping @Sendable (RunLoopThread, EventLog) -> T
  ) async -> ([String], T) {
    let thread = R7Thread()
    defer { thread.quit() }
    return await thread.exec { loop in
      let log = EventLog()
      let observer = LoopObserver(activities: .all) { _, activity in log.add("\(activity)") }
      loop.add(observer, to: observedMode)
      let result = body(loop, log)
      observer.invalidate()
      return (log.snapshot, result)
    }
  }

  private static func names(_ activities: [LoopActivity]) -> [String] { activities.map { "\($0)" } }

  /// A deadline already passed: one pass, no beforeWaiting/afterWaiting.
  @Test func aZeroTimeLimitMakesOnePassWithoutWaiting() async throws {
    let (log, result) = await logged { loop, _ in
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepAlive)
      defer { keepAlive.invalidate() }
      return loop.run(until: .now)
    }
    #expect(result == .timedOut)
    #expect(log == Self.names([.entry, .beforeTimers, .beforeSources, .exit]))
  }

  /// `returnAfterSourceHandled` with a signalled source: the pass fires it and ends without
  /// sleeping.
  @Test func returnAfterSourceHandledEndsThePassThatFiredWithoutSleeping() async throws {
    let (log, result) = await logged { loop, log in
      let source = InputSource { _ in log.add("source") }
      loop.add(source)
      source.signal()
      defer { source.invalidate() }
      return loop.run(for: .seconds(20), returnAfterSourceHandled: true)
    }
    #expect(result == .handledSource)
    #expect(log == ["entry", "beforeTimers", "beforeSources", "source", "exit"])
  }

  /// A stop from another thread while the loop sleeps: beforeWaiting, afterWaiting, exit.
  @Test func aStopArrivingWhileAsleepEndsAfterAfterWaiting() async throws {
    let (log, result) = await logged { loop, log in
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepAlive)
      defer { keepAlive.invalidate() }
      let stopper = LoopObserver(activities: .beforeWaiting, repeats: false) { _, _ in
        ExecThread { loop.stop() }.detach()
      }
      loop.add(stopper)
      return loop.run(for: .seconds(20))
    }
    #expect(result == .stopped)
    #expect(log == Self.names([.entry, .beforeTimers, .beforeSources, .beforeWaiting, .afterWaiting, .exit]))
  }

  /// A mode with nothing to watch (an observer is not something to watch): `.finished` at once,
  /// nobody told anything.
  @Test func aRunOfAnEmptyModeTellsNobody() async throws {
    let mode = modeM
    let (log, result) = await logged(mode) { loop, _ in loop.run(mode: mode, for: .seconds(20)) }
    #expect(result == .finished)
    #expect(log.isEmpty)
  }

  /// Work points A, B and C: a block and a job waiting before the run run after beforeSources,
  /// blocks first; a block a source releases runs before the sleep (B); a block a timer releases
  /// runs right after the timer, before the next pass (C).
  @Test func workPointsRunWhereTheDocumentSays() async throws {
    let thread = R7Thread()
    defer { thread.quit() }
    let loop = await thread.loop()
    let log = EventLog()
    let jobTask = Task(executorPreference: loop) { log.add("job") }
    _ = await execOnNewThread {
      waitUntil("the job waiting") { loop.shared.inboxLock.withLock { loop.shared.inbox.jobs.count } == 1 }
    }
    let result = await thread.exec { loop -> RunLoopRunResult in
      let observer = LoopObserver(activities: .all) { _, activity in log.add("\(activity)") }
      let source = InputSource { _ in
        log.add("source")
        loop.perform { log.add("blockB") }
      }
      let timer = LoopTimer(after: .milliseconds(1)) { _ in
        log.add("timer")
        loop.perform { log.add("blockC") }
        loop.stop()
      }
      loop.add(observer)
      loop.add(source)
      loop.add(timer)
      loop.perform { log.add("blockA") }
      source.signal()
      let result = loop.run(for: .seconds(20))
      observer.invalidate()
      source.invalidate()
      timer.invalidate()
      return result
    }
    await jobTask.value
    #expect(result == .stopped)
    let entries = log.snapshot
    let expectedStart = ["entry", "beforeTimers", "beforeSources", "blockA", "job", "source", "blockB"]
    #expect(Array(entries.prefix(expectedStart.count)) == expectedStart)
    // The timer may be due in the first pass or a later one; blockC follows it at once, then exit.
    #expect(Array(entries.suffix(3)) == ["timer", "blockC", "exit"])
  }

  // MARK: - 3. Modes and common modes

  /// A mode added to the common set from a callout inside a nested run of that very mode: a
  /// signalled source in `.common` joins it and fires in that run.
  @Test func aModeJoiningTheCommonSetDuringItsOwnRunServesCommonMembersAtOnce() async throws {
    let thread = R7Thread()
    defer { thread.quit() }
    let mode = modeM
    let (nested, fired) = await thread.exec { loop -> (RunLoopRunResult?, Int) in
      let fired = Locked(0)
      let nested = Guarded<RunLoopRunResult?>(nil)
      let source = InputSource { _ in fired.withLock { $0 += 1 } }
      loop.add(source, to: .common)
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepAlive, to: mode)
      loop.add(keepAlive)
      let opener = LoopTimer(after: .zero) { _ in
        loop.perform(inModes: [mode]) {
          loop.addModeToCommonModes(mode)
          source.signal()
        }
        nested.withLock { $0 = loop.run(mode: mode, for: .seconds(5), returnAfterSourceHandled: true) }
        loop.stop()
      }
      loop.add(opener)
      _ = loop.run(for: .seconds(20))
      let inCommon = loop.commonModes.contains(mode)
      source.invalidate()
      keepAlive.invalidate()
      opener.invalidate()
      return (inCommon ? nested.snapshot : nil, fired.withLock { $0 })
    }
    #expect(nested == .handledSource)
    #expect(fired == 1)
  }

  /// A source whose handler removes it from the mode it is also in and runs that mode nested:
  /// it does not fire there (it left), and a signal it sent itself fires once, back in the outer
  /// mode.
  @Test func aSourceRemovedFromANestedModeInsideItsHandlerDoesNotFireThere() async throws {
    let thread = R7Thread()
    defer { thread.quit() }
    let mode = modeM
    let (log, nested) = await thread.exec { loop -> ([String], RunLoopRunResult?) in
      let log = EventLog()
      let nested = Guarded<RunLoopRunResult?>(nil)
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepAlive, to: mode)
      loop.add(keepAlive)
      let source = InputSource { source in
        log.add("fire")
        guard nested.snapshot == nil else {
          loop.stop()
          return
        }
        loop.remove(source, from: mode)
        source.signal()
        nested.withLock { $0 = loop.run(mode: mode, for: .milliseconds(50), returnAfterSourceHandled: true) }
      }
      loop.add(source)
      loop.add(source, to: mode)
      source.signal()
      _ = loop.run(for: .seconds(20))
      source.invalidate()
      keepAlive.invalidate()
      return (log.snapshot, nested.snapshot)
    }
    #expect(nested == .timedOut)
    #expect(log == ["fire", "fire"])
  }

  /// Blocks performed for a mode that never runs are not lost: the shutdown drain runs each once
  /// (whether the loop had collected it or it still waited in the inbox).
  @Test func blocksForAModeNeverRunRunOnceAtShutdown() async throws {
    let loop = try RunLoopThread(name: "r7-never")
    let ran = Locked([String: Int]())
    let collected = loop.perform(inModes: [modeNever]) { ran.withLock { $0["collected", default: 0] += 1 } }
    _ = await execOnNewThread {
      // A default-mode block after it: once it ran, the loop holds the first block.
      let passed = TestGate()
      loop.perform { passed.open() }
      passed.wait(timeout: .seconds(20))
    }
    let gate = await execOnNewThread { blockLoop(loop) }
    let waiting = loop.perform(inModes: [modeNever]) { ran.withLock { $0["inbox", default: 0] += 1 } }
    gate.open()
    await execShutdown(loop)
    #expect(collected && waiting)
    #expect(ran.withLock { $0 } == ["collected": 1, "inbox": 1])
  }

  // MARK: - 4. Descriptor sources

  /// Two sources on one descriptor: the second add must either be refused or leave the first
  /// working. Here the first one was silenced (it reported an event while the loop ran a mode
  /// it is not in) when the second is added.
  @Test func aSecondSourceOnTheSameDescriptorNeverSilencesTheFirst() async throws {
    let thread = R7Thread()
    defer { thread.quit() }
    let pipe = makePipe()
    defer {
      close(pipe.read)
      close(pipe.write)
    }
    let mode = modeM
    let outcome = await thread.exec { loop -> (secondAdded: Bool, firstFired: Int, secondFired: Int) in
      let firstFired = Locked(0)
      let secondFired = Locked(0)
      let first = DescriptorSource(descriptor: pipe.read) { _, _ in
        firstFired.withLock { $0 += 1 }
        loop.stop()
      }
      try? loop.add(first, to: mode)
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepAlive)
      loop.add(keepAlive, to: mode)
      writeByte(pipe.write)
      // In .default the first source's event arrives and silences it.
      _ = loop.run(for: .milliseconds(50))
      let second = DescriptorSource(descriptor: pipe.read) { _, _ in secondFired.withLock { $0 += 1 } }
      let secondAdded = (try? loop.add(second)) != nil
      _ = loop.run(mode: mode, for: .seconds(2), returnAfterSourceHandled: true)
      first.invalidate()
      second.invalidate()
      keepAlive.invalidate()
      return (secondAdded, firstFired.withLock { $0 }, secondFired.withLock { $0 })
    }
    #expect(
      outcome.firstFired >= 1, "the first source never fired in its own mode (second added: \(outcome.secondAdded))")
    #expect(!outcome.secondAdded, "refused with EEXIST, as for an armed first source")
    #expect(outcome.secondFired == 0)
  }

  /// A silenced source (out of the epoll set while the loop runs another mode) whose descriptor
  /// is closed and whose number is reused by another file, with no new source: when its mode runs
  /// again it must not be registered on that other file (whose events it would then report).
  @Test func aSilencedSourceWhoseNumberNowNamesAnotherFileNeverReportsIt() async throws {
    let thread = R7Thread()
    defer { thread.quit() }
    let mode = modeM
    let (calls, reused) = await thread.exec { loop -> (Int, Bool) in
      let first = makePipe()
      let calls = Locked(0)
      let source = DescriptorSource(descriptor: first.read) { _, _ in
        calls.withLock { $0 += 1 }
        loop.stop()
      }
      try? loop.add(source, to: mode)
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepAlive)
      loop.add(keepAlive, to: mode)
      writeByte(first.write)
      // Its event arrives while the loop runs .default, which does not hold it: silenced.
      _ = loop.run(for: .milliseconds(50))
      let second = makePipe()
      let readEnd = first.read
      let reused = dup2(second.read, readEnd) == readEnd  // closes the old read end
      close(second.read)
      close(first.write)
      writeByte(second.write)  // the number's new file is readable
      _ = loop.run(mode: mode, for: .milliseconds(300), returnAfterSourceHandled: true)
      source.invalidate()
      keepAlive.invalidate()
      close(readEnd)
      close(second.write)
      return (calls.withLock { $0 }, reused)
    }
    #expect(reused)
    #expect(calls == 0, "the source reported the events of a file it was never given")
  }

  /// A descriptor closed while its source is registered, and its number reused by a new
  /// descriptor with a new source: the new source gets the events, the old one none.
  @Test func aClosedDescriptorsNumberReusedByANewSourceNeverReachesTheOldOne() async throws {
    let thread = R7Thread()
    defer { thread.quit() }
    let (old, new, reused) = await thread.exec { loop -> (Int, Int, Bool) in
      let first = makePipe()
      let oldCalls = Locked(0)
      let newCalls = Locked(0)
      let oldSource = DescriptorSource(descriptor: first.read) { _, _ in oldCalls.withLock { $0 += 1 } }
      try? loop.add(oldSource)
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepAlive)
      _ = loop.run(until: .now)
      // The number now names another pipe's read end (the old pipe's read end is closed by
      // dup2, atomically, so no other thread can take the number meanwhile).
      let second = makePipe()
      let readEnd = first.read
      let reused = dup2(second.read, readEnd) == readEnd
      close(second.read)
      close(first.write)
      let newSource = DescriptorSource(descriptor: readEnd) { _, _ in
        newCalls.withLock { $0 += 1 }
        drainDescriptor(readEnd)
        loop.stop()
      }
      try? loop.add(newSource)
      writeByte(second.write)
      _ = loop.run(for: .seconds(5))
      oldSource.invalidate()
      newSource.invalidate()
      keepAlive.invalidate()
      close(readEnd)
      close(second.write)
      return (oldCalls.withLock { $0 }, newCalls.withLock { $0 }, reused)
    }
    #expect(reused)
    #expect(new == 1)
    #expect(old == 0)
  }

  /// The armed case of the same: a second source on a descriptor whose first source is armed.
  @Test func aSecondSourceOnAnArmedDescriptorIsRefused() async throws {
    let thread = R7Thread()
    defer { thread.quit() }
    let pipe = makePipe()
    defer {
      close(pipe.read)
      close(pipe.write)
    }
    let refused = await thread.exec { loop -> Bool in
      let first = DescriptorSource(descriptor: pipe.read) { _, _ in }
      try? loop.add(first)
      let second = DescriptorSource(descriptor: pipe.read) { _, _ in }
      defer {
        first.invalidate()
        second.invalidate()
      }
      do {
        try loop.add(second)
        return false
      } catch let error as SystemCallError {
        return error.errno == EEXIST
      } catch {
        return false
      }
    }
    #expect(refused)
  }

  /// A pipe whose write end closed reports a hang-up to a readable source; a write end whose
  /// read end closed reports an error to a writable source.
  @Test func hangUpsAndErrorsAreReported() async throws {
    let thread = R7Thread()
    defer { thread.quit() }
    let reader = makePipe()
    let writer = makePipe()
    close(reader.write)
    close(writer.read)
    defer {
      close(reader.read)
      close(writer.write)
    }
    let (readEvents, writeEvents) = await thread.exec { loop -> (DescriptorEvents, DescriptorEvents) in
      let readSeen = Guarded(DescriptorEvents())
      let writeSeen = Guarded(DescriptorEvents())
      let readSource = DescriptorSource(descriptor: reader.read, interest: .readable) { source, events in
        readSeen.withLock { $0.formUnion(events) }
        source.invalidate()
      }
      let writeSource = DescriptorSource(descriptor: writer.write, interest: .writable) { source, events in
        writeSeen.withLock { $0.formUnion(events) }
        source.invalidate()
      }
      try? loop.add(readSource)
      try? loop.add(writeSource)
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepAlive)
      while readSeen.snapshot.isEmpty || writeSeen.snapshot.isEmpty {
        if loop.run(for: .seconds(5), returnAfterSourceHandled: true) == .timedOut { break }
      }
      keepAlive.invalidate()
      return (readSeen.snapshot, writeSeen.snapshot)
    }
    #expect(readEvents.contains(.hangUp))
    #expect(writeEvents.contains(.error))
  }

  /// `invalidate()` from another thread while the handler runs returns at once, and the handler
  /// is never called again although the descriptor stays readable.
  @Test func invalidatingFromAnotherThreadDuringTheHandlerEndsDeliveries() async throws {
    let loop = try RunLoopThread(name: "r7-fd-inval")
    let pipe = makePipe()
    defer {
      close(pipe.read)
      close(pipe.write)
    }
    let calls = Locked(0)
    let inHandler = TestGate()
    let release = TestGate()
    let source = DescriptorSource(descriptor: pipe.read) { _, _ in
      if calls.withLock({
        $0 += 1; return $0
      }) == 1 {
        inHandler.open()
        _ = release.wait(timeout: .seconds(20))
      }
    }
    try loop.add(source)
    writeByte(pipe.write)
    let invalidated = await execOnNewThread { () -> Bool in
      guard inHandler.wait(timeout: .seconds(20)) else { return false }
      source.invalidate()  // never blocks
      release.open()
      // A later pass (the descriptor is still readable) must not call the handler.
      let passed = TestGate()
      loop.perform { passed.open() }
      return passed.wait(timeout: .seconds(20))
    }
    #expect(invalidated)
    #expect(calls.withLock { $0 } == 1)
    #expect(!source.isValid)
    await execShutdown(loop)
  }

  /// A descriptor in `.default` only becomes readable during a nested run of another mode: it
  /// does not fire in the nested run, and fires once the outer run resumes.
  @Test func readinessDuringANestedRunInAnotherModeIsDeliveredAfterIt() async throws {
    let thread = R7Thread()
    defer { thread.quit() }
    let pipe = makePipe()
    defer {
      close(pipe.read)
      close(pipe.write)
    }
    let mode = modeM
    let log = await thread.exec { loop -> [String] in
      let log = EventLog()
      let source = DescriptorSource(descriptor: pipe.read) { _, _ in
        log.add("fd")
        drainDescriptor(pipe.read)
        loop.stop()
      }
      try? loop.add(source)
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepAlive, to: mode)
      loop.add(keepAlive)
      let nester = LoopTimer(after: .zero) { _ in
        let writer = LoopTimer(after: .zero) { _ in writeByte(pipe.write) }
        loop.add(writer, to: mode)
        log.add("nested \(loop.run(mode: mode, for: .milliseconds(100)))")
        writer.invalidate()
      }
      loop.add(nester)
      log.add("outer \(loop.run(for: .seconds(20)))")
      source.invalidate()
      keepAlive.invalidate()
      return log.snapshot
    }
    #expect(log == ["nested \(RunLoopRunResult.timedOut)", "fd", "outer \(RunLoopRunResult.stopped)"])
  }

  // MARK: - 5. Waits across loops, LoopGroup

  /// A timer's callout on loop A waits (`performAndWait`) for loop B, whose block then calls
  /// `invalidateAndWait()` on that timer: the documented answer is `wouldDeadlock` ("from a
  /// loop thread whose callout the timer's callout is itself waiting for, directly or through
  /// other loops"), not a hang. (If it hangs, both loop threads stay blocked for good.)
  @Test func invalidateAndWaitAgainstACalloutWaitingWithPerformAndWaitIsRefused() async throws {
    let loopA = try RunLoopThread(name: "r7-cycle-a")
    let loopB = try RunLoopThread(name: "r7-cycle-b")
    let outcome = Guarded<String?>(nil)
    let timerBox = Guarded<LoopTimer?>(nil)
    let timer = LoopTimer(after: .zero) { _ in
      let result = Result {
        try loopB.performAndWait { () -> String in
          guard let timer = timerBox.snapshot else { return "no timer" }
          do {
            try timer.invalidateAndWait()
            return "waited"
          } catch {
            return "\(error)"
          }
        }
      }
      outcome.withLock { $0 = (try? result.get()) ?? "performAndWait threw" }
    }
    timerBox.withLock { $0 = timer }
    loopA.add(timer)
    let finished = await execOnNewThread {
      waitUntil(timeout: .seconds(5), "the cross-loop wait to end") { outcome.snapshot != nil }
    }
    #expect(finished)
    #expect(outcome.snapshot?.contains("would wait") == true, "outcome: \(String(describing: outcome.snapshot))")
    if finished {
      await execShutdown(loopA)
      await execShutdown(loopB)
    }
  }

  /// A job of loop B's actor calls `performAndWait` on loop A, and A's block calls an
  /// unrelated loop C synchronously: no cycle, so everything completes.
  @Test func performAndWaitChainsAcrossLoopsComplete() async throws {
    let loops = try (0..<3).map { try RunLoopThread(name: "r7-chain-\($0)") }
    let actor = R7Actor(loop: loops[1])
    let value = try await withWatchdog(timeout: .seconds(20), "a chain of performAndWait") {
      try await actor.chain(through: loops[0], then: loops[2])
    }
    #expect(value == 3)
    for loop in loops { await execShutdown(loop) }
  }

  /// `next()` hands out the loops round-robin; `shutdownAndWait()` shuts each down, after which
  /// `perform` refuses and a job still runs (on the fallback).
  @Test func loopGroupRoundRobinAndShutdown() async throws {
    let group = try LoopGroup(count: 3, name: "r7-group")
    let handed = (0..<7).map { _ in group.next() }
    #expect(
      handed.map(\.name) == [
        "r7-group-0", "r7-group-1", "r7-group-2", "r7-group-0", "r7-group-1", "r7-group-2", "r7-group-0",
      ])
    let actor = R7Actor(loop: group.loops[2])
    #expect(await actor.call())
    await execOnNewThread { group.shutdownAndWait() }
    #expect(group.loops.allSatisfy { $0.isShutDown })
    #expect(group.loops.allSatisfy { !$0.perform {} })
    let late = try await withWatchdog(timeout: .seconds(20), "a late call") { await actor.call() }
    #expect(late == true)
  }
}

extension R7Actor {
  /// On this actor's loop: waits for `first`, whose block waits for `second`.
  func chain(through first: RunLoopThread, then second: RunLoopThread) throws -> Int {
    try first.performAndWait { () throws -> Int in
      try second.performAndWait { 1 } + 2
    }
  }
}
