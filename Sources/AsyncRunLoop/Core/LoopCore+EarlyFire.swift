/// Firing a signalled source from inside one of the loop's jobs, instead of in step 4 of the next
/// pass: what lets a sequence's consumer that runs on its own loop take the elements posted while
/// it ran without suspending and waiting for a pass (see `InputSource.fireEarlyFromJob`). Loop
/// thread only.
///
/// The source fires early only when the loop has nothing else to do before that step 4 would fire
/// it, so that the order of everything sent to the loop is as a pass would give it:
/// - the run goes on (its time limit is ahead, it is not asked to end) and does not return after a
///   handled source (it must see the fire); the source is in its mode;
/// - nothing else waits: no registration change, job or stop, no block that may run in the mode
///   (collected; in the inbox, no block at all), no other source's signal, no timer or sleeping
///   task due; no observer of the mode is told of a pass's steps (`beforeTimers`, `beforeSources`,
///   `beforeWaiting`, `afterWaiting`);
/// - the source's signal has reached the loop (its entry is queued), and those entries are dropped
///   with the fire;
/// - not on a virtual-time loop (its tests must not depend on the real clock).
/// What the loop learns of only in steps 5–8 (a descriptor's readiness, the main queue's work on
/// the main loop) is not known here: an element may be taken before a readiness that arrived just
/// before it, as in any pass whose step 4 fires the element's signal before steps 5–8 see the
/// readiness. So that such work is not held back, a job fires early only within
/// `earlyFireWindowNanoseconds` of its first early fire; then the consumer waits for a pass as
/// usual.
extension LoopCore {
  /// How long after its first early fire one job may fire early again (see above).
  static let earlyFireWindowNanoseconds: Int64 = 20_000

  /// What observers of a mode are told between a job and the next pass's step 4.
  static let passActivities: LoopActivity = [.beforeTimers, .beforeSources, .beforeWaiting, .afterWaiting]

  /// Whether `record` may fire now, from inside the job on the stack (see above); if so, drops
  /// its queued signals, and the caller must fire it. Loop thread, under the source's lock.
  func claimEarlyFire(of record: MemberRecord) -> Bool {
    guard !jobs.mayRun, !jobs.hasLeft, !changes.hasWaiting, let run = innermostRun, !run.returnAfterSourceHandled,
      case .system = shared.timeSource, !hasRunnablePerform(in: run.contents.mode),
      run.contents.observedActivities.isDisjoint(with: Self.passActivities), record.isIn(run.contents),
      signalled.onlySignalled(record, in: run.contents, sourceJoins: modeTable.sourceJoins)
    else { return false }
    let now = LoopClock.monotonicNanoseconds()
    guard run.deadline > now,
      earlyFireWindowStart == 0 || now - earlyFireWindowStart <= Self.earlyFireWindowNanoseconds,
      !hasTimerDue(at: now, in: run.contents), !(run.shouldEnd?() ?? false)
    else { return false }
    guard let droppedFromInbox = shared.inboxLock.withLock({ shared.inbox.dropSignalsIfAlone(record) }) else {
      return false
    }
    // No entry anywhere: the signal is still on its way to the inbox (set on the source, not queued
    // yet). Firing now would leave that entry to arrive stale, numbered before changes sent after
    // it, and let the source's next signal fire ahead of them: the consumer waits for a pass.
    guard droppedFromInbox + signalled.dropCollected() > 0 else { return false }
    if earlyFireWindowStart == 0 { earlyFireWindowStart = now }
    return true
  }

  /// Whether a timer of `contents`, or a sleeping task's wake-up, is due at `now`.
  private func hasTimerDue(at now: Int64, in contents: ModeContents) -> Bool {
    if let first = contents.timers.firstDeadline, first <= now { return true }
    if let first = modeTable.everyModeContents?.timers.firstDeadline, first <= now { return true }
    return false
  }
}
