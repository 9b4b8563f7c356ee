@_spi(ExperimentalScheduling) import _Concurrency

/// The loop's `SerialExecutor` role: `loop.asUnownedSerialExecutor()` returns this object, so the
/// jobs of actors pinned to the loop (`LoopActor`) arrive here and run isolated to it on the loop
/// thread. The loop itself is the `TaskExecutor` identity: `Task(executorPreference: loop)`
/// retains the executor it is given and later releases the identity that
/// `asUnownedTaskExecutor()` returns, so those two must be the same object. Any thread.
final class LoopSerialExecutor: SerialExecutor {
  /// The loop that owns this role. The loop holds the role strongly; code that holds the role's
  /// unowned executor reference got it from the loop and keeps the loop alive while using it.
  unowned let loop: RunLoopThread

  init(loop: RunLoopThread) { self.loop = loop }

  func enqueue(_ job: consuming ExecutorJob) {
    let job = UnownedJob(job)
    // The job running on the loop in the serial or the task role enqueues itself: its task
    // prefers a task executor, most likely this loop (see `JobRole`).
    if loop.isOnLoopThread, loop.core.isRunningJobThatMayPreferTheLoop(job) {
      return loop.enqueue(job, role: .serialOnTaskExecutor)
    }
    loop.enqueue(job, role: .serial)
  }

  func asUnownedSerialExecutor() -> UnownedSerialExecutor {
    UnownedSerialExecutor(ordinary: self)
  }

  func checkIsolated() {
    loop.checkIsolated()
  }

  /// True on the loop (see `RunLoopThread.isIsolatingCurrentContext()`), nil — "unknown" —
  /// elsewhere, never false. Any thread.
  ///
  /// Measured with the Swift 6.3 runtime: an answer of false makes a failed
  /// `assumeIsolated`/`preconditionIsolated` trap with the runtime's own message ("Incorrect actor
  /// executor assumption…"), which names neither the loop nor the thread; nil makes the runtime
  /// call `checkIsolated()`, which traps with ours. Checks that must not trap (a dynamic cast
  /// through a conformance isolated to a global actor on the loop) never call `checkIsolated()`
  /// and read nil as "not isolated", exactly as they read false; `#isolation` is static and asks
  /// nobody. Code that asks this role directly (`actor.withSerialExecutor { … }`) should compare
  /// the answer with `true`.
  func isIsolatingCurrentContext() -> Bool? {
    loop.isIsolatingCurrentContext() == true ? true : nil
  }
}

/// Jobs the runtime schedules for later on the actors pinned to the loop go on the loop's timers.
///
/// Measured with the Swift 6.3 runtime: `Task.sleep` inside such an actor's method never comes
/// here. The standard library's sleep is a nonisolated `async` function, so it leaves the actor
/// before the runtime looks for a scheduling executor, and the sleep waits on the global
/// executor's timers (it still ends on time and resumes the actor on the loop). To sleep on the
/// loop's timers from an actor, use `loop.clock` or `LoopClock()` (whose `sleep` runs on the
/// caller's executor), or give the task the loop as its executor preference.
@_spi(ExperimentalScheduling) extension LoopSerialExecutor: SchedulingExecutor {
  func enqueue<C: Clock>(
    _ job: consuming ExecutorJob, after delay: C.Duration, tolerance: C.Duration?, clock: C
  ) {
    loop.schedule(UnownedJob(job), role: .serial, after: delay, tolerance: tolerance, clock: clock)
  }

  func enqueue<C: Clock>(
    _ job: consuming ExecutorJob, at instant: C.Instant, tolerance: C.Duration?, clock: C
  ) {
    loop.schedule(UnownedJob(job), role: .serial, at: instant, tolerance: tolerance, clock: clock)
  }
}
