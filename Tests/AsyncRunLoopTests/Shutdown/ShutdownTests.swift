import Dispatch
import Glibc
import Testing

@_spi(Testing) @testable import AsyncRunLoop

@Suite("Shutdown: nothing lost, nothing hangs, nothing leaks", .timeLimit(.minutes(5)))
struct ShutdownTests {
  @Test func shutdownWithJobsInFlightRunsEveryJob() async throws {
    let loop = try RunLoopThread(name: "sd-inflight")
    let counter = try ExecCounter(loop: loop)
    let perTask = 5_000 * stressFactor
    let total = try await withWatchdog(timeout: .seconds(120), "calls around a shutdown") {
      await execConcurrently(tasks: 4, times: perTask) {
        await counter.incrementChecked()
      } alongside: {
        // Shut down from another thread while the callers are still sending.
        while counter.progress.withLock({ $0 }) < perTask { usleep(50) }
        loop.shutdownAndWait()
      }
      return await counter.count
    }
    #expect(total == 4 * perTask)
    #expect(loop.isShutDown)
  }

  @Test func shutdownAfterStopRunsEveryAcceptedJob() async throws {
    let loop = try RunLoopThread(name: "sd-stop")
    let counter = try ExecCounter(loop: loop)
    loop.stop()
    let calls = 2_000 * stressFactor
    let total = try await withWatchdog(timeout: .seconds(60), "calls after stop") {
      await withTaskGroup(of: Void.self) { group in
        for _ in 0..<2 {
          group.addTask {
            for call in 0..<calls {
              if call == calls / 2 { loop.stop() }
              await counter.incrementChecked()
            }
          }
        }
        group.addTask {
          await execOnNewThread {
            while counter.progress.withLock({ $0 }) < calls / 2 { usleep(50) }
            loop.stop()
            loop.shutdownAndWait()
          }
        }
      }
      return await counter.count
    }
    #expect(total == 2 * calls)
  }

  @Test func shutdownFromInsideAJobRunsEveryJob() async throws {
    let loop = try RunLoopThread(name: "sd-inside")
    let counter = try ExecCounter(loop: loop)
    let perTask = 2_000 * stressFactor
    let total = try await withWatchdog(timeout: .seconds(60), "calls around a shutdown from a job") {
      await execConcurrently(tasks: 4, times: perTask) { await counter.incrementShuttingDown(at: perTask) }
      return await counter.count
    }
    #expect(total == 4 * perTask)
    #expect(loop.isShutDown)
    await execShutdown(loop)  // joins the thread (the call inside the job could not)
  }

  /// A sleep pending at shutdown never returns early: `loop.clock` sleeps throw
  /// CancellationError, and a `Task.sleep` under the loop's preference (whose job is the
  /// runtime's, which cannot throw) completes at its deadline, elsewhere.
  @Test func tasksSleepingOnTheLoopEndWhenItShutsDownNeverEarly() async throws {
    let loop = try RunLoopThread(name: "sd-sleepers")
    let counter = try ExecCounter(loop: loop)
    let scheduledBefore = loop.scheduledJobCount
    let outcome = try await withWatchdog(timeout: .seconds(60), "sleepers after shutdown") {
      async let clockSleep: Bool = {
        do {
          try await loop.clock.sleep(for: .seconds(3_600))
          return false
        } catch {
          return error is CancellationError
        }
      }()
      async let actorSleep: Bool = {
        do {
          _ = try await counter.sleepOnLoopClock(for: .seconds(3_600))
          return false
        } catch {
          return error is CancellationError
        }
      }()
      let taskSleepStart = ContinuousClock.now
      async let taskSleep: Duration = withTaskExecutorPreference(loop) {
        try? await Task.sleep(for: .seconds(1))  // its timer is invalidated: it waits elsewhere
        return ContinuousClock.now - taskSleepStart
      }
      // Shut down once the task's sleep reached the loop (the other two are indifferent: a sleep
      // that starts after the shutdown ends at once).
      await execOnNewThread {
        while loop.scheduledJobCount == scheduledBefore { usleep(100) }
        usleep(2_000)
        loop.shutdownAndWait()
      }
      let slept = await taskSleep
      return await (clockSleep, actorSleep, slept)
    }
    #expect(outcome?.0 == true)  // CancellationError, not a hang and not a normal return
    #expect(outcome?.1 == true)
    #expect(outcome.map { $0.2 >= .seconds(1) } == true, "a sleep must never end before its deadline")
  }

