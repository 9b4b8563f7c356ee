/// Firing a signalled source from inside one of the loop's jobs, instead of in step 4 of the next
/// pass: what lets a sequence's consumer that runs on its own loop take the elements posted while
/// it ran, without suspending and waiting for a pass (see `InputSource.fireEarlyFromJob`). Loop
/// thread only.
///
/// The source fires only when step 4 of this run would fire it and nothing would come between: it
/// is signalled, in the mode of the innermost run, no registration change sent from any thread
/// waits (a signal fires only after the changes sent before it), and the run does not return
/// after a handled source (it must see the fire). To keep the loop fair to its timers,
/// descriptors, other sources and jobs, a job fires early only during the first
/// `earlyFireWindowNanoseconds` after its first early fire; then the consumer waits for a pass
/// as usual. Never on a virtual-time loop, whose tests must not depend on the real clock.
extension LoopCore {
  /// How long one job may keep firing sources early (see above).
  static let earlyFireWindowNanoseconds: Int64 = 20_000

  /// The innermost run: entered by `run`, restored when it returns. Loop thread.
  struct InnermostRun {
    let contents: ModeContents
    let returnsAfterSource: Bool
  }

  /// Whether `record` may fire now, from inside the job that runs on the stack. Loop thread; the
  /// caller holds the source's lock (nothing here takes a lock or calls out).
  func mayFireEarly(_ record: MemberRecord) -> Bool {
    guard !jobs.mayRun, let run = innermostRun, !run.returnsAfterSource, !changes.hasWaiting,
      !shared.changesWaiting.load(ordering: .acquiring), record.isIn(run.contents)
    else { return false }
    guard case .system = shared.timeSource else { return false }
    let now = LoopClock.monotonicNanoseconds()
    if earlyFireWindowStart == 0 {
      earlyFireWindowStart = now
      return true
    }
    return now - earlyFireWindowStart <= Self.earlyFireWindowNanoseconds
  }
}
