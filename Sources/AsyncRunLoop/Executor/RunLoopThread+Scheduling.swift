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
    schedule(job, role: role, in: Self.duration(delay), tolerance: tolerance.flatMap(Self.duration))
  }

  /// Both roles' `enqueue(_:at:…)` (see `LoopSerialExecutor`).
  func schedule<C: Clock>(_ job: UnownedJob, role: JobRole, at instant: C.Instant, tolerance: C.Duration?, clock: C) {
    let delay = clock.now.duration(to: instant)
    schedule(job, role: role, in: Self.duration(delay), tolerance: tolerance.flatMap(Self.duration))
  }

  /// Runs `job` on the loop after `delay` (a delay already over fires on the next pass). A job is
  /// never dropped: if the timer is invalidated first (the loop shuts down), the job is enqueued
  /// at once instead.
  private func schedule(_ job: UnownedJob, role: JobRole, in delay: Duration?, tolerance: Duration?) {
    scheduledJobCounter.withLock { $0 += 1 }
    let once = JobOnce(job)
    let timer = LoopTimer(
      fireAt: .now.advanced(by: delay ?? .zero), tolerance: tolerance ?? .zero,
      handler: { [unowned self] _ in
        if let job = once.take() {
          switch role {
          case .serial: job.runSynchronously(on: asUnownedSerialExecutor())
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
        }
      },
      onInvalidate: { [unowned self] in
        if let job = once.take() { enqueue(job, role: role) }
      })
    add(timer, to: .common)
    if isShutDown { timer.invalidate(waitForRunningCallout: false) }
  }

  /// A clock's duration as a `Duration`, when it is one (every standard clock's is).
  private static func duration<D: DurationProtocol>(_ value: D) -> Duration? {
    value as? Duration
  }
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
  /// loop's task-executor preference is one). Any thread; for tests and instrumentation.
  public var scheduledJobCount: Int { scheduledJobCounter.withLock { $0 } }
}
