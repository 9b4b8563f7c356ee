import Glibc
import Synchronization
import Testing

@_spi(Testing) @testable import AsyncRunLoop

/// One pass does the documented phases, in order, and a run ends when its mode is empty.
@Suite(
  "One pass does the documented phases, in order, and a run ends when its mode is empty", .serialized,
  .timeLimit(.minutes(10)))
struct PassOrderTests: PassTestModes {
  /// On one loop thread, three sources of different orders are added to and removed from B, C and
  /// `.common` at random, signalled at random, and C joins the common set halfway, while passes of
  /// A, B, C and `.default` run, directly or nested in a helper source's handler in A. After each
  /// pass, exactly the sources that were signalled and are in the pass's mode (as the loop says)
  /// fired, once each, in order, and are no longer signalled; the others did not fire.
  @Test(arguments: [7, 8, 9, 10, 11, 12])
  func aPassFiresExactlyTheSignalledSourcesOfItsMode(seed: Int) async throws {
    let problems = try await withWatchdogOnThread(timeout: .seconds(20), "exact firing") { () -> [String] in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      let modes: [RunLoopMode] = [orderModeA, orderModeB, orderModeC, .default]
      let keeps = modes.map { mode in
        let keep = LoopTimer(after: .seconds(3600)) { _ in }
        loop.add(keep, to: mode)
        return keep
      }
      let log = EventLog()
      var sources = (0..<3).map { index in InputSource(order: 2 - index) { _ in log.add("s\(index)") } }
      let problems = Guarded<[String]>([])
      /// Runs one pass of `mode` and checks what fired against what the loop held.
      let checkedPass: @Sendable ([InputSource], RunLoopMode, String) -> Void = { sources, mode, label in
        let due = sources.indices.filter { sources[$0].isSignalled && loop.core.modes(of: sources[$0]).contains(mode) }
          .sorted { sources[$0].order < sources[$1].order }
        let before = log.snapshot.count
        runOnePass(loop, mode)
        let fired = Array(log.snapshot[before...].filter { $0.hasPrefix("s") })
        let expected = due.map { "s\($0)" }
        if fired != expected {
          problems.withLock { $0.append("\(label) \(mode): fired \(fired), expected \(expected)") }
        }
        for index in due where sources[index].isSignalled {
          problems.withLock { $0.append("\(label) \(mode): s\(index) still signalled") }
        }
      }
      let nested = Guarded<(sources: [InputSource], mode: RunLoopMode, label: String)?>(nil)
      let helper = InputSource(order: 100) { _ in
        guard let job = nested.snapshot else { return }
        checkedPass(job.sources, job.mode, job.label)
      }
      loop.add(helper, to: orderModeA)
      var random = SeededRandom(state: UInt64(seed))
      for step in 0..<deferredSignalSteps {
        if step == deferredSignalSteps / 2 { loop.addModeToCommonModes(orderModeC) }
        let index = random.next(3)
        let source = sources[index]
        switch random.next(12) {
        case 0: loop.add(source, to: orderModeB)
        case 1: loop.remove(source, from: orderModeB)
        case 2: loop.add(source, to: orderModeC)
        case 3: loop.remove(source, from: orderModeC)
        case 4: loop.add(source, to: .common)
        case 5: loop.remove(source, from: .common)
        case 6, 7: source.signal()
        case 8:
          // Nested: a pass of B, C or default inside the helper's handler, during a pass of A.
          let mode = [orderModeB, orderModeC, RunLoopMode.default][random.next(3)]
          nested.withLock { $0 = (sources, mode, "step \(step) nested") }
          helper.signal()
          runOnePass(loop, orderModeA)
          nested.withLock { $0 = nil }
        case 9:
          if random.next(8) == 0 {
            source.invalidate()
            sources[index] = InputSource(order: 2 - index) { _ in log.add("s\(index)") }
          } else {
            checkedPass(sources, modes[random.next(4)], "step \(step)")
          }
        default:
          checkedPass(sources, modes[random.next(4)], "step \(step)")
        }
      }
      for source in sources { source.invalidate() }
      helper.invalidate()
      for keep in keeps { keep.invalidate() }
      return problems.snapshot
    }
    #expect(problems == [])
  }

  /// A loop-preferring task sleeping (an every-mode timer) is not visible to clients: a run of a
  /// mode that holds nothing still returns finished at once (SPEC §6), instead of waiting until
  /// its limit for the sleeper.
  @Test
  func anEmptyModeRunFinishesAtOnceWhileATaskSleeps() async throws {
    let loop = try RunLoopThread(name: "empty")
    let before = loop.scheduledJobCount
    let sleeper = Task(executorPreference: loop) { try? await Task.sleep(for: .seconds(30)) }
    let result = try await withWatchdogOnThread(timeout: .seconds(10), "empty run") { () -> RunLoopRunResult? in
      waitUntil(timeout: .seconds(5), "the sleep scheduled") { loop.scheduledJobCount > before }
      return try loop.performAndWait { loop.run(mode: orderModeEmpty, until: .now.advanced(by: .milliseconds(300))) }
    }
    sleeper.cancel()
    await execShutdown(loop)
    #expect(result == .finished)
  }

  /// A modal run of an empty mode from a task while another task sleeps long on the loop returns
  /// (finished) instead of waiting for the sleep.
  @Test func aModalRunOfAnEmptyModeDoesNotWaitForALongSleep() async throws {
    let loop = try RunLoopThread(name: "modal")
    let sleeper = Task(executorPreference: loop) { try await Task.sleep(for: .seconds(30)) }
    let result = try await withWatchdog(timeout: .seconds(30), "modal run of an empty mode") {
      try await loop.runModal(mode: silencedEmptyMode)
    }
    #expect(result == .finished)
    sleeper.cancel()
    loop.shutdown()
  }

