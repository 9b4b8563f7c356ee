import Testing

@testable import AsyncRunLoop

/// The loop's lifecycle as a plain value (`LoopLifecycle`): the same rules for the three kinds of
/// loop, the differences stated as inputs, and the one rule of isolation — the loop's jobs run in
/// one place at a time, and the loop's thread counts as isolated only while that place is it.
@Suite struct LoopLifecycleTests {
  static let kinds: [LoopLifecycle.Kind] = [.ownsThread, .current, .main]

  @Test(arguments: kinds)
  func anActiveLoopAcceptsEverythingAndItsThreadIsIsolated(kind: LoopLifecycle.Kind) {
    let life = LoopLifecycle(kind: kind)
    #expect(!life.isShutDown)
    #expect(life.jobRoute == .queue)
    #expect(life.acceptsBlocks)
    #expect(life.acceptsSignals)
    #expect(life.acceptsChange(isInvalidation: false, drainCapHasPassed: false))
    // (A current loop's thread only inside a run: see below.)
    #expect(life.loopThreadIsIsolated == (kind != .current))
  }

  /// A current loop's thread counts as isolated only inside a run: out of one, a shutdown from
  /// another thread may hand the jobs to the fallback at any instant. Shut down while the thread is
  /// in a run, the jobs stay (and the thread isolated) until the run ends; then both leave.
  @Test func aCurrentLoopsThreadIsIsolatedOnlyInsideARun() {
    var life = LoopLifecycle(kind: .current)
    let outOfRun = life.loopThreadIsIsolated
    life.setThreadIsInRun(true)
    let inRun = life.loopThreadIsIsolated
    _ = life.beginShutdown()
    let diverted = life.divertIfOutOfRun()
    let inRunAfterShutdown = life.loopThreadIsIsolated
    life.setThreadIsInRun(false)
    let afterRun = life.loopThreadIsIsolated
    let divertedAfterRun = life.divertIfOutOfRun()
    life.setThreadIsInRun(true)  // a run entered after the diversion
    let inLaterRun = life.loopThreadIsIsolated
    #expect(!outOfRun && inRun && inRunAfterShutdown)
    #expect(!diverted && divertedAfterRun)
    #expect(!afterRun && !inLaterRun)
  }

  /// The owned and the main loop's threads count as isolated whether or not they are in a run
  /// (they drain their loop themselves: the jobs leave only after their last callout), so the main
  /// thread stays isolated to the main loop outside `runMainLoop()` too.
  @Test(arguments: [LoopLifecycle.Kind.ownsThread, .main])
  func ownedAndMainLoopsThreadsAreIsolatedInAndOutOfRuns(kind: LoopLifecycle.Kind) {
    var life = LoopLifecycle(kind: kind)
    let outOfRun = life.loopThreadIsIsolated
    life.setThreadIsInRun(true)
    let inRun = life.loopThreadIsIsolated
    life.setThreadIsInRun(false)
    _ = life.beginShutdown()
    let shutDownOutOfRun = life.loopThreadIsIsolated
    #expect(outOfRun && inRun && shutDownOutOfRun)
  }

  @Test(arguments: kinds)
  func shutdownBeginsOnceRefusesBlocksAndStillQueuesJobs(kind: LoopLifecycle.Kind) {
    var life = LoopLifecycle(kind: kind)
    life.setThreadIsInRun(true)  // a current loop's thread in a run: no diversion
    let first = life.beginShutdown()
    let second = life.beginShutdown()
    #expect(first && !second)
    #expect(life.isShutDown)
    #expect(!life.acceptsBlocks)
    #expect(life.jobRoute == .queue)
    #expect(life.acceptsSignals)
    #expect(life.loopThreadIsIsolated)
  }

  /// While draining, a change is accepted until the drain's cap, an invalidation until the drain's
  /// last round; once finishing, nothing.
  @Test func changesAreAcceptedUntilTheCapAndInvalidationsUntilTheLastRound() {
    var life = LoopLifecycle(kind: .ownsThread)
    _ = life.beginShutdown()
    #expect(life.acceptsChange(isInvalidation: false, drainCapHasPassed: false))
    #expect(!life.acceptsChange(isInvalidation: false, drainCapHasPassed: true))
    #expect(life.acceptsChange(isInvalidation: true, drainCapHasPassed: true))
    _ = life.finishDrain(idle: true, force: false)
    #expect(!life.acceptsChange(isInvalidation: true, drainCapHasPassed: false))
    #expect(!life.acceptsChange(isInvalidation: false, drainCapHasPassed: false))
    #expect(!life.acceptsSignals)
  }

