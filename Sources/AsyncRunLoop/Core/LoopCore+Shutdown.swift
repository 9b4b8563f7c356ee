/// The end of a loop: draining after `shutdown()` so that nothing accepted is lost.
extension LoopCore {
  /// How many drain rounds run before the loop terminates even if jobs or changes keep arriving.
  static let shutdownDrainRounds = 1024
  /// How long the drain accepts new jobs and changes before it terminates anyway (a round applies
  /// every change accepted before it began, so while producers outpace it the rounds grow and
  /// 1,024 of them might never end).
  static let shutdownDrainNanoseconds: Int64 = 1_000_000_000

  /// Loop thread, after the last run: detaches every member (cancel routines run here, closures
  /// are released, async consumers end), then runs every job, block and change that was accepted,
  /// in rounds, until a round leaves the inbox empty; the loop is marked terminated in the same
  /// critical section that finds it empty, so no job or change can slip in between and be
  /// stranded. Blocks are refused once shutdown has begun; jobs and registration changes are still
  /// accepted (an awaiting task must not hang; a member added now is detached in the next round),
  /// and if producers outpace the drain for `shutdownDrainRounds` rounds or
  /// `shutdownDrainNanoseconds` the loop terminates anyway: it refuses what comes later (but
  /// invalidations, see `LoopInbox.control`), applies the changes it accepted and hands the
  /// remaining jobs, in order, to the fallback executor.
  func drainForShutdown() {
    var round = 0
    let start = LoopClock.monotonicNanoseconds()
    // From the cap on, other threads' changes are refused as they arrive, also in the middle of
    // a round (which may take long: it applies what arrived during the round before).
    shared.inboxLock.withLock { shared.inbox.refusesChangesFrom = start + Self.shutdownDrainNanoseconds }
    while true {
      applyControls()
      detachEveryMember()
      runOneDrainRound()
      round += 1
      let force =
        round >= Self.shutdownDrainRounds
        || LoopClock.monotonicNanoseconds() - start >= Self.shutdownDrainNanoseconds
      let (finished, handedOver): (Bool, Bool) = shared.inboxLock.withLock {
        switch shared.inbox.terminate(force: force) {
        case .keepDraining:
          return (false, false)
        case .terminated(let leftovers):
          // Under the lock (a non-blocking enqueue): a job enqueued after this goes to the
          // fallback behind these. The warning is printed after the lock is released.
          let local = localJobs[localJobIndex...]
          for job in local + leftovers { FallbackExecution.dispatch(job.job, role: job.role, for: loop) }
          return (true, !local.isEmpty || !leftovers.isEmpty)
        }
      }
      if handedOver { FallbackExecution.warnOnce(for: loop) }
      if finished { break }
    }
    hasTerminated = true  // a member added here from now on (by a cancel routine below) is refused
    localJobs.removeAll()
    localJobIndex = 0
    // Changes that arrived after the last round's look (the inbox refuses them from now on).
    applyControls()
    detachEveryMember()
    performs.removeAll()
    livePerformCount = 0
    deferredSignalled.removeAll()
    spareSignalled.removeAll()
  }

  /// Invalidates every member on this loop and detaches its record here — also the records of
  /// members that another thread invalidated (whose detach may be on its way or refused) and of
  /// members already moved to another loop (which stay valid there): whatever state its binding
  /// is in, each record is detached exactly once, so every cancel routine runs exactly once.
  private func detachEveryMember() {
    for record in modeTable.allRecords {
      guard let member = record.member else { continue }  // detached by an earlier invalidation
      if member.isBound(to: shared) { member.invalidateMember() }  // detaches inline: we are the loop thread
      detach(record)  // a no-op when invalidate did it
    }
  }

  /// One drain round: every waiting block (whatever its modes), then the jobs waiting now (new
  /// arrivals wait for the next round). Signalled sources are dropped (they are detached).
  private func runOneDrainRound() {
    let arrived: [PerformRequest] = shared.inboxLock.withLock {
      defer {
        shared.inbox.performs.removeAll()
        shared.inbox.signalled.removeAll()
      }
      return shared.inbox.performs.elements
    }
    let blocks = performs.compactMap { $0 } + arrived
    performs.removeAll()
    livePerformCount = 0
    for request in blocks { request.block() }
    // runJobs takes a new batch only when the local one is used up, so two calls cover what
    // was left over plus what is waiting now, each capped at `jobsPerPass`.
    runJobs()
    runJobs()
  }
}
