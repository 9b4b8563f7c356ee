import CTestChildProcess
import Glibc
import Testing

@testable import AsyncRunLoop

// Regression tests for known defects of the loop core, written against the public API only.
// Tests whose defect crashes the process run their body in an exit test (a child process), so
// that the rest of the run survives; each child arms `alarm` so that a hang in it ends it too.

// MARK: - Child-process helpers

/// Ends an exit test's child process with status 1, printing `message` to its standard error and
/// recording it as an issue (the child forwards issues to the parent test when it can).
func childFail(_ message: String, sourceLocation: SourceLocation = #_sourceLocation) -> Never {
  Issue.record(Comment(rawValue: message), sourceLocation: sourceLocation)
  let text = "CHILD FAIL: \(message)\n"
  _ = text.utf8CString.withUnsafeBufferPointer { write(2, $0.baseAddress, $0.count - 1) }
  exit(1)
}

/// Kills an exit test's child with SIGALRM (a failure) if it is still running `seconds` (times
/// `watchdogScale`) from now. (Fires even in a process started with SIGALRM blocked, as a child
/// of a pool thread is.)
func armChildAlarm(_ seconds: UInt32 = 30) {
  carl_test_arm_alarm(seconds)
}

/// Polls `condition` every millisecond for at most `timeout`; returns whether it became true.
/// (Records nothing: for child processes and for tests that report the failure themselves.)
func poll(timeout: Duration = .seconds(10), _ condition: () -> Bool) -> Bool {
  let deadline = ContinuousClock.now.advanced(by: timeout)
  while !condition() {
    if ContinuousClock.now >= deadline { return false }
    usleep(1000)
  }
  return true
}

// MARK: - Fixtures

/// `poll` for async tests: sleeps between looks instead of blocking a pool thread (blocked pool
/// threads starve the very tasks a test waits for on a 2-core machine).
func pollAsync(timeout: Duration = .seconds(20), _ condition: () -> Bool) async -> Bool {
  let deadline = ContinuousClock.now.advanced(by: timeout)
  while !condition() {
    if ContinuousClock.now >= deadline { return false }
    try? await Task.sleep(for: .milliseconds(2))
  }
  return true
}

/// An actor pinned to a loop whose method runs the loop nested (a modal run from a job), and
/// which records whether any other of its jobs ran while that job was on the stack.
actor ModalActor: LoopActor {
  nonisolated let loop: RunLoopThread
  private var inJob = false
  private var overlaps = 0
  private var otherCalls = 0

  init(loop: RunLoopThread) { self.loop = loop }

  /// Runs the loop nested in mode "modal", which holds one timer, for `duration`; first starts
  /// `extraCalls` calls of `other()` on this actor (their jobs are enqueued on the loop at once)
  /// and has the timer's callout start `extraCalls` more from outside. Returns the timer's fires.
  func runModal(for duration: Duration, extraCalls: Int) -> Int {
    inJob = true
    defer { inJob = false }
    for _ in 0..<extraCalls { Task { self.other() } }
    let fired = AtomicCounter()
    let timer = LoopTimer(after: .milliseconds(1)) { [self] _ in
      if fired.increment() == 1 {
        for _ in 0..<extraCalls { Task.detached { await self.other() } }
      }
    }
    loop.add(timer, to: "modal")
    loop.run(mode: "modal", for: duration)
    timer.invalidate()
    return fired.current
  }

  func other() {
    if inJob { overlaps += 1 }
    otherCalls += 1
  }

  func counts() -> (overlaps: Int, otherCalls: Int) { (overlaps, otherCalls) }
}

/// An actor whose method stops the innermost run of its loop after counting the call.
actor StoppingProbe: LoopActor {
  nonisolated let loop: RunLoopThread
  init(loop: RunLoopThread) { self.loop = loop }
  /// Counts in `ran` whether `nested` was set when the job ran, then stops the innermost run.
  func touch(nested: AtomicCounter, ran: AtomicCounter) {
    if nested.current == 1 { ran.increment() }
    loop.stop()
  }
}

