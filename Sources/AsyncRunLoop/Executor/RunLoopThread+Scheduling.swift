import Dispatch
@_spi(ExperimentalScheduling) import _Concurrency

/// `Task.sleep` under `withTaskExecutorPreference(loop)` asks the executor to run the sleeping
/// job later: the loop does so on its own timer heap (timerfd precision), not on the global
/// executor's timers.
@_spi(ExperimentalScheduling) extension RunLoopThread: SchedulingExecutor {
  public func enqueue<C: Clock>(
    _ job: consuming ExecutorJob, after delay: C.Duration, tolerance: C.Duration?, clock: C
  ) {
    schedule(UnownedJob(job), role: .task, after: delay, tolerance: tolerance, clock: clock)
  }

  public func enqueue<C: Clock>(
    _ job: consuming ExecutorJob, at instant: C.Instant, tolerance: C.Duration?, clock: C
  ) {
    schedule(UnownedJob(job), role: .task, at: instant, tolerance: tolerance, clock: clock)
  }

  /// Both roles' `enqueue(_:after:…)` (see `LoopSerialExecutor`).
  func schedule<C: Clock>(
    _ job: UnownedJob, role: JobRole, after delay: C.Duration, tolerance: C.Duration?, clock: C
  ) {
    guard let delay = Self.duration(delay) else {
      return scheduleByClock(job, role: role, at: clock.now.advanced(by: delay), tolerance: tolerance, clock: clock)
    }
    schedule(job, role: role, in: delay, tolerance: tolerance.flatMap(Self.duration))
  }

  /// Both roles' `enqueue(_:at:…)` (see `LoopSerialExecutor`).
  func schedule<C: Clock>(_ job: UnownedJob, role: JobRole, at instant: C.Instant, tolerance: C.Duration?, clock: C) {
    // An instant of the loop's own clock (`loop.clock`): exactly that deadline, also in virtual time.
    if let deadline = instant as? LoopClock.Instant, clock is LoopClock {
      return schedule(job, role: role, at: deadline, tolerance: tolerance.flatMap(Self.duration))
    }
    guard var delay = Self.duration(clock.now.duration(to: instant)) else {
      return scheduleByClock(job, role: role, at: instant, tolerance: tolerance, clock: clock)
    }
    // A virtual-time loop: the instant was read on another clock a moment ago (`Task.sleep(for:)`
    // on `ContinuousClock`), so the delay left is a hair short; taken up to the next whole
    // millisecond, a virtual sleep does not depend on how long that moment was.
    if case .manual = shared.timeSource { delay = VirtualClock.roundedUpToMilliseconds(delay) }
    schedule(job, role: role, in: delay, tolerance: tolerance.flatMap(Self.duration))
  }

  /// A clock whose durations are not `Duration` (a custom clock): its time cannot be put on the
  /// loop's timers, so the clock itself waits (on the global executor), then the job is enqueued
  /// here. Never early: the clock decides when its instant has come.
  private func scheduleByClock<C: Clock>(
    _ job: UnownedJob, role: JobRole, at instant: C.Instant, tolerance: C.Duration?, clock: C
  ) {
    scheduledJobCounter.withLock { $0 += 1 }
    let once = JobOnce(job)
    let clockBox = UncheckedSendableBox((clock, instant, tolerance))
    Task.detached { [self] in
      let (clock, instant, tolerance) = clockBox.value
      // Not cancellable (nobody holds this task): a thrown sleep cannot happen; retry anyway.
      while clock.now < instant { try? await clock.sleep(until: instant, tolerance: tolerance) }
      if let job = once.take() { enqueue(job, role: role) }
    }
  }

  /// Runs `job` on the loop after `delay` (a delay already over fires on the next pass). A job is
  /// never dropped and never run early: if the timer is invalidated first (the loop shuts down),
  /// the job is enqueued at its deadline from a Dispatch timer instead (after termination it then
  /// runs on the fallback queue, still isolated to the loop).
  private func schedule(_ job: UnownedJob, role: JobRole, in delay: Duration, tolerance: Duration?) {
    schedule(job, role: role, at: clockNow.advanced(by: delay), tolerance: tolerance)
  }

