/// The jobs handed to a `CFRunLoopExecutor`: a pure state machine held under the executor's
/// lock. Each event returns what the caller does after releasing the lock.
///
/// At most one drain block is on the run loop at a time (`drainScheduled`): only the enqueue that
/// finds none schedules one, so a burst of jobs costs one `CFRunLoopPerformBlock` and one
/// wake-up, not one per job.
struct CFRunLoopExecutorInbox<Job> {
  enum Lifecycle: Equatable {
    case active
    /// `shutdown()` was called: jobs are still accepted and run by the final drain.
    case shuttingDown
    /// The final drain has run: jobs go to the fallback queue.
    case terminated
  }

  private(set) var lifecycle = Lifecycle.active
  private(set) var jobs: [Job] = []
  /// A drain block is on the run loop (or running) and will look at `jobs` again.
  private(set) var drainScheduled = false

  enum EnqueueAction: Equatable {
    /// Queued; a drain is on its way.
    case none
    /// Queued; schedule a drain block and wake the run loop.
    case scheduleDrain
    /// Terminated: run it on the fallback queue.
    case runElsewhere
  }

  mutating func enqueue(_ job: Job) -> EnqueueAction {
    guard lifecycle != .terminated else { return .runElsewhere }
    jobs.append(job)
    if drainScheduled { return .none }
    drainScheduled = true
    return .scheduleDrain
  }

  /// A drain block takes every job queued now (they run outside the lock, in order).
  mutating func takeJobs() -> [Job] {
    defer { jobs.removeAll(keepingCapacity: true) }
    return jobs
  }

  /// A drain block ran its batch: true when more jobs arrived meanwhile (the block schedules
  /// another drain, so the run loop serves its other work in between); false ends the drain.
  mutating func finishDrain() -> Bool {
    if jobs.isEmpty {
      drainScheduled = false
      return false
    }
    return true
  }

  /// `shutdown()`: true for the first call (the caller schedules the final drain).
  mutating func beginShutdown() -> Bool {
    guard lifecycle == .active else { return false }
    lifecycle = .shuttingDown
    return true
  }

  /// The final drain found the queue empty under the lock: terminated from now on, so every job
  /// accepted so far has run and every later one goes to the fallback. nil while jobs wait (run
  /// them, then call again).
  mutating func terminateIfIdle() -> Bool {
    guard jobs.isEmpty else { return false }
    lifecycle = .terminated
    drainScheduled = false
    return true
  }
}