  @Test(arguments: kinds)
  func aDrainRoundWithWorkLeftKeepsDrainingUnlessForced(kind: LoopLifecycle.Kind) {
    var life = LoopLifecycle(kind: kind)
    life.setThreadIsInRun(true)
    _ = life.beginShutdown()
    let keptDraining = !life.finishDrain(idle: false, force: false)
    let forced = life.finishDrain(idle: false, force: true)
    #expect(keptDraining)
    #expect(forced)
    #expect(life.phase == .finishing)
  }

  /// The isolation rule at the end of a drain: while the loop's thread makes its last callouts
  /// (finishing), jobs are held — run nowhere — and the thread is still isolated; at termination
  /// they leave for the fallback and the thread is no longer isolated. Same for every kind.
  @Test(arguments: kinds)
  func finishingHoldsJobsAndOnlyTerminationHandsThemOver(kind: LoopLifecycle.Kind) {
    var life = LoopLifecycle(kind: kind)
    life.setThreadIsInRun(true)
    _ = life.beginShutdown()
    _ = life.finishDrain(idle: false, force: true)
    #expect(life.jobRoute == .hold)
    #expect(life.loopThreadIsIsolated)
    let handsOver = life.terminate()
    #expect(handsOver)
    #expect(life.jobRoute == .fallback)
    #expect(!life.loopThreadIsIsolated)
    #expect(life.phase == .terminated)
  }

  /// A current loop shut down while its thread is out of a run: its jobs leave the thread at once
  /// (the thread may never run the loop again), and the thread is not isolated from then on.
  @Test func aShutDownCurrentLoopOutOfARunDivertsItsJobs() {
    var life = LoopLifecycle(kind: .current)
    let divertedWhileActive = life.divertIfOutOfRun()
    _ = life.beginShutdown()
    let diverted = life.divertIfOutOfRun()
    let divertedTwice = life.divertIfOutOfRun()
    #expect(!divertedWhileActive)
    #expect(diverted)
    #expect(!divertedTwice)
    #expect(life.jobRoute == .fallback)
    #expect(!life.loopThreadIsIsolated)
    #expect(life.handsOffWaitsAtShutdown)
  }

  /// In a run, a shut-down current loop keeps its jobs until the run ends.
  @Test func aShutDownCurrentLoopInARunKeepsItsJobsUntilTheRunEnds() {
    var life = LoopLifecycle(kind: .current)
    life.setThreadIsInRun(true)
    _ = life.beginShutdown()
    let divertedInRun = life.divertIfOutOfRun()
    life.setThreadIsInRun(false)
    let divertedAfterRun = life.divertIfOutOfRun()
    #expect(!divertedInRun)
    #expect(divertedAfterRun)
  }

  /// The owned and the main loop drain themselves: their jobs never leave before termination,
  /// whatever their thread is doing, and no wait is handed off at shutdown.
  @Test(arguments: [LoopLifecycle.Kind.ownsThread, .main])
  func ownedAndMainLoopsNeverDivert(kind: LoopLifecycle.Kind) {
    var life = LoopLifecycle(kind: kind)
    _ = life.beginShutdown()
    let diverted = life.divertIfOutOfRun()
    #expect(!diverted)
    #expect(life.jobRoute == .queue)
    #expect(life.loopThreadIsIsolated)
    #expect(!life.handsOffWaitsAtShutdown)
  }

  /// A current loop whose jobs were diverted and whose thread then exits: termination hands
  /// nothing over (nothing was held: jobs went to the fallback as they came).
  @Test func terminationAfterADiversionHandsNothingOver() {
    var life = LoopLifecycle(kind: .current)
    _ = life.beginShutdown()
    _ = life.divertIfOutOfRun()
    life.setThreadIsInRun(true)  // the exiting thread drains
    _ = life.finishDrain(idle: true, force: false)
    #expect(life.jobRoute == .fallback)
    let handsOver = life.terminate()
    #expect(!handsOver)
  }
}