/// Loop thread, inside a callout that is not an executor job: starts a job on the loop (an actor
/// call from another thread) and runs the loop nested until the job has run (it stops the nested
/// run) or 5 s passed. Returns whether the job ran during the nested run.
func nestedRunRunsAJob(on loop: RunLoopThread) -> Bool {
  let probe = StoppingProbe(loop: loop)
  let ran = AtomicCounter()
  let nested = AtomicCounter()  // 1 while the nested run runs
  let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
  loop.add(keepAlive, to: "nested-jobs")
  // Preferring the loop, the task's first job goes straight to the loop (no pool thread needed).
  Task(executorPreference: loop) { await probe.touch(nested: nested, ran: ran) }
  nested.increment()
  let deadline = LoopClock.Instant.now.advanced(by: .seconds(5))
  while ran.current == 0 && LoopClock.Instant.now < deadline {
    loop.run(mode: "nested-jobs", until: deadline)
  }
  let result = ran.current == 1
  nested.value.store(0, ordering: .sequentiallyConsistent)
  keepAlive.invalidate()
  return result
}

/// A clock whose `Duration` is not `Swift.Duration`: milliseconds of the monotonic clock.
struct MillisecondClock: Clock {
  struct Millis: DurationProtocol, Hashable {
    var value: Int64
    static var zero: Millis { Millis(value: 0) }
    static func + (lhs: Millis, rhs: Millis) -> Millis { Millis(value: lhs.value + rhs.value) }
    static func - (lhs: Millis, rhs: Millis) -> Millis { Millis(value: lhs.value - rhs.value) }
    static func / (lhs: Millis, rhs: Int) -> Millis { Millis(value: lhs.value / Int64(rhs)) }
    static func * (lhs: Millis, rhs: Int) -> Millis { Millis(value: lhs.value * Int64(rhs)) }
    static func / (lhs: Millis, rhs: Millis) -> Double { Double(lhs.value) / Double(rhs.value) }
    static func < (lhs: Millis, rhs: Millis) -> Bool { lhs.value < rhs.value }
  }

  struct Instant: InstantProtocol {
    var milliseconds: Int64
    func advanced(by duration: Millis) -> Instant { Instant(milliseconds: milliseconds + duration.value) }
    func duration(to other: Instant) -> Millis { Millis(value: other.milliseconds - milliseconds) }
    static func < (lhs: Instant, rhs: Instant) -> Bool { lhs.milliseconds < rhs.milliseconds }
  }

  var now: Instant { Instant(milliseconds: LoopClock.Instant.now.nanoseconds / 1_000_000) }
  var minimumResolution: Millis { Millis(value: 1) }

  func sleep(until deadline: Instant, tolerance: Millis?) async throws {
    let remaining = now.duration(to: deadline).value
    if remaining > 0 { try await Task.sleep(for: .milliseconds(remaining)) }
  }
}

// MARK: - Tests

@Suite("Core regressions: known defects of the loop core")
struct CoreRegressionTests {
  // MARK: 1, 2 — nested runs and the serial contract

