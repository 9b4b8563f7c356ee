/// The end of a loop: draining after `shutdown()` so that nothing accepted is lost.
extension RunLoopThread {
  /// How many drain rounds run before the loop terminates even if jobs keep arriving.
  static let shutdownDrainRounds = 1024

  /// Loop thread, after the last run: invalidates every member (cancel routines run here,
  /// closures are released, async consumers end), then runs every job, block and change that was
  /// accepted, in rounds, until a round leaves the inbox empty; the loop is marked terminated in
  /// the same critical section that finds it empty, so no job can slip in between and be
  /// stranded. Blocks are refused once shutdown has begun; jobs are still accepted (an awaiting
  /// task must not hang), and if producers outpace the drain for `shutdownDrainRounds` rounds the
  /// loop terminates anyway and hands the remaining jobs, in order, to the fallback executor.
  func drainForShutdown() {
    var round = 0
    while true {
      applyControls()
      for member in modeTable.allMembers() { invalidate(member) }
      runOneDrainRound()
      round += 1
      let force = round >= Self.shutdownDrainRounds
      let finished: Bool = inboxLock.withLock {
        switch inbox.terminate(force: force) {
        case .keepDraining:
          return false
        case .terminated(let leftovers):
          // Under the lock: a job enqueued after this goes to the fallback behind these.
          let local = localJobs[localJobIndex...]
          for job in local + leftovers { FallbackExecution.run(job.job, role: job.role, for: self) }
          return true
        }
      }
      if finished { break }
    }
    localJobs.removeAll()
    localJobIndex = 0
    applyControls()
    for member in modeTable.allMembers() { invalidate(member) }
    localPerforms.removeAll()
    deferredSignalled.removeAll()
  }

  private func invalidate(_ member: any ModeMember) {
    switch member {
    case let source as InputSource: source.invalidate()
    case let source as DescriptorSource: source.invalidate()
    case let timer as LoopTimer: timer.invalidate()
    case let observer as LoopObserver: observer.invalidate()
    default: modeTable.removeEverywhere(member)
    }
  }

  /// One drain round: every waiting block (whatever its modes), then the jobs waiting now (new
  /// arrivals wait for the next round). Signalled sources are dropped (they are invalidated).
  private func runOneDrainRound() {
    let performs: [PerformRequest] = inboxLock.withLock {
      defer {
        inbox.performs.removeAll()
        inbox.signalled.removeAll()
      }
      return inbox.performs
    }
    let blocks = localPerforms + performs
    localPerforms.removeAll()
    for request in blocks { request.block() }
    // runJobs takes a new batch only when the local one is used up, so two calls cover what
    // was left over plus what is waiting now, each capped at `jobsPerPass`.
    runJobs()
    runJobs()
  }
}