  /// `schedule(_:role:in:tolerance:)` at a deadline on the loop's clock.
  private func schedule(_ job: UnownedJob, role: JobRole, at deadline: LoopClock.Instant, tolerance: Duration?) {
    scheduledJobCounter.withLock { $0 += 1 }
    let once = JobOnce(job)
    // Shut down before the deadline: the job waits for its deadline elsewhere, holding the loop
    // weakly (held, the loop's descriptors stayed open until the deadline, an hour for an hour's
    // sleep, after the loop was shut down and dropped).
    // Only an owned loop is held weakly: the main loop and a current loop have no thread or
    // descriptors of their own to give back early, and a weak reference to the main loop, which
    // lives as long as the process, left a side table that LeakSanitizer reported as leaked.
    let loopAtDeadline: @Sendable () -> RunLoopThread?
    if ownsThread {
      loopAtDeadline = { [weak self] in self }
    } else {
      loopAtDeadline = { [self] in self }
    }
    let waitElsewhere: @Sendable () -> Void = {
      Self.atDeadline(deadline.nanoseconds) { Self.enqueueLate(once, role: role, on: loopAtDeadline()) }
    }
    // A current loop's thread drains its timers only when it exits: the shutdown moves the job
    // when the loop's jobs leave for the fallback (see `LoopShared.divertHandOffs`).
    let handsOff = shared.divertsJobsAtShutdown
    let timer = LoopTimer(
      fireAt: deadline, tolerance: tolerance ?? .zero,
      handler: { [unowned self] _ in
        if handsOff { shared.unregisterHandOff(once) }
        guard let job = once.take() else { return }
        // Inside one of the loop's own jobs (a run nested in an actor method) no other job may
        // start: queue it behind the running one.
        guard core.mayRunJobs else { return enqueue(job, role: role) }
        switch role {
        case .serial, .serialOnTaskExecutor:
          core.runAsJob(priority: TaskPriority(job.priority)) { job.runSynchronously(on: asUnownedSerialExecutor()) }
        // A task-role job is usually not the sleeping task but the small task `Task.sleep`
        // creates to resume it, which has no executor preference. Run on this loop's
        // task-executor identity, the runtime moved it to the global pool first (a worker
        // wake-up, then a second wake-up of this loop when it resumed the sleeper: measured
        // two passes per sleep). Run under the global executor's identity (generic code may
        // run on any thread), it resumes the sleeper right here: the sleeper prefers this
        // loop, so its job lands in the inbox and runs in this same pass. A job that itself
        // prefers this loop is moved back here by the runtime the same way.
        case .task: job.runSynchronously(on: globalConcurrentExecutor.asUnownedTaskExecutor())
        }
      },
      onInvalidate: { [self] in
        if handsOff { shared.unregisterHandOff(once) }
        waitElsewhere()
      })
    if handsOff, !shared.registerHandOff(once, waitElsewhere) { return waitElsewhere() }
    add(timer, to: .everyMode)  // fires in every mode, as jobs run in every mode
    if isShutDown { timer.invalidate() }
  }

  /// A scheduled job whose loop shut down before its deadline, at that deadline: enqueued on the
  /// loop (which, terminated, runs it on the fallback queue, isolated to the loop); or, once no
  /// one holds the loop any more, run on the global executor: no actor is isolated to a loop that
  /// is gone (an actor pinned to a loop holds it), and the job is a sleeping task's wake-up, which
  /// may run anywhere (see the timer's handler).
  private static func enqueueLate(_ once: JobOnce, role: JobRole, on loop: RunLoopThread?) {
    guard let job = once.take() else { return }
    if let loop { return loop.enqueue(job, role: role) }
    DispatchQueue.global().async { job.runSynchronously(on: globalConcurrentExecutor.asUnownedTaskExecutor()) }
  }

  /// A clock's duration as a `Duration`, when it is one (every standard clock's is).
  private static func duration<D: DurationProtocol>(_ value: D) -> Duration? {
    value as? Duration
  }
}

extension RunLoopThread {
  /// The longest single Dispatch wait `atDeadline` asks for (one day).
  static let longestDispatchWait = 86_400 * 1_000_000_000

  /// Calls `body` once the loop clock has reached `deadline` (inline if it has already), on a
  /// global queue. Any thread. Never early, and `body` is never dropped: Dispatch silently drops a
  /// block whose deadline it cannot represent (a far deadline overflows to
  /// `DISPATCH_TIME_FOREVER`), which lost the job of a cancelled `Task.sleep(for: .seconds(.max))`
  /// (the runtime keeps its wake-up pending until the deadline) when its loop shut down. So the
  /// wait is taken in steps of at most `longestDispatchWait`, each checked against the loop clock.
  static func atDeadline(_ deadline: Int64, _ body: @escaping @Sendable () -> Void) {
    let remaining = LoopClock.monotonicNanoseconds().distance(to: deadline)
    guard remaining > 0 else { return body() }
    let step = min(remaining, longestDispatchWait)
    DispatchQueue.global().asyncAfter(deadline: .now() + .nanoseconds(step)) { atDeadline(deadline, body) }
  }
}

/// Carries a value that is only handed from one task to another once (a clock and its instant,
/// which the generic `Clock` API does not promise to be `Sendable`).
struct UncheckedSendableBox<Value>: @unchecked Sendable {  // Safety: proof below
  // Safety: created by the enqueueing thread and read once by the task it starts; never shared
  // further, never mutated.
  let value: Value
  init(_ value: Value) { self.value = value }
}

/// Hands a job out exactly once (timer fire or invalidation, whichever comes first).
final class JobOnce: @unchecked Sendable {  // Safety: proof below
  // Safety: `job` is only touched with `lock` held.
  private let lock = PthreadLock.make()
  private var job: UnownedJob?
  init(_ job: UnownedJob) { self.job = job }
  func take() -> UnownedJob? {
    lock.withLock {
      defer { job = nil }
      return job
    }
  }
}

extension RunLoopThread {
  /// How many jobs were scheduled through `SchedulingExecutor` (each `Task.sleep` under this
  /// loop's task-executor preference is one). Any thread.
  ///
  /// Instrumentation, not API: it is SPI (`@_spi(Testing) import AsyncRunLoop`), so it is not part
  /// of the public surface nor of its compatibility promise. The package's tests and benchmarks
  /// use it to see that a sleep was routed to the loop's timers.
  @_spi(Testing) public var scheduledJobCount: Int { scheduledJobCounter.withLock { $0 } }
}