  @Test func nestedRunFromAnActorJobFiresTheModesTimer() async {
    await #expect(processExitsWith: .success) {
      armChildAlarm()
      let loop = try RunLoopThread(name: "nest-actor")
      let actor = ModalActor(loop: loop)
      let fired = await actor.runModal(for: .milliseconds(20), extraCalls: 0)
      if fired < 1 { childFail("the nested run fired the mode's timer \(fired) times") }
      loop.shutdownAndWait()
    }
  }

  @Test func otherJobsOfTheActorDoNotRunInsideANestedRunOfOneOfItsJobs() async {
    await #expect(processExitsWith: .success) {
      armChildAlarm()
      let loop = try RunLoopThread(name: "nest-serial")
      let actor = ModalActor(loop: loop)
      // Calls enqueued before the modal job starts, too.
      let early = (0..<5).map { _ in Task.detached { await actor.other() } }
      let fired = await actor.runModal(for: .milliseconds(50), extraCalls: 5)
      for task in early { await task.value }
      var counts = await actor.counts()
      for _ in 0..<2000 where counts.otherCalls < 15 {
        try await Task.sleep(for: .milliseconds(5))
        counts = await actor.counts()
      }
      if counts.otherCalls != 15 { childFail("only \(counts.otherCalls) of 15 other calls ran") }
      if counts.overlaps != 0 { childFail("\(counts.overlaps) other jobs ran inside the modal job") }
      if fired < 1 { childFail("the nested run did not fire its timer") }
      loop.shutdownAndWait()
    }
  }

  @Test func nestedRunInAPerformedBlockRunsJobs() async throws {
    let loop = try RunLoopThread(name: "nest-block")
    let result = Guarded<Bool?>(nil)
    loop.perform { result.withLock { $0 = nestedRunRunsAJob(on: loop) } }
    #expect(await pollAsync { result.snapshot != nil }, "the nested run did not end")
    #expect(result.snapshot == true, "the job did not run during the nested run of a performed block")
    loop.shutdown()
  }

  @Test func nestedRunInATimerCalloutRunsJobs() async throws {
    let loop = try RunLoopThread(name: "nest-timer")
    let result = Guarded<Bool?>(nil)
    loop.add(LoopTimer(after: .milliseconds(1)) { _ in result.withLock { $0 = nestedRunRunsAJob(on: loop) } })
    #expect(await pollAsync { result.snapshot != nil }, "the nested run did not end")
    #expect(result.snapshot == true, "the job did not run during the nested run of a timer callout")
    loop.shutdown()
  }

  @Test func nestedRunInASourceHandlerRunsJobs() async throws {
    let loop = try RunLoopThread(name: "nest-source")
    let result = Guarded<Bool?>(nil)
    let command = CommandSource<Int> { _ in result.withLock { $0 = nestedRunRunsAJob(on: loop) } }
    loop.add(command.source)
    #expect(command.post(1))
    #expect(await pollAsync { result.snapshot != nil }, "the nested run did not end")
    #expect(result.snapshot == true, "the job did not run during the nested run of a source handler")
    command.source.invalidate()
    loop.shutdown()
  }

  @Test func nestedRunInAnObserverCalloutRunsJobs() async throws {
    let loop = try RunLoopThread(name: "nest-observer")
    let result = Guarded<Bool?>(nil)
    let observer = LoopObserver(activities: .beforeWaiting, repeats: false) { _, _ in
      result.withLock { $0 = nestedRunRunsAJob(on: loop) }
    }
    loop.add(observer)
    loop.wakeUp()
    #expect(await pollAsync { result.snapshot != nil }, "the nested run did not end")
    #expect(result.snapshot == true, "the job did not run during the nested run of an observer callout")
    loop.shutdown()
  }

  // MARK: 3 — no data loss when a CommandSource races shutdown, invalidate and removal

  enum CommandRace: String, CaseIterable, Sendable {
    case invalidateVersusShutdown, postVersusShutdown, removeVersusShutdown, invalidateVersusRemove
    case dropVersusShutdown
  }

  @Test(arguments: CommandRace.allCases)
  func everyAcceptedPostIsDeliveredOnceAndCancelRunsOnceWhenACommandSourceRaces(_ kind: CommandRace) async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(60), "\(kind) rounds") {
      try Self.raceCommandSource(kind, rounds: 2_000 * stressFactor)
    }
    guard let outcome else { return }
    #expect(outcome.rounds > 0)
    #expect(outcome.failures.isEmpty, "\(outcome.failureCount) of \(outcome.rounds) rounds: \(outcome.failures)")
  }

  struct RaceOutcome: Sendable {
    var rounds = 0
    var failureCount = 0
    var failures: [String] = []
    mutating func fail(_ message: String) {
      failureCount += 1
      if failures.count < 5 { failures.append(message) }
    }
  }

  static func raceCommandSource(_ kind: CommandRace, rounds: Int) throws -> RaceOutcome {
    var outcome = RaceOutcome()
    outcome.rounds = try repeatRounds(rounds) { round in
      let loop = try RunLoopThread(name: "race-cmd")
      let delivered = AtomicCounter()
      let cancels = AtomicCounter()
      let accepted = AtomicCounter()
      let holder = Guarded<CommandSource<Int>?>(
        CommandSource<Int>(cancel: { _, _ in cancels.increment() }) { _ in delivered.increment() })
      let source = holder.snapshot!.source
      loop.add(source)
      let post: @Sendable (Int) -> Void = { count in
        guard let command = holder.snapshot else { return }
        for value in 0..<count where command.post(value) { accepted.increment() }
      }
      post(3)
      if round % 2 == 0 { _ = try? loop.performAndWait { 0 } }  // half the rounds: surely scheduled
      switch kind {
      case .invalidateVersusShutdown:
        race([{ source.invalidate() }, { loop.shutdown() }, { post(10) }])
      case .postVersusShutdown:
        race([{ post(20) }, { loop.shutdown() }])
      case .removeVersusShutdown:
        race([{ loop.remove(source, from: .default) }, { loop.shutdown() }, { post(10) }])
      case .invalidateVersusRemove:
        race([{ source.invalidate() }, { loop.remove(source, from: .default) }, { post(10) }])
      case .dropVersusShutdown:
        // The racing thread posts, then drops the last reference to the CommandSource.
        race([
          {
            let command = holder.withLock { held in
              defer { held = nil }
              return held
            }
            for value in 0..<10 where command?.post(value) == true { accepted.increment() }
          },
          { loop.shutdown() },
        ])
      }
      loop.shutdownAndWait()
      let pending = holder.snapshot?.pendingCount ?? 0
      let stillValid = source.isValid
      if cancels.current != 1 { outcome.fail("round \(round): cancel ran \(cancels.current) times") }
      if stillValid {
        // Removal won: the source left its loop before the shutdown and is not invalid; what it
        // accepted since is still buffered, not lost.
        if delivered.current + pending != accepted.current {
          outcome.fail(
            "round \(round): \(accepted.current) accepted, \(delivered.current) delivered, \(pending) pending")
        }
      } else if delivered.current != accepted.current {
        outcome.fail("round \(round): \(accepted.current) accepted, \(delivered.current) delivered")
      }
      holder.withLock { $0 = nil }
    }
    return outcome
  }

  // MARK: 4 — an observer on two loops traps

  @Test func addingAnObserverToASecondLoopTrapsWithAClearMessage() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      armChildAlarm()
      let first = try RunLoopThread(name: "obs-two-a")
      let second = try RunLoopThread(name: "obs-two-b")
      let observer = LoopObserver(activities: .all) { _, _ in }
      first.add(observer)
      _ = try first.performAndWait { 0 }
      second.add(observer)
      _ = try second.performAndWait { 0 }
      for _ in 0..<100 {
        first.wakeUp()
        second.wakeUp()
        usleep(1000)
      }
      // Still alive: the second add was accepted silently. Exit 0 so the test reports it.
      exit(0)
    }
    expectStandardError(of: result, mentions: "one loop")
  }

  // MARK: 5 — invalidate never blocks by default

  @Test func timersOfTwoLoopsInvalidatingEachOtherNeverDeadlock() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(60), "cross-invalidating timers") {
      () throws -> (rounds: Int, hungRound: Int?) in
      let a = try RunLoopThread(name: "xinv-a")
      let b = try RunLoopThread(name: "xinv-b")
      var hungRound: Int?
      let rounds = repeatRounds(300 * stressFactor) { round in
        guard hungRound == nil else { return }
        let timerA = Guarded<LoopTimer?>(nil)
        let timerB = Guarded<LoopTimer?>(nil)
        let inCallout = AtomicCounter()
        let date = LoopClock.Instant.now.advanced(by: .milliseconds(2))
        let ta = LoopTimer(fireAt: date) { _ in
          inCallout.increment()
          timerB.snapshot?.invalidate()
          inCallout.value.subtract(1, ordering: .sequentiallyConsistent)
        }
        let tb = LoopTimer(fireAt: date) { _ in
          inCallout.increment()
          timerA.snapshot?.invalidate()
          inCallout.value.subtract(1, ordering: .sequentiallyConsistent)
        }
        timerA.withLock { $0 = ta }
        timerB.withLock { $0 = tb }
        a.add(ta)
        b.add(tb)
        let settled = poll(timeout: .seconds(10)) { !ta.isValid && !tb.isValid && inCallout.current == 0 }
        if !settled { hungRound = round }
      }
      if hungRound == nil {
        a.shutdownAndWait()
        b.shutdownAndWait()
      } else {
        a.shutdown()  // deadlocked: do not wait for them
        b.shutdown()
      }
      return (rounds, hungRound)
    }
    guard let outcome else { return }
    #expect(outcome.hungRound == nil, "the two loops deadlocked in round \(outcome.hungRound ?? -1)")
  }

  // MARK: 6 — a sleeper is never woken early by shutdown

  @Test func taskSleepUnderTheLoopsPreferenceDoesNotReturnEarlyWhenTheLoopShutsDown() async throws {
    let loop = try RunLoopThread(name: "sleep-shutdown")
    let start = ContinuousClock.now
    let sleeper = Task {
      try await withTaskExecutorPreference(loop) { try await Task.sleep(for: .seconds(2)) }
    }
    try await Task.sleep(for: .milliseconds(100))
    loop.shutdown()
    let outcome = try await withWatchdog(timeout: .seconds(30), "the sleeper") { await sleeper.result }
    expectNotEarly(outcome, since: start, deadline: .seconds(2))
  }

  @Test func loopClockSleepDoesNotReturnEarlyWhenTheLoopShutsDown() async throws {
    let loop = try RunLoopThread(name: "clock-shutdown")
    let start = ContinuousClock.now
    let sleeper = Task { try await loop.clock.sleep(until: .now.advanced(by: .seconds(2))) }
    try await Task.sleep(for: .milliseconds(100))
    loop.shutdown()
    let outcome = try await withWatchdog(timeout: .seconds(30), "the sleeper") { await sleeper.result }
    expectNotEarly(outcome, since: start, deadline: .seconds(2))
  }

  private func expectNotEarly(
    _ outcome: Result<Void, any Error>?, since start: ContinuousClock.Instant, deadline: Duration,
    sourceLocation: SourceLocation = #_sourceLocation
  ) {
    switch outcome {
    case nil:
      break  // the watchdog recorded the hang
    case .success:
      let elapsed = ContinuousClock.now - start
      #expect(elapsed >= deadline, "the sleep returned normally after \(elapsed)", sourceLocation: sourceLocation)
    case .failure(let error):
      #expect(error is CancellationError, "the sleep threw \(error)", sourceLocation: sourceLocation)
    }
  }

  // MARK: 7 — a member removed from one loop can be added to another

  @Test func timerMovedOnTheFirstLoopsThreadFiresOnTheSecondLoop() async {
    await #expect(processExitsWith: .success) { try moveMemberScenario("timer", onLoopThread: true) }
  }

  @Test func timerMovedFromAThirdThreadFiresOnTheSecondLoop() async {
    await #expect(processExitsWith: .success) { try moveMemberScenario("timer", onLoopThread: false) }
  }

  @Test func inputSourceMovedOnTheFirstLoopsThreadFiresOnTheSecondLoop() async {
    await #expect(processExitsWith: .success) { try moveMemberScenario("input", onLoopThread: true) }
  }

  @Test func inputSourceMovedFromAThirdThreadFiresOnTheSecondLoop() async {
    await #expect(processExitsWith: .success) { try moveMemberScenario("input", onLoopThread: false) }
  }

  @Test func descriptorSourceMovedOnTheFirstLoopsThreadFiresOnTheSecondLoop() async {
    await #expect(processExitsWith: .success) { try moveMemberScenario("descriptor", onLoopThread: true) }
  }

  @Test func descriptorSourceMovedFromAThirdThreadFiresOnTheSecondLoop() async {
    await #expect(processExitsWith: .success) { try moveMemberScenario("descriptor", onLoopThread: false) }
  }

  @Test func observerMovedOnTheFirstLoopsThreadFiresOnTheSecondLoop() async {
    await #expect(processExitsWith: .success) { try moveMemberScenario("observer", onLoopThread: true) }
  }

  @Test func observerMovedFromAThirdThreadFiresOnTheSecondLoop() async {
    await #expect(processExitsWith: .success) { try moveMemberScenario("observer", onLoopThread: false) }
  }

  // MARK: 8 — dropped loops do not leak

  @Test func droppedLoopsGiveBackTheirThreadsAndDescriptors() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      armChildAlarm(90)
      let descriptors = openDescriptorCount()
      let pipe = makePipe()
      // 1,000 loops (the issue's count), all named alike so their threads can be counted: the
      // process's total thread count also moves with the runtime's own worker threads.
      for index in 0..<1_000 {
        let loop = try RunLoopThread(name: "dropped-loop")
        switch index % 4 {
        case 0: loop.add(LoopTimer(after: .seconds(3600)) { _ in })
        case 1: loop.add(InputSource { _ in })
        case 2: try loop.add(DescriptorSource(descriptor: pipe.read) { _, _ in })
        default: break
        }
      }
      let returned = poll(timeout: .seconds(30)) {
        // The pipe, plus a little slack for the runtime (libdispatch opens event descriptors of
        // its own lazily): a leak of 1,000 loops would be thousands.
        threadCount(named: "dropped-loop") == 0 && openDescriptorCount() <= descriptors + 2 + 3
      }
      if !returned {
        childFail(
          "loop threads left \(threadCount(named: "dropped-loop")), descriptors \(descriptors) -> "
            + "\(openDescriptorCount() - 2) (plus the test's pipe)")
      }
    }
    if let result, result.exitStatus != .exitCode(0) {
      Issue.record("the child said: \(String(decoding: result.standardErrorContent, as: UTF8.self))")
    }
  }

  @Test func anActorHoldingItsLoopKeepsItWorkingAfterTheCreatorDroppedIt() async throws {
    let result = try await withWatchdog(timeout: .seconds(30), "the actor's calls") { () async -> [Int] in
      let (counter, weakLoop) = Self.makeCounterOnADroppedLoop()
      var results: [Int] = []
      for _ in 0..<20 {
        results.append(await counter.bumpOnItsThread())
        try? await Task.sleep(for: .milliseconds(5))
      }
      results.append(await counter.fireATimer() ? 1 : 0)
      #expect(weakLoop.loop != nil, "the loop died although the actor holds it")
      return results
    }
    guard let result else { return }
    #expect(result == Array(1...20) + [1])
  }

  final class WeakLoop: Sendable {
    nonisolated(unsafe) weak var loop: RunLoopThread?
    init(_ loop: RunLoopThread) { self.loop = loop }
  }

  actor LoopCounter: LoopActor {
    nonisolated let loop: RunLoopThread
    var count = 0
    init(loop: RunLoopThread) { self.loop = loop }
    /// Counts on the loop's thread (0 when not on it).
    func bumpOnItsThread() -> Int {
      guard loop.isOnLoopThread else { return 0 }
      count += 1
      return count
    }
    func fireATimer() async -> Bool {
      await withCheckedContinuation { continuation in
        loop.add(LoopTimer(after: .milliseconds(1)) { _ in continuation.resume(returning: true) })
      }
    }
  }

  static func makeCounterOnADroppedLoop() -> (LoopCounter, WeakLoop) {
    let loop = RunLoopThread.start(named: "actor-holds")
    return (LoopCounter(loop: loop), WeakLoop(loop))
  }

  // MARK: Suspected a — registration changes apply in the order they were sent

  @Test func scheduleRoutinesRunInTheOrderTheSourcesWereAddedAlthoughOneRunsTheLoopNested() throws {
    let loop = try RunLoopThread(name: "ctl-order")
    let order = Guarded<[String]>([])
    let sendD = TestGate()
    let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
    loop.add(keepAlive, to: "ctl-nested")
    let sourceA = InputSource(schedule: { _, loop, _ in
      order.withLock { $0.append("A") }
      sendD.open()  // the test thread now adds D, after B and C
      loop.run(mode: "ctl-nested", for: .milliseconds(300))
    }) { _ in }
    let sources = ["B", "C", "D"].map { name in
      InputSource(schedule: { _, _, _ in order.withLock { $0.append(name) } }) { _ in }
    }
    // Hold the loop in a block so that A, B and C arrive in one batch.
    let release = TestGate()
    loop.perform { release.wait(timeout: .seconds(10)) }
    loop.add(sourceA)
    loop.add(sources[0])
    loop.add(sources[1])
    release.open()
    #expect(sendD.wait(timeout: .seconds(10)), "A's schedule routine did not run")
    loop.add(sources[2])
    waitUntil(timeout: .seconds(20), "four schedule routines") { order.snapshot.count == 4 }
    #expect(order.snapshot == ["A", "B", "C", "D"])
    loop.shutdownAndWait()
  }

  // MARK: Suspected c — a clock whose Duration is not Swift.Duration

  @Test func taskSleepWithACustomDurationClockUnderTheLoopsPreferenceDoesNotFireEarly() async throws {
    let loop = try RunLoopThread(name: "custom-clock")
    let clock = MillisecondClock()
    let start = ContinuousClock.now
    let outcome: Void? = try await withWatchdog(timeout: .seconds(30), "the custom-clock sleep") {
      try await withTaskExecutorPreference(loop) {
        try await Task.sleep(until: clock.now.advanced(by: .init(value: 500)), clock: clock)
      }
    }
    if outcome != nil {
      let elapsed = ContinuousClock.now - start
      #expect(elapsed >= .milliseconds(500), "the sleep returned after \(elapsed)")
    }
    loop.shutdownAndWait()
  }

  // MARK: Suspected d — a nested run inside a timer's callout, in another of its modes

  @Test func timerNeverFiresInsideItsOwnCalloutAndCanBeInvalidatedFromAnotherThread() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(60), "nested same-timer fires") {
      () throws -> [String] in
      var problems: [String] = []
      let loop = try RunLoopThread(name: "self-nest")
      for round in 0..<(20 * stressFactor) {
        let starts = AtomicCounter()
        let ends = AtomicCounter()
        let depth = AtomicCounter()
        let startsAfterInvalidate = AtomicCounter()
        let invalidated = AtomicCounter()
        let innerFired = TestGate()
        let nestedStarts = AtomicCounter()
        let timer = LoopTimer(after: .zero, repeatingEvery: .zero) { _ in
          starts.increment()
          if invalidated.current == 1 { startsAfterInvalidate.increment() }
          let level = depth.increment()
          if level > 1 { nestedStarts.increment() }
          if level == 1 {
            // Outer fire: run another of the timer's modes nested; it must not fire in here.
            let deadline = LoopClock.Instant.now.advanced(by: .milliseconds(200))
            while starts.current < 3 && LoopClock.Instant.now < deadline {
              loop.run(mode: "self-nest", for: .milliseconds(5))
            }
            innerFired.open()
            usleep(20_000)  // the other thread invalidates now
          }
          depth.value.subtract(1, ordering: .sequentiallyConsistent)
          ends.increment()
        }
        loop.add(timer, to: .default)
        loop.add(timer, to: "self-nest")
        if !innerFired.wait(timeout: .seconds(10)) {
          problems.append("round \(round): the outer callout never finished its nested run")
          break
        }
        timer.invalidate()
        invalidated.increment()
        if !poll(timeout: .seconds(10), { starts.current == ends.current }) {
          problems.append("round \(round): \(starts.current) callouts started, \(ends.current) ended")
          break
        }
        if startsAfterInvalidate.current != 0 {
          problems.append("round \(round): \(startsAfterInvalidate.current) callouts started after invalidate")
        }
        // As in CF, a timer never fires inside its own callout (a nested run in another of its
        // modes leaves it), so one callout of a timer runs at a time.
        if nestedStarts.current != 0 {
          problems.append("round \(round): the timer fired \(nestedStarts.current) times inside its own callout")
        }
      }
      loop.shutdownAndWait()
      return problems
    }
    guard let outcome else { return }
    #expect(outcome.isEmpty, "\(outcome)")
  }

  // MARK: Suspected e — work sent to a current loop whose thread exits

  @Test func workSentToACurrentLoopWhoseThreadExitsIsNotLost() throws {
    let performed = AtomicCounter()
    let accepted = AtomicCounter()
    let jobs = AtomicCounter()
    let published = Guarded<RunLoopThread?>(nil)
    let exitNow = TestGate()
    let ready = TestGate()
    let thread = startThread {
      let loop = RunLoopThread.current
      published.withLock { $0 = loop }
      for _ in 0..<10 where loop.perform({ performed.increment() }) { accepted.increment() }
      ready.open()
      exitNow.wait(timeout: .seconds(10))
      for _ in 0..<10 where loop.perform({ performed.increment() }) { accepted.increment() }
    }
    #expect(ready.wait(timeout: .seconds(10)))
    let loop = try #require(published.snapshot)
    for _ in 0..<10 {
      Task(executorPreference: loop) { jobs.increment() }
    }
    exitNow.open()
    joinThread(thread)
    for _ in 0..<10 {
      Task(executorPreference: loop) { jobs.increment() }  // after the thread exited
    }
    waitUntil(timeout: .seconds(20), "the jobs") { jobs.current == 20 }
    waitUntil(timeout: .seconds(20), "the accepted blocks") { performed.current == accepted.current }
    #expect(jobs.current == 20)
    #expect(performed.current == accepted.current, "\(accepted.current) blocks accepted, \(performed.current) ran")
  }
}

