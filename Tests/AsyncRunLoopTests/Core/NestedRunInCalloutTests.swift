import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

/// A run nested in any callout ends cleanly, and the outer run goes on.
@Suite("A run nested in any callout ends cleanly, and the outer run goes on", .serialized, .timeLimit(.minutes(10)))
struct NestedRunInCalloutTests: PassTestModes {
  /// "A timer never fires inside its own callout (a nested run in another of its modes skips
  /// it)". Skipping must not make the nested run spin: the timer is due but cannot fire, so a
  /// nested run of 100 ms in that other mode, with nothing else to do, should sleep, not make a
  /// pass per wake-up of an immediately expiring timerfd. (A bound on passes, not on time: a
  /// slower machine makes fewer passes, not more.)
  @Test
  func aRunNestedInATimerCalloutInAnotherOfItsModesDoesNotSpinOnTheSkippedTimer() async throws {
    let loop = try RunLoopThread(name: "timer-spin")
    defer { loop.shutdownAndWait() }
    let other: RunLoopMode = "other"
    let passes = AtomicCounter()
    let nested = Guarded<RunLoopRunResult?>(nil)
    let counter = LoopObserver(activities: .beforeTimers) { _, _ in passes.increment() }
    let timer = LoopTimer(after: .zero, repeatingEvery: .seconds(3600)) { _ in
      guard nested.snapshot == nil else { return }
      let result = loop.run(mode: other, for: .milliseconds(100))
      nested.withLock { $0 = result }
    }
    try loop.performAndWait {
      loop.add(counter, to: other)
      loop.add(timer, to: .default)
      loop.add(timer, to: other)
    }
    #expect(await eventually("the nested run ended") { nested.snapshot != nil })
    #expect(nested.snapshot == .timedOut)
    #expect(passes.current < 50, "the nested run made \(passes.current) passes in 100 ms")
    timer.invalidate()
    counter.invalidate()
  }

  /// A run nested in a timer's callout takes the timer's entry in the nested mode out of that
  /// mode's heap while the callout runs; when the callout then removes the timer from the mode it
  /// fired in, the timer still fires in its other mode afterwards (the entry comes back).
  @Test func aTimerSkippedByANestedRunAndRemovedByItsCalloutStillFiresInItsOtherMode() throws {
    let loop = try RunLoopThread(name: "timer-parked")
    defer { loop.shutdownAndWait() }
    let other: RunLoopMode = "parked-other"
    let fires = AtomicCounter()
    let timer = LoopTimer(after: .zero, repeatingEvery: .milliseconds(20)) { timer in
      fires.increment()
      guard fires.current == 1 else { return }
      loop.run(mode: other, for: .milliseconds(30))  // skips this timer (its callout is running)
      loop.remove(timer, from: .default)
    }
    try loop.performAndWait {
      loop.add(timer, to: .default)
      loop.add(timer, to: other)
    }
    #expect(waitUntil(timeout: .seconds(5)) { fires.current >= 1 })
    let result = try loop.performAndWait { () -> Int in
      let before = fires.current
      loop.run(mode: other, for: .milliseconds(300))
      return fires.current - before
    }
    #expect(result >= 1, "the timer never fired in its other mode again")
    timer.invalidate()
  }

  /// Paused, made readable, resumed from a timer of a nested run in a mode that does not hold it:
  /// not armed there, armed when its own mode runs again, and it fires exactly once.
  @Test func aSourceResumedDuringANestedRunOfAnotherModeFiresWhenItsModeRuns() throws {
    let loop = try RunLoopThread(name: "pause")
    let pipe = FireCountingPipe()
    let (whilePaused, inOther, after, listed) = try loop.performAndWait { () throws -> (Int, Int, Int, Int) in
      try loop.add(pipe.source, to: .default)
      loop.core.setPaused(pipe.source, true)
      writeByte(pipe.write)
      loop.run(mode: .default, until: .now.advanced(by: .milliseconds(10)))
      let whilePaused = pipe.count
      let resume = LoopTimer(after: .milliseconds(5)) { _ in loop.core.setPaused(pipe.source, false) }
      loop.add(resume, to: silencedOtherMode)
      runOtherModeBriefly(loop)
      let inOther = pipe.count
      loop.run(mode: .default, until: .now.advanced(by: .milliseconds(10)))
      return (whilePaused, inOther, pipe.count, loop.core.descriptors.silenced.count)
    }
    #expect(whilePaused == 0)
    #expect(inOther == 0)
    #expect(after == 1)
    #expect(listed == 0)
    loop.shutdownAndWait()
    pipe.close()
  }

