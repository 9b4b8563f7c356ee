/// The jobs handed to a `CFRunLoopExecutor`: a pure state machine held under the executor's
/// lock. Each event returns what the caller does after releasing the lock.
///
/// At most one drain block is on the run loop at a time (`drainScheduled`): only the enqueue that
/// finds none schedules one, so a burst of jobs costs one `CFRunLoopPerformBlock` and one
/// wake-up, not one per job.
///
/// It also holds the thread's run loop (`Loop`), while that thread lives: a block left on the loop
/// of a thread that has exited is never run, only freed with the loop, and a drain block holds
/// the executor. Letting go of the loop at the exit frees both.
struct CFRunLoopExecutorInbox<Job, Loop> {
  enum Lifecycle: Equatable {
    case active
    /// `shutdown()` was called, or the thread exited: jobs are still accepted and run by the
    /// final drain (on the thread; once it has exited, on the fallback queue).
    case shuttingDown
    /// The final drain has run: jobs go to the fallback queue.
    case terminated
  }

  private(set) var lifecycle = Lifecycle.active
  private(set) var jobs: [Job] = []
  /// A drain block is on the run loop (or running) and will look at `jobs` again.
  private(set) var drainScheduled = false
  /// The thread's run loop; nil once the thread has exited.
  private(set) var runLoop: Loop?

  init(runLoop: Loop) { self.runLoop = runLoop }

  /// Jobs run on the executor's thread: until the final drain has run, and while that thread is
  /// alive.
  var jobsRunOnTheThread: Bool { lifecycle != .terminated && runLoop != nil }

  enum EnqueueAction {
    /// Queued; a drain is on its way.
    case none
    /// Queued; schedule a drain block on this run loop and wake it.
    case scheduleDrain(Loop)
    /// Terminated: run it on the fallback queue.
    case runElsewhere
  }

  mutating func enqueue(_ job: Job) -> EnqueueAction {
    guard lifecycle != .terminated else { return .runElsewhere }
    jobs.append(job)
    guard !drainScheduled, let runLoop else { return .none }
    drainScheduled = true
    return .scheduleDrain(runLoop)
  }

  /// A drain block takes every job queued now (they run outside the lock, in order).
  mutating func takeJobs() -> [Job] {
    defer { jobs.removeAll(keepingCapacity: true) }
    return jobs
  }

  /// A drain block ran its batch: the run loop to schedule another drain on when more jobs
  /// arrived meanwhile (so the loop serves its other work in between); nil ends the drain (when
  /// the thread has exited meanwhile, the fallback queue's final drain takes the jobs).
  mutating func finishDrain() -> Loop? {
    if jobs.isEmpty {
      drainScheduled = false
      return nil
    }
    return runLoop
  }

  /// `shutdown()`: the run loop for the first call while the thread lives (the caller schedules
  /// the final drain there); nil otherwise.
  mutating func beginShutdown() -> Loop? {
    guard lifecycle == .active, let runLoop else { return nil }
    lifecycle = .shuttingDown
    return runLoop
  }

  /// What the executor does when its thread exits: `drainsOnFallback` — the final drain had not
  /// run, so the caller runs it on the fallback queue (the jobs queued now, and those enqueued
  /// until the queue is empty); `releasedLoop` — the run loop, to let go of after the lock.
  struct ThreadExit {
    var drainsOnFallback: Bool
    var releasedLoop: Loop?
  }

  /// The executor's thread exits. From now on (no loop) no drain block goes to its loop, and
  /// `shutdown()` has nothing left to begin.
  mutating func threadExited() -> ThreadExit {
    let released = runLoop
    runLoop = nil
    guard lifecycle != .terminated, released != nil else {
      return ThreadExit(drainsOnFallback: false, releasedLoop: released)
    }
    lifecycle = .shuttingDown
    return ThreadExit(drainsOnFallback: true, releasedLoop: released)
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