  @Test func everyKindOfSequenceConsumerEndsWhenTheLoopShutsDown() async throws {
    let loop = try RunLoopThread(name: "sd-sequences")
    let descriptors = makePipe()
    defer {
      close(descriptors.read)
      close(descriptors.write)
    }
    let repeating = loop.timer(every: .seconds(3_600))
    let oneShot = loop.timer(after: .seconds(3_600))
    let signals = loop.signalSequence()
    let elements = loop.sourceSequence(of: Int.self)
    let readiness = try loop.readiness(of: descriptors.read)
    let activities = loop.activities([.entry, .exit], modes: ["sd-never-run"])
    let ended = Locked<Set<String>>([])
    let consumers = try await withWatchdog(timeout: .seconds(60), "sequence consumers after shutdown") {
      await withTaskGroup(of: Void.self) { group in
        group.addTask { await Self.consume(repeating, thenRecord: "timer(every:)", in: ended) }
        group.addTask { await Self.consume(oneShot, thenRecord: "timer(after:)", in: ended) }
        group.addTask { await Self.consume(signals, thenRecord: "signalSequence", in: ended) }
        group.addTask { await Self.consume(elements, thenRecord: "sourceSequence", in: ended) }
        group.addTask { await Self.consume(readiness, thenRecord: "readiness", in: ended) }
        group.addTask { await Self.consume(activities, thenRecord: "activities", in: ended) }
        group.addTask {
          await execOnNewThread {
            usleep(5_000)  // let the consumers start waiting
            loop.shutdownAndWait()
          }
        }
      }
      return ended.withLock { $0 }
    }
    #expect(
      consumers == ["timer(every:)", "timer(after:)", "signalSequence", "sourceSequence", "readiness", "activities"])
  }

  /// Iterates `sequence` until it ends, then inserts `name` into `ended`.
  private static func consume<Sequence: AsyncSequence & Sendable>(
    _ sequence: Sequence, thenRecord name: String, in ended: Locked<Set<String>>
  ) async where Sequence.Failure == Never {
    for await _ in sequence {}
    ended.withLock { _ = $0.insert(name) }
  }

  @Test func sequencesMadeOnADeadLoopEndAtOnce() async throws {
    let loop = try RunLoopThread(name: "sd-dead-sequences")
    await execShutdown(loop)
    let ended = try await withWatchdog(timeout: .seconds(30), "sequences of a dead loop") {
      for await _ in loop.timer(every: .seconds(3_600)) {}
      for await _ in loop.signalSequence() {}
      for await _ in loop.sourceSequence(of: Int.self) {}
      do {
        try await loop.clock.sleep(for: .seconds(3_600))
        return "slept"
      } catch {
        return error is CancellationError ? "cancelled" : "\(error)"
      }
    }
    #expect(ended == "cancelled")
  }

  @Test func pendingMembersAreInvalidatedAndReleasedByShutdown() async throws {
    let loop = try RunLoopThread(name: "sd-release")
    let descriptors = makePipe()
    defer {
      close(descriptors.read)
      close(descriptors.write)
    }
    let cancels = Locked(0)
    let flags = try Self.addCanaries(to: loop, descriptor: descriptors.read, cancels: cancels)
    _ = try loop.performAndWait { 0 }  // every add has reached the loop
    #expect(flags.allSatisfy { !$0.withLock { $0 } })
    await execShutdown(loop)
    for (index, flag) in flags.enumerated() {
      #expect(flag.withLock { $0 }, "closure \(index) still holds its canary after shutdownAndWait")
    }
    #expect(cancels.withLock { $0 } == 1)  // the custom source's cancel ran exactly once
  }

  /// Adds a timer, a repeating timer, a custom source, a readiness source and an observer whose
  /// closures each capture a canary; keeps no reference to any of them.
  private static func addCanaries(
    to loop: RunLoopThread, descriptor: Int32, cancels: Locked<Int>
  ) throws -> [Locked<Bool>] {
    let flags = (0..<5).map { _ in Locked(false) }
    do {
      let canary = ExecCanary(flags[0])
      loop.add(LoopTimer(after: .seconds(3_600)) { _ in _ = canary })
    }
    do {
      let canary = ExecCanary(flags[1])
      loop.add(LoopTimer(after: .seconds(3_600), repeatingEvery: .seconds(1)) { _ in _ = canary }, to: .common)
    }
    do {
      let canary = ExecCanary(flags[2])
      let source = InputSource(
        cancel: { _, _ in cancels.withLock { $0 += 1 } },
        perform: { _ in _ = canary })
      loop.add(source)
      loop.add(source, to: "sd-other-mode")
    }
    do {
      let canary = ExecCanary(flags[3])
      try loop.add(DescriptorSource(descriptor: descriptor) { _, _ in _ = canary })
    }
    do {
      let canary = ExecCanary(flags[4])
      loop.add(LoopObserver(activities: .exit) { _, _ in _ = canary })
    }
    return flags
  }

  @Test func jobsAfterShutdownRunOnTheFallbackStillIsolated() async throws {
    let loop = try RunLoopThread(name: "sd-fallback")
    let counter = try ExecCounter(loop: loop)
    await counter.incrementChecked()
    await execShutdown(loop)
    let calls = 500 * stressFactor
    let total = try await withWatchdog(timeout: .seconds(60), "calls after shutdown") {
      await execConcurrently(tasks: 4, times: calls) { await counter.incrementChecked() }  // checkIsolated passes there
      return await counter.count
    }
    #expect(total == 1 + 4 * calls)
    let preferred = try await withWatchdog(timeout: .seconds(30), "a task preferring a dead loop") {
      await withTaskExecutorPreference(loop) { 7 }
    }
    #expect(preferred == 7)
    #expect(loop.isIsolatingCurrentContext() == false)  // not on this (test) thread
  }

  @Test func performAfterShutdownIsRefused() async throws {
    let loop = try RunLoopThread(name: "sd-refuse")
    await execShutdown(loop)
    let ran = Locked(false)
    #expect(!loop.perform { ran.withLock { $0 = true } })
    #expect(throws: RunLoopError.shutDown(loop: "sd-refuse")) { try loop.performAndWait { 1 } }
    #expect(!ran.withLock { $0 })
    // Adding members to a dead loop is silently ignored.
    loop.add(LoopTimer(after: .zero) { _ in ran.withLock { $0 = true } })
    loop.add(InputSource { _ in ran.withLock { $0 = true } })
    loop.wakeUp()
    loop.stop()
    usleep(2_000)
    #expect(!ran.withLock { $0 })
  }

  /// In a child process, so that no other test's threads or descriptors change the counts.
  @Test func thousandLoopsCreatedAndShutDownOneAtATimeLeakNothing() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      ShutdownLeakCheck.run(concurrency: 1)
    }
    if let result, !result.standardErrorContent.isEmpty {
      Issue.record("child reported: \(String(decoding: result.standardErrorContent, as: UTF8.self))")
    }
  }

  @Test func thousandLoopsCreatedAndShutDownSixteenAtATimeLeakNothing() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      ShutdownLeakCheck.run(concurrency: 16)
    }
    if let result, !result.standardErrorContent.isEmpty {
      Issue.record("child reported: \(String(decoding: result.standardErrorContent, as: UTF8.self))")
    }
  }
}