  /// A handler of the running mode runs a nested mode that silences a sibling source of the outer
  /// mode; the sibling, made readable again, fires in the outer mode's next pass (never lost).
  @Test func aSourceSilencedByANestedRunInAHandlerFiresInTheOuterMode() throws {
    let loop = try RunLoopThread(name: "nested")
    let trigger = FireCountingPipe()
    let sibling = FireCountingPipe()
    let nested = DescriptorSource(descriptor: trigger.read) { _, _ in
      _ = drainDescriptor(trigger.read)
      trigger.fires.withLock { $0 += 1 }
      writeByte(sibling.write)
      runOtherModeBriefly(loop)
    }
    let (siblingFires, listed) = try loop.performAndWait { () throws -> (Int, Int) in
      try loop.add(nested, to: .default)
      try loop.add(sibling.source, to: .default)
      writeByte(trigger.write)
      // Until the sibling fired: under load the outer run's limit can pass during the handler's
      // nested run, before a pass of `.default` armed the sibling again (it then fires in the
      // next run of `.default`).
      let deadline = ContinuousClock.now.advanced(by: .seconds(10))
      while sibling.count == 0 && ContinuousClock.now < deadline {
        loop.run(mode: .default, until: .now.advanced(by: .milliseconds(40)))
      }
      loop.run(mode: .default, until: .now.advanced(by: .milliseconds(10)))  // no second fire
      return (sibling.count, loop.core.descriptors.silenced.count)
    }
    #expect(trigger.count == 1)
    #expect(siblingFires == 1)
    #expect(listed == 0)
    nested.invalidate()
    loop.shutdownAndWait()
    trigger.close()
    sibling.close()
  }

