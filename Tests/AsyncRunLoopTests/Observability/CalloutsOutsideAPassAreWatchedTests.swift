import Glibc
import Testing

@_spi(ExperimentalScheduling) @testable import AsyncRunLoop

/// Work the loop runs outside a pass's work points goes through the same observability hook as
/// a pass's callouts (issue 27): a block the exit drain runs, and a job the loop runs from one of
/// its timers (a job scheduled for later on the loop's serial executor). Each is reported while
/// stuck and again when it ends, and counted by the metrics. Every wait is a hang guard only.
@Suite("Callouts outside a pass are watched")
struct CalloutsOutsideAPassAreWatchedTests {
  /// A mode the loop never runs: a block performed for it waits for the exit drain, which runs
  /// every waiting block whatever its modes.
  static let neverRun = RunLoopMode("callouts-never-run")

  /// A block only the drain runs blocks until the watcher has reported it: reported still
  /// running, then ended, as a performed block outside any run (nesting depth 0), and delivered
  /// before the watch ends with the loop.
  @Test func aBlockTheExitDrainRunsIsReportedWhileStuckThenEnded() async throws {
    let loop = try RunLoopThread(name: "drain-block-stall")
    let reported = TestGate()
    let arrived = TestGate()
    let watch = loop.watchStalls(threshold: .milliseconds(20)) { report in
      if case .stillRunning = report.phase { reported.open() }
    }
    try loop.performAndWait {}
    loop.perform(inModes: [Self.neverRun]) {
      arrived.open()
      _ = reported.wait(timeout: .seconds(20) * watchdogScale)
    }
    await execShutdown(loop)
    #expect(arrived.opened, "setup: the drain did not run the block")
    let delivered = try await withWatchdog("the drain block's reports") { () -> [StallReport] in
      var delivered: [StallReport] = []
      for await report in watch.reports { delivered.append(report) }
      return delivered
    }
    let all = delivered ?? []
    #expect(all.count == 2)
    #expect(all.first?.isStillRunning == true)
    #expect(all.last?.isStillRunning == false)
    #expect(all.allSatisfy { $0.kind == .performedBlock && $0.nestingDepth == 0 })
    #expect(Set(all.map(\.calloutNumber)).count == 1)
  }

  /// The drain's block is counted as a performed block, and its duration recorded.
  @Test func aBlockTheExitDrainRunsIsCounted() async throws {
    let loop = try RunLoopThread(name: "drain-block-count")
    loop.setMetricsEnabled(true)
    try loop.performAndWait {}
    let ran = TestGate()
    loop.perform(inModes: [Self.neverRun]) { ran.open() }
    try loop.performAndWait {}  // the block waits for its mode, not run by a pass
    let before = loop.metrics
    await execShutdown(loop)
    #expect(ran.opened, "setup: the drain did not run the block")
    let delta = loop.metrics - before  // readable after the loop ended
    #expect(delta.performedBlocks == 1)
    #expect(delta.calloutDuration.count >= 1)
  }

  /// A job the runtime scheduled for later on the loop's serial executor (the `.serial` branch
  /// of the scheduling timer, which runs it with `runAsJob`) blocks until the watcher has
  /// reported it: reported as a job, with its priority, still running and then ended. It runs
  /// inside the timer's callout, which is reported ended after it.
  @Test func aScheduledSerialJobIsReportedWhileStuckThenEnded() async throws {
    let loop = try RunLoopThread(name: "sched-job-stall")
    let reported = TestGate()
    let watch = loop.watchStalls(threshold: .milliseconds(20)) { report in
      if report.kind == .job, case .stillRunning = report.phase { reported.open() }
    }
    try loop.performAndWait {}
    let catcher = CaughtActor()
    let task = Task {
      await catcher.run { loop.isOnLoopThread && reported.wait(timeout: .seconds(20) * watchdogScale) }
    }
    guard let job = await execOnNewThread({ catcher.waitForJob() }) else {  // off the cooperative pool
      Issue.record("the runtime handed the catcher no job")
      return
    }
    loop.schedule(job, role: .serial, after: Duration.zero, tolerance: nil, clock: ContinuousClock())
    let ranStuck = try await withWatchdog("the scheduled job") { await task.value }
    #expect(ranStuck == true, "the job did not run on the loop's thread until reported")
    await execShutdown(loop)
    let delivered = try await withWatchdog("the scheduled job's reports") { () -> [StallReport] in
      var delivered: [StallReport] = []
      for await report in watch.reports { delivered.append(report) }
      return delivered
    }
    let all = delivered ?? []
    let jobReports = all.filter { $0.kind == .job }
    #expect(jobReports.count == 2)
    #expect(jobReports.first?.isStillRunning == true)
    #expect(jobReports.last?.isStillRunning == false)
    #expect(Set(jobReports.map(\.calloutNumber)).count == 1)
    #expect(jobReports.allSatisfy { $0.priority != nil && $0.nestingDepth == 1 })
    let timerReports = all.filter { $0.kind == .timer }
    #expect(timerReports.count == 1)
    #expect(timerReports.first?.isStillRunning == false)
  }

  /// The same job is counted as a job (and its timer as a timer).
  @Test func aScheduledSerialJobIsCountedAsAJob() async throws {
    let loop = try RunLoopThread(name: "sched-job-count")
    loop.setMetricsEnabled(true)
    try loop.performAndWait {}
    let before = loop.metrics
    let catcher = CaughtActor()
    let task = Task { await catcher.run { loop.isOnLoopThread } }
    guard let job = await execOnNewThread({ catcher.waitForJob() }) else {  // off the cooperative pool
      Issue.record("the runtime handed the catcher no job")
      return
    }
    loop.schedule(job, role: .serial, after: Duration.zero, tolerance: nil, clock: ContinuousClock())
    let ranOnLoop = try await withWatchdog("the scheduled job") { await task.value }
    #expect(ranOnLoop == true)
    try loop.performAndWait {}  // the job's callout ended before this block ran
    let delta = loop.metrics - before
    #expect(delta.jobs == 1)
    #expect(delta.timersFired == 1)
    await execShutdown(loop)
  }
}

extension StallReport {
  /// `.stillRunning`, rather than `.ended`.
  fileprivate var isStillRunning: Bool {
    switch phase {
    case .stillRunning: return true
    case .ended: return false
    }
  }
}

/// An actor whose jobs the runtime hands to an executor that keeps the first one and never runs
/// it: the test then gives that job (the actor's method, about to run) to the loop, as the runtime
/// gives the loop's serial executor a job of an actor pinned to the loop that it scheduled for
/// later.
actor CaughtActor {
  private let catcher = JobCatcher()

  nonisolated var unownedExecutor: UnownedSerialExecutor { catcher.asUnownedSerialExecutor() }

  /// Runs `body` isolated to the actor (on whichever thread runs the caught job).
  func run(_ body: @Sendable () -> Bool) -> Bool { body() }

  /// The first job of the actor, once the runtime has handed it over (nil after a generous hang
  /// guard).
  nonisolated func waitForJob() -> UnownedJob? { catcher.waitForJob() }
}

/// A serial executor that keeps the first job it is given and never runs it.
final class JobCatcher: SerialExecutor {
  private let caught = Guarded<UnownedJob?>(nil)
  private let arrived = TestGate()

  func enqueue(_ job: consuming ExecutorJob) {
    let job = UnownedJob(job)
    caught.withLock { $0 = $0 ?? job }
    arrived.open()
  }

  func waitForJob() -> UnownedJob? {
    guard arrived.wait(timeout: .seconds(20) * watchdogScale) else { return nil }
    return caught.snapshot
  }
}
