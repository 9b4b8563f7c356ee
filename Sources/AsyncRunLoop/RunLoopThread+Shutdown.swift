/// The end of a loop: draining after `shutdown()` so that nothing accepted is lost.
extension RunLoopThread {
  /// Loop thread, after the last run: invalidates every member (cancel routines run here,
  /// closures are released, async consumers end), then runs every job, block and change that was
  /// accepted — including ones that arrive meanwhile — until the inbox is empty, and marks the
  /// loop terminated in the same critical section that finds it empty (so no job can slip in
  /// between and be stranded).
  func drainForShutdown() {
    while true {
      applyControls()
      for member in modeTable.allMembers() { invalidate(member) }
      runAllPerformsAndJobs()
      let terminated = inboxLock.withLock { inbox.terminateIfIdle() }
      if terminated { break }
    }
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

  /// Runs every waiting block (whatever its modes) and job; signalled sources are dropped (they
  /// are invalidated already).
  private func runAllPerformsAndJobs() {
    while true {
      let (performs, jobsWaiting): ([PerformRequest], Bool) = inboxLock.withLock {
        defer {
          inbox.performs.removeAll()
          inbox.signalled.removeAll()
        }
        return (inbox.performs, !inbox.jobs.isEmpty)
      }
      let blocks = localPerforms + performs
      localPerforms.removeAll()
      for request in blocks { request.block() }
      if !jobsWaiting && localJobIndex >= localJobs.count && blocks.isEmpty { return }
      runJobs()
    }
  }
}