  /// A callout of each kind runs the loop nested (in `.default`, kept alive by a probe source);
  /// while it runs, commands posted to the probe are delivered there, each once. Then the callout's
  /// member is invalidated or removed and the loop stopped (the nested run returns `.stopped`, the
  /// member never calls out again, the outer run keeps delivering), or the loop is shut down from
  /// another thread (the nested run returns `.stopped`, everything is released). Exact counts.
  @Test(arguments: NestedRunCallout.allCases, NestedRunEnding.allCases)
  func aRunNestedInEveryKindOfCalloutEndsCleanly(callout: NestedRunCallout, end: NestedRunEnding) async throws {
    let loop = try RunLoopThread(name: "nested")
    let probeDelivered = AtomicCounter()
    let probe = CommandSource<Int> { _ in probeDelivered.increment() }
    loop.add(probe.source, to: .default)
    let entered = AtomicCounter()
    let results = Guarded<[RunLoopRunResult]>([])
    let deaths = AtomicCounter()
    let pipe = callout == .descriptor ? makePipe() : nil
    defer {
      if let pipe {
        close(pipe.read)
        close(pipe.write)
      }
    }
    let limit = LoopClock.Instant.now.advanced(by: .seconds(60 * watchdogScale))
    var member: AnyMemberHandle?
    var waiter: pthread_t?
    let waitResult = Guarded<Bool?>(nil)
    var task: Task<Void, Never>?
    do {
      let canary = ReleaseCanary(deaths)
      let nested: @Sendable () -> Void = {
        canary.touch()
        guard entered.increment() == 1 else { return }
        let result = RunLoopThread.current.run(mode: .default, until: limit)
        results.withLock { $0.append(result) }
      }
      switch callout {
      case .timer:
        let timer = LoopTimer(after: .milliseconds(1), repeatingEvery: .milliseconds(2)) { _ in nested() }
        member = AnyMemberHandle(
          add: { $0.add(timer, to: .default) }, remove: { $0.remove(timer, from: .default) },
          invalidate: { timer.invalidate() }, trigger: {})
      case .observer:
        // beforeWaiting only: the afterWaiting that pairs with it would be a second callout.
        let observer = LoopObserver(activities: [.beforeWaiting]) { _, _ in nested() }
        member = AnyMemberHandle(
          add: { $0.add(observer, to: .default) }, remove: { $0.remove(observer, from: .default) },
          invalidate: { observer.invalidate() }, trigger: {})
      case .source:
        let source = InputSource { _ in nested() }
        member = AnyMemberHandle(
          add: { $0.add(source, to: .default) }, remove: { $0.remove(source, from: .default) },
          invalidate: { source.invalidate() }, trigger: { source.signal() })
      case .command:
        let command = CommandSource<Int> { _ in nested() }
        member = AnyMemberHandle(
          add: { $0.add(command.source, to: .default) }, remove: { $0.remove(command.source, from: .default) },
          invalidate: { command.source.invalidate() }, trigger: { _ = command.post(1) })
      case .descriptor:
        let descriptor = DescriptorSource(descriptor: pipe!.read) { source, _ in
          _ = drainDescriptor(source.descriptor)
          nested()
        }
        let write = pipe!.write
        member = AnyMemberHandle(
          add: { try? $0.add(descriptor, to: .default) }, remove: { $0.remove(descriptor, from: .default) },
          invalidate: { descriptor.invalidate() }, trigger: { writeByte(write) })
      case .perform:
        #expect(loop.perform(nested))
      case .performAndWait:
        waiter = startThread {
          do {
            try loop.performAndWait(nested)
            waitResult.withLock { $0 = true }
          } catch {
            waitResult.withLock { $0 = false }
          }
        }
      case .actorJob:
        let actor = BodyRunningActor(loop: loop)
        task = Task { await actor.run(nested) }
      case .consumer:
        let sequence = loop.signalSequence()
        _ = sequence.signal()
        task = Task(executorPreference: loop) {
          for await _ in sequence {
            nested()
            break
          }
        }
      }
    }
    if let member {
      member.add(loop)
      member.trigger()
    }
    #expect(await eventuallyWithin { entered.current == 1 }, "the \(callout) never called out")
    for index in 0..<5 { #expect(probe.post(index)) }
    #expect(
      await eventuallyWithin { probeDelivered.current == 5 },
      "the run nested in the \(callout) delivered \(probeDelivered.current) of 5")
    switch end {
    case .invalidateAndStop:
      member?.invalidate()
      loop.stop()
    case .removeAndStop:
      if let member { member.remove(loop) }
      loop.stop()
    case .shutdown:
      await execShutdown(loop)
    }
    #expect(await eventuallyWithin { results.snapshot.count == 1 }, "the run nested in the \(callout) never returned")
    // "stopped (or the loop is shutting down)" (OnePassOfTheLoop, step 9).
    #expect(results.snapshot == [.stopped])
    if end != .shutdown {
      // The outer run goes on; the member that called out is gone from the mode.
      for index in 5..<10 { #expect(probe.post(index)) }
      #expect(await eventuallyWithin { probeDelivered.current == 10 })
      member?.trigger()
      _ = try await withWatchdogOnThread(timeout: .seconds(20), "a round trip") { try loop.performAndWait {} }
      await execShutdown(loop)
    }
    if let waiter { joinThread(waiter) }
    if callout == .performAndWait {
      #expect(waitResult.snapshot == true, "performAndWait did not return its block's result")
    }
    if let task { _ = try await withWatchdog(timeout: .seconds(20), "the \(callout) task") { await task.value } }
    member = nil
    #expect(entered.current == 1, "the \(callout) called out again")
    #expect(probeDelivered.current == (end == .shutdown ? 5 : 10))
    #expect(await eventuallyWithin { deaths.current == 1 }, "the \(callout)'s closure was not released")
  }

  /// A timer's callout runs the loop nested in a mode that holds only a probe source; another
  /// thread removes the probe from that mode (or invalidates it): the mode has nothing left to
  /// watch, so the nested run ends (`.finished`), long before its limit.
  @Test(arguments: [false, true])
  func aNestedRunWhoseModeEmptiesFinishes(invalidate: Bool) async throws {
    let loop = try RunLoopThread(name: "empties")
    let delivered = AtomicCounter()
    let probe = CommandSource<Int> { _ in delivered.increment() }
    loop.add(probe.source, to: releaseNestMode)
    let result = Guarded<RunLoopRunResult?>(nil)
    let limit = LoopClock.Instant.now.advanced(by: .seconds(3_600))
    let timer = LoopTimer(after: .zero) { _ in
      result.withLock { $0 = RunLoopThread.current.run(mode: releaseNestMode, until: limit) }
    }
    loop.add(timer, to: .default)
    #expect(probe.post(1))
    #expect(await eventuallyWithin { delivered.current == 1 }, "the nested run never delivered")
    if invalidate {
      probe.source.invalidate()
    } else {
      loop.remove(probe.source, from: releaseNestMode)
    }
    #expect(await eventuallyWithin { result.snapshot != nil }, "the nested run of an emptied mode never ended")
    #expect(result.snapshot == .finished)
    await execShutdown(loop)
  }

  /// A command's handler runs the loop nested; commands posted meanwhile from another thread are
  /// delivered inside it, each once, in order; then the source is invalidated from another thread
  /// (commands accepted before are still delivered, later posts are refused) and the nested run is
  /// stopped. Cancel runs once, after every delivery.
  @Test func aCommandHandlersNestedRunDeliversLaterCommandsOnceInOrderThroughInvalidation() async throws {
    let loop = try RunLoopThread(name: "cmd-nest")
    let log = Guarded<[String]>([])
    let nestedResult = Guarded<RunLoopRunResult?>(nil)
    let limit = LoopClock.Instant.now.advanced(by: .seconds(60 * watchdogScale))
    let keepAlive = LoopTimer(after: .seconds(3_600)) { _ in }
    loop.add(keepAlive, to: .default)
    let commands = CommandSource<Int>(
      cancel: { _, _ in log.withLock { $0.append("cancel") } },
      handler: { value in
        log.withLock { $0.append("\(value)") }
        if value == 0 {
          let result = RunLoopThread.current.run(mode: .default, until: limit)
          nestedResult.withLock { $0 = result }
          log.withLock { $0.append("nested returned") }
        }
      })
    loop.add(commands.source, to: .default)
    #expect(commands.post(0))
    #expect(await eventuallyWithin { log.snapshot.contains("0") })
    for value in 1...20 { #expect(commands.post(value)) }
    #expect(await eventuallyWithin { log.snapshot.count >= 21 })
    for value in 21...30 { #expect(commands.post(value)) }
    commands.source.invalidate()
    #expect(!commands.post(99), "a post after invalidate() was accepted")
    #expect(await eventuallyWithin { log.snapshot.contains("cancel") || log.snapshot.contains("nested returned") })
    loop.stop()
    #expect(await eventuallyWithin { log.snapshot.contains("nested returned") && log.snapshot.contains("cancel") })
    await execShutdown(loop)
    let entries = log.snapshot
    let numbers = entries.compactMap { Int($0) }
    #expect(numbers == Array(0...30), "\(entries)")
    #expect(entries.filter { $0 == "cancel" }.count == 1)
    if let cancelAt = entries.firstIndex(of: "cancel"), let lastNumber = entries.lastIndex(where: { Int($0) != nil }) {
      #expect(cancelAt > lastNumber, "cancel before a delivery: \(entries)")
    }
  }

  /// A timer's callout runs the loop nested; another thread's `invalidateAndWait()` waits for the
  /// callout ("after this returns, no callout of the timer runs anywhere") until the nested run is
  /// stopped (or the loop shut down) and the callout has returned. No callout afterwards, and the
  /// handler is released.
  @Test(arguments: [false, true])
  func invalidateAndWaitForACalloutInANestedRunReturnsAfterIt(shutdown: Bool) async throws {
    let loop = try RunLoopThread(name: "iaw")
    let log = Guarded<[String]>([])
    let deaths = AtomicCounter()
    let probe = CommandSource<Int> { _ in log.withLock { $0.append("probe") } }
    loop.add(probe.source, to: .default)
    let limit = LoopClock.Instant.now.advanced(by: .seconds(60 * watchdogScale))
    let timer: LoopTimer
    do {
      let canary = ReleaseCanary(deaths)
      timer = LoopTimer(after: .zero, repeatingEvery: .milliseconds(2)) { _ in
        canary.touch()
        log.withLock { $0.append("callout") }
        _ = RunLoopThread.current.run(mode: .default, until: limit)
        log.withLock { $0.append("callout returned") }
      }
    }
    loop.add(timer, to: .default)
    // The callout first, then the probe: posted together, a slow (sanitized) loop could take
    // both in one pass and deliver the probe before the timer fires (sources fire before timers
    // in a pass), and the wait below would then find no callout at all.
    #expect(await eventuallyWithin { log.snapshot.contains("callout") }, "the timer never fired")
    #expect(probe.post(1))
    #expect(await eventuallyWithin { log.snapshot.contains("probe") }, "the nested run never delivered")
    let waiter = startThread {
      let outcome: String
      do {
        try timer.invalidateAndWait()
        outcome = "waited"
      } catch {
        outcome = "\(error)"
      }
      log.withLock { $0.append(outcome) }
    }
    // The waiter is blocked until the callout returns (it cannot have returned yet: nothing
    // stopped the nested run). Give it a moment to block, then end the nested run.
    #expect(await eventuallyWithin { !timer.isValid })
    if shutdown {
      loop.shutdown()
    } else {
      loop.stop()
    }
    _ = try await withWatchdogOnThread(timeout: .seconds(20), "invalidateAndWait") { joinThread(waiter) }
    await execShutdown(loop)
    let entries = log.snapshot.filter { $0 != "probe" }
    #expect(entries == ["callout", "callout returned", "waited"], "\(log.snapshot)")
    _ = consume timer
    #expect(await eventuallyWithin { deaths.current == 1 })
  }

  /// Promise (Nested runs, Shutdown): a run nested in any kind of callout ends when another
  /// thread shuts the loop down (`.stopped`: "shutdown() ends every run of the loop ... at every
  /// nesting level"), the shutdown returns, and every source's cancel routine runs exactly once.
  @Test(arguments: ["observer", "timer", "source", "command", "descriptor", "schedule", "block", "actor"])
  func nestedRunInACalloutEndsWhenAnotherThreadShutsDown(kind: String) async throws {
    let failures = try await withWatchdog(timeout: .seconds(60), "nested \(kind) vs shutdown") { () -> [String] in
      var failures: [String] = []
      for round in 0..<25 {
        let loop = try RunLoopThread(name: "nest")
        let nested = RunLoopMode("nested")
        let keep = LoopTimer(after: .seconds(3_600)) { _ in }
        loop.add(keep, to: nested)
        let entered = TestGate()
        let results = Guarded<[RunLoopRunResult]>([])
        let once = Guarded(false)
        let nest: @Sendable () -> Void = {
          let first = once.withLock { value in
            defer { value = true }
            return !value
          }
          guard first else { return }
          entered.open()
          let result = loop.run(mode: nested, until: .distantFuture)
          results.withLock { $0.append(result) }
        }
        let witnessCancels = AtomicCounter()
        let witness = InputSource(cancel: { _, _ in witnessCancels.increment() }) { _ in }
        loop.add(witness, to: .common)
        loop.add(witness, to: nested)
        var keepAlive: [AnyObject] = [keep, witness]
        var pipeEnds: (read: Int32, write: Int32)?
        var actorTask: Task<Void, Never>?
        switch kind {
        case "observer":
          let observer = LoopObserver(activities: [.beforeWaiting, .afterWaiting]) { _, _ in nest() }
          loop.add(observer, to: .common)
          keepAlive.append(observer)
          loop.wakeUp()
        case "timer":
          let timer = LoopTimer(after: .zero) { _ in nest() }
          loop.add(timer, to: .common)
          keepAlive.append(timer)
        case "source":
          let source = InputSource { _ in nest() }
          loop.add(source, to: .common)
          source.signal()
          keepAlive.append(source)
        case "command":
          let commands = CommandSource<Int> { _ in nest() }
          loop.add(commands.source, to: .common)
          commands.post(1)
          commands.post(2)
          keepAlive.append(commands)
        case "descriptor":
          let ends = makePipe()
          pipeEnds = ends
          let source = DescriptorSource(descriptor: ends.read) { _, _ in nest() }
          try loop.add(source, to: .common)
          writeByte(ends.write)
          keepAlive.append(source)
        case "schedule":
          let source = InputSource(schedule: { _, _, _ in nest() }) { _ in }
          loop.add(source, to: .common)
          keepAlive.append(source)
        case "block":
          loop.perform { nest() }
        default:
          let actor = ClosureNestingActor(loop: loop, nest: nest)
          actorTask = Task(executorPreference: loop) { await actor.nestOnce() }
        }
        let didEnter = await execOnNewThread { entered.wait(timeout: .seconds(10)) }
        if !didEnter {
          failures.append("round \(round): the \(kind) callout never ran")
        }
        await execOnNewThread { loop.shutdownAndWait() }
        await actorTask?.value
        if results.snapshot != [.stopped] {
          failures.append("round \(round): nested runs returned \(results.snapshot)")
        }
        if witnessCancels.current != 1 { failures.append("round \(round): witness cancels \(witnessCancels.current)") }
        withExtendedLifetime(keepAlive) {}
        keepAlive.removeAll()
        if let pipeEnds {
          close(pipeEnds.read)
          close(pipeEnds.write)
        }
        if failures.count > 5 { break }
      }
      return failures
    }
    #expect(failures == [])
  }

  /// Promise (InputSource, Shutdown): a cancel routine runs exactly once, also when it runs the
  /// loop nested (during the shutdown's drain, or during an invalidation that races the
  /// shutdown from another thread); the nested run returns and the shutdown completes.
  @Test(arguments: [false, true])
  func nestedRunInACancelRoutineDuringShutdown(invalidateFirst: Bool) async throws {
    let failures = try await failuresOverRounds(40, budget: .seconds(4), "nested cancel vs shutdown") {
      round, failures in
      guard let loop = try? RunLoopThread(name: "cancel") else { return failures.append("no loop") }
      let nested = RunLoopMode("cn")
      let keep = LoopTimer(after: .seconds(3_600)) { _ in }
      loop.add(keep, to: nested)
      let cancels = AtomicCounter()
      let returned = AtomicCounter()
      let otherCancels = AtomicCounter()
      let other = InputSource(cancel: { _, _ in otherCancels.increment() }) { _ in }
      let source = InputSource(
        cancel: { _, loop in
          cancels.increment()
          loop.run(mode: nested, for: .milliseconds(50))
          returned.increment()
        }
      ) { _ in }
      loop.add(source, to: .common)
      loop.add(other, to: .common)
      loop.add(other, to: nested)
      if invalidateFirst {
        race([{ source.invalidate() }, { loop.shutdownAndWait() }])
      } else {
        loop.shutdownAndWait()
      }
      if cancels.current != 1 || returned.current != 1 {
        failures.append("round \(round): cancels \(cancels.current), returned \(returned.current)")
      }
      if otherCancels.current != 1 { failures.append("round \(round): other cancels \(otherCancels.current)") }
      withExtendedLifetime(keep) {}
    }
    #expect(failures == [])
  }

  /// A source whose handler removes it from the mode it is also in and runs that mode nested:
  /// it does not fire there (it left), and a signal it sent itself fires once, back in the outer
  /// mode.
  @Test func aSourceRemovedFromANestedModeInsideItsHandlerDoesNotFireThere() async throws {
    let thread = CommandedCurrentLoopThread()
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

  /// A descriptor in `.default` only becomes readable during a nested run of another mode: it
  /// does not fire in the nested run, and fires once the outer run resumes.
  @Test func readinessDuringANestedRunInAnotherModeIsDeliveredAfterIt() async throws {
    let thread = CommandedCurrentLoopThread()
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
}