/// Item 7's scenario, run in an exit test's child: a member scheduled on loop A is removed from A
/// (not invalidated) and added to loop B, either inside `A.performAndWait` or from a third
/// thread with no wait in between; it must then fire on B.
func moveMemberScenario(_ kind: String, onLoopThread: Bool) throws {
  armChildAlarm()
  let a = try RunLoopThread(name: "move-a")
  let b = try RunLoopThread(name: "move-b")
  let firedOnB = AtomicCounter()
  let record: @Sendable () -> Void = { if b.isOnLoopThread { firedOnB.increment() } }
  let pipe = makePipe()
  let poke: @Sendable () -> Void
  let move: @Sendable () throws -> Void
  switch kind {
  case "timer":
    let timer = LoopTimer(after: .milliseconds(30), repeatingEvery: .milliseconds(5)) { _ in record() }
    a.add(timer)
    poke = {}
    move = {
      a.remove(timer, from: .default)
      b.add(timer, to: .default)
    }
  case "input":
    let source = InputSource { _ in record() }
    a.add(source)
    poke = { source.signal() }
    move = {
      a.remove(source, from: .default)
      b.add(source, to: .default)
    }
  case "descriptor":
    let source = DescriptorSource(descriptor: pipe.read) { source, _ in
      drainDescriptor(source.descriptor)
      record()
    }
    try a.add(source)
    poke = { writeByte(pipe.write) }
    move = {
      a.remove(source, from: .default)
      try b.add(source, to: .default)
    }
  default:
    let observer = LoopObserver(activities: .all) { _, _ in record() }
    a.add(observer)
    poke = { b.wakeUp() }
    move = {
      a.remove(observer, from: .default)
      b.add(observer, to: .default)
    }
  }
  _ = try a.performAndWait { 0 }  // scheduled on A now
  if onLoopThread {
    try a.performAndWait { try move() }
  } else {
    let failure = Guarded<String?>(nil)
    joinThread(
      startThread {
        do { try move() } catch { failure.withLock { $0 = "\(error)" } }
      })
    if let failure = failure.snapshot { childFail("the move threw \(failure)") }
  }
  let fired = poll(timeout: .seconds(10)) {
    poke()
    usleep(5000)
    return firedOnB.current > 0
  }
  if !fired { childFail("the \(kind) never fired on the second loop") }
  a.shutdownAndWait()
  b.shutdownAndWait()
}
