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
  /// in rounds, until a round leaves the inbox empty. Blocks are refused once shutdown has begun;
  /// jobs and registration changes are still accepted (an awaiting task must not hang; a member
  /// added now is detached in the next round), and if producers outpace the drain for
  /// `shutdownDrainRounds` rounds or `drainCapNanoseconds` the drain ends anyway: it refuses
  /// later changes (but invalidations, see `LoopInbox.control`).
  ///
  /// Then the loop is *finishing* (`LoopLifecycle`): in the same critical section that found the
  /// inbox empty (or hit the cap) it stops accepting changes, and jobs that arrive are held. This
  /// thread applies the changes accepted before that and detaches what they added — its last
  /// callouts — and only then *terminates*: the jobs left over and held are handed, in order, to
  /// the fallback executor under the lock (later arrivals queue behind them). So no job of the loop
  /// runs elsewhere while this thread still calls out, and from the hand-over on this thread no
  /// longer counts as isolated to the loop. Last, the loop's stall watch ends, behind the reports
  /// of every callout made (the drain's too: they go through `observed` as a pass's do).
  ///
  /// Drains once: called again after the loop terminated (a later `runMainLoop()` on a shut-down
  /// main loop), or from a callout of the drain itself, it does nothing.
  func drainForShutdown() {
    guard !hasTerminated, !isDraining else { return }
    isDraining = true
    defer { isDraining = false }
    if case .manual(let clock) = shared.timeSource { clock.loopEnded() }  // tests waiting for idle go on
    var round = 0
    let start = LoopClock.monotonicNanoseconds()
    // From the cap on, other threads' changes are refused as they arrive, also in the middle of
    // a round (which may take long: it applies what arrived during the round before).
    shared.inboxLock.withLock { shared.inbox.refusesChangesFrom = start + drainCapNanoseconds }
    while true {
      applyControls()
      detachEveryMember()
      runOneDrainRound()
      round += 1
      let force =
        round >= Self.shutdownDrainRounds
        || LoopClock.monotonicNanoseconds() - start >= drainCapNanoseconds
      // Jobs this thread collected and has not run yet count as work left (a round runs at most
      // two batches of `jobsPerPass`).
      let localJobsLeft = jobs.hasLeft
      if shared.inboxLock.withLock({ shared.inbox.finishDrain(force: force, localJobsLeft: localJobsLeft) }) { break }
    }
    hasTerminated = true  // a member added here from now on (by a cancel routine below) is refused
    // Changes that arrived after the last round's look (the inbox refuses them from now on).
    applyControls()
    detachEveryMember()
    blocks.removeAll()
    signalled.removeAll()
    // The last callout is made: hand the jobs over (the ones this thread took and did not run
    // first, then those still queued and held).
    let local = jobs.takeRemaining()
    let handedOver: Bool = shared.inboxLock.withLock {
      let held = shared.inbox.terminate()
      shared.publishIsolationLocked()  // false from now on, before the first job leaves
      // Under the lock (a non-blocking enqueue): a job enqueued after this goes to the fallback
      // behind these. The warning is printed after the lock is released.
      for job in local { FallbackExecution.dispatch(job.job, role: job.role, for: loop) }
      for job in held { FallbackExecution.dispatch(job.job, role: job.role, for: loop) }
      return !local.isEmpty || !held.isEmpty
    }
    if handedOver { FallbackExecution.warnOnce(for: loop) }
    // Every callout is made and reported: the stall watch ends behind its reports.
    monitor.setWatch(nil)
    shared.endObservation()
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
  /// arrivals wait for the next round), each one callout for the stall watch and the metrics, at
  /// nesting depth 0 (outside any run). Signalled sources are dropped (they are detached).
  private func runOneDrainRound() {
    let arrived: [PerformRequest] = shared.inboxLock.withLock {
      defer {
        shared.inbox.performs.removeAll()
        shared.inbox.signalled.removeAll()
      }
      return shared.inbox.performs.elements
    }
    let requests = blocks.takeAll() + arrived
    for request in requests { observed(.performedBlock) { request.block() } }
    // runJobs takes a new batch only when the local one is used up, so two calls cover what
    // was left over plus what is waiting now, each capped at `jobsPerPass`.
    runJobs()
    runJobs()
  }
}