/// Creates and shuts down 1,000 loops (`concurrency` at a time, each thread doing its share) and
/// exits with status 1 and a message on stderr if descriptors or threads did not come back to
/// where they were. Runs in an exit test's child process.
enum ShutdownLeakCheck {
  static func run(concurrency: Int) {
    // Warm up whatever the first loop creates lazily.
    Self.churn(loops: 2)
    let descriptors = openDescriptorCount()
    // Count only the loops' own threads (named "leak"): the test runtime may start pool threads
    // of its own at any time, which would make the process-wide count drift under load.
    let threads = threadCount(named: "leak")
    let total = 1_000 * stressFactor
    let share = (total + concurrency - 1) / concurrency
    let workers = (0..<concurrency).map { _ in ExecThread { Self.churn(loops: share) } }
    workers.forEach { $0.join() }
    // Detached threads and released loops may take a moment to vanish. A leak means more
    // descriptors than before (the test runtime may close one of its own meanwhile).
    let deadline = LoopClock.Instant.now.advanced(by: .seconds(20))
    while openDescriptorCount() > descriptors || threadCount(named: "leak") > threads {
      if LoopClock.Instant.now > deadline {
        let message =
          "after \(share * concurrency) loops: descriptors \(descriptors) -> \(openDescriptorCount()), "
          + "loop threads \(threads) -> \(threadCount(named: "leak"))\n"
        execWriteStandardError(message)
        exit(1)
      }
      usleep(1_000)
    }
  }

  private static func churn(loops: Int) {
    for index in 0..<loops {
      do {
        let loop = try RunLoopThread(name: "leak")
        if index % 2 == 0 { _ = try loop.performAndWait { index } }
        loop.shutdownAndWait()
      } catch {
        execWriteStandardError("loop \(index): \(error)\n")
        exit(1)
      }
    }
  }
}

/// Writes `text` to the standard error descriptor (the `stderr` global is not concurrency-safe).
func execWriteStandardError(_ text: String) {
  var bytes = Array(text.utf8)
  _ = write(2, &bytes, bytes.count)
}