  /// A normal run of a mode that never held anything, and of one emptied by a removal from
  /// another thread, returns `.finished` (not `.stopped`), nested or modal.
  @Test func aRunOfAnEmptyModeStillFinishes() async throws {
    let loop = try RunLoopThread(name: "empty")
    defer { loop.shutdownAndWait() }
    let emptied: RunLoopMode = "emptied"
    let timer = LoopTimer(after: .seconds(3_600)) { _ in }
    loop.add(timer, to: emptied)
    try loop.performAndWait {}
    loop.remove(timer, from: emptied)
    let deadline = LoopClock.Instant.now.advanced(by: .seconds(5))
    let nested = try loop.performAndWait { () -> [RunLoopRunResult] in
      [loop.run(mode: "never", until: deadline), loop.run(mode: emptied, until: deadline)]
    }
    let modal = try await loop.runModal(mode: "never-modal", until: deadline)
    let modalEmptied = try await loop.runModal(mode: emptied, until: deadline)
    #expect(nested == [.finished, .finished])
    #expect([modal, modalEmptied] == [.finished, .finished])
    timer.invalidate()
  }

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

  /// A descriptor that becomes ready while the loop sleeps: observers are told afterWaiting (step
  /// 8), then its handler runs (step 9), as CF tells afterWaiting before it handles what woke it.
  @Test func aReadinessThatWakesTheLoopIsHandledAfterAfterWaiting() async throws {
    let (log, result) = await logged { loop, log in
      var ends: [Int32] = [0, 0]
      guard pipe(&ends) == 0 else { return RunLoopRunResult.finished }
      defer {
        close(ends[0])
        close(ends[1])
      }
      let readEnd = ends[0]
      let reader = DescriptorSource(descriptor: readEnd, interest: .readable) { _, _ in
        var byte: UInt8 = 0
        _ = read(readEnd, &byte, 1)
        log.add("readiness")
      }
      try? loop.add(reader)
      defer { reader.invalidate() }
      let writeEnd = ends[1]
      let writer = LoopObserver(activities: .beforeWaiting, repeats: false) { _, _ in
        ExecThread {
          var byte: UInt8 = 1
          _ = write(writeEnd, &byte, 1)
        }.detach()
      }
      loop.add(writer)
      return loop.run(for: .seconds(20), returnAfterSourceHandled: true)
    }
    #expect(result == .handledSource)
    #expect(
      log
        == Self.names([.entry, .beforeTimers, .beforeSources, .beforeWaiting, .afterWaiting]) + ["readiness"]
        + Self.names([.exit]))
  }

  /// What a readiness handler hands its own loop (a performed block) runs in the same pass, at
  /// work point C: a run that returns after the handled source has run it when it returns.
  @Test func aBlockPerformedByAReadinessHandlerRunsBeforeTheRunReturnsAfterIt() async throws {
    let (log, result) = await logged { loop, log in
      runUntilAByteIsRead(on: loop, log: log) { loop.perform { log.add("block") } }
    }
    #expect(result == .handledSource)
    let steps = log.filter { !$0.hasPrefix("before") && !$0.hasPrefix("after") }
    #expect(steps == ["entry", "readiness", "block", "exit"])
  }

  /// An afterWaiting observer that runs the loop nested in another mode on every wake-up (that
  /// run's wait reports, and silences, the outer mode's descriptor) does not keep the outer run
  /// from handling it: the outer run polls again after the observer.
  @Test func anAfterWaitingObserverThatNestsOnEveryWakeUpDoesNotStarveReadiness() async throws {
    let other = RunLoopMode("nested-on-wake")
    let (log, result) = await logged { loop, log in
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: other)
      defer { keep.invalidate() }
      let nester = LoopObserver(activities: .afterWaiting) { _, _ in _ = loop.run(mode: other, for: .zero) }
      loop.add(nester)
      defer { nester.invalidate() }
      return runUntilAByteIsRead(on: loop, log: log)
    }
    #expect(result == .handledSource)
    #expect(log.filter { $0 == "readiness" }.count == 1)
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
    let thread = CommandedCurrentLoopThread()
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
}

/// On `loop`'s thread: a pipe's read end as a readiness source in the default mode, whose handler
/// reads a byte, logs "readiness" and calls `onRead`; one byte written; then a run of the default
/// mode that returns after a handled source (`.finished` if no pipe could be made, which the
/// callers' expectations report).
private func runUntilAByteIsRead(
  on loop: RunLoopThread, log: EventLog, onRead: @escaping @Sendable () -> Void = {}
) -> RunLoopRunResult {
  var ends: [Int32] = [0, 0]
  guard pipe(&ends) == 0 else { return .finished }
  let (readEnd, writeEnd) = (ends[0], ends[1])
  defer {
    close(readEnd)
    close(writeEnd)
  }
  let reader = DescriptorSource(descriptor: readEnd, interest: .readable) { _, _ in
    var byte: UInt8 = 0
    _ = read(readEnd, &byte, 1)
    log.add("readiness")
    onRead()
  }
  try? loop.add(reader)
  defer { reader.invalidate() }
  var byte: UInt8 = 1
  _ = write(writeEnd, &byte, 1)
  return loop.run(for: .seconds(20), returnAfterSourceHandled: true)
}
