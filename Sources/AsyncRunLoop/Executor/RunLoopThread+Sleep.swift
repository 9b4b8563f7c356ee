/// Suspending tasks on the loop's timers.
extension RunLoopThread {
  /// A clock whose `sleep` waits on this loop's timers (timerfd precision, woken on this loop).
  /// Any thread.
  public var clock: LoopClock { LoopClock(loop: self) }

  /// The process-wide loop that serves `LoopClock()` sleeps made off any loop thread.
  static let sharedTimerLoop: RunLoopThread = {
    do {
      return try RunLoopThread(name: "AsyncRunLoop.timers")
    } catch {
      preconditionFailure("AsyncRunLoop: cannot start the shared timer loop: \(error)")
    }
  }()

  /// Suspends the calling task until `deadline` on a one-shot timer of this loop (in its common
  /// modes). Any task. Never returns early.
  ///
  /// Runs in the caller's isolation (`actor`, `#isolation` by default): an actor pinned to this
  /// loop adds the timer on the loop's thread. As a plain `async` function, called by a task
  /// without an executor preference, it left for the global pool first and sent the timer from
  /// there, which woke the loop once more per sleep. (The
  /// resumption of a task without an executor preference still goes through the pool in Swift
  /// 6.3, then hops back to the actor. An `isolated` parameter rather than
  /// `nonisolated(nonsending)`, as in `waitForConsumerWake`: the cancellation handler's operation
  /// is then isolated too.)
  /// - Throws: `CancellationError` when the task is cancelled, or the loop shuts down, before
  ///   the deadline.
  func sleep(
    until deadline: LoopClock.Instant, tolerance: Duration?, isolation actor: isolated (any Actor)? = #isolation
  ) async throws {
    let waiter = SleepWaiter()
    // A current loop's thread drains its timers only when it exits: the shutdown ends the sleep
    // when the loop's jobs leave for the fallback (see `LoopShared.divertHandOffs`).
    let handsOff = shared.divertsJobsAtShutdown
    let shared = shared
    try await withTaskCancellationHandler {
      try await withCheckedThrowingContinuation(isolation: actor) {
        (continuation: CheckedContinuation<Void, any Error>) in
        let timer = LoopTimer(
          fireAt: deadline, tolerance: tolerance ?? .zero,
          handler: { _ in
            if handsOff { shared.unregisterHandOff(waiter) }
            waiter.finish(.success(()))
          },
          onInvalidate: {
            if handsOff { shared.unregisterHandOff(waiter) }
            waiter.finish(.failure(CancellationError()))
          })
        guard waiter.start(continuation, timer: timer) else { return }  // cancelled already
        if handsOff, !shared.registerHandOff(waiter, { waiter.finish(.failure(CancellationError())) }) {
          waiter.finish(.failure(CancellationError()))  // shut down, its jobs diverted: never add
          return
        }
        add(timer, to: .common)
        if isShutDown { timer.invalidate() }
      }
    } onCancel: {
      waiter.cancel()
    }
  }
}

/// The once-only meeting point of a sleeping task, its timer and cancellation: a pure state
/// machine under a lock; the continuation is resumed after the lock is released.
final class SleepWaiter: @unchecked Sendable {  // Safety: proof below
  // Safety: `state` is only touched with `lock` held.
  private let lock = PthreadLock.make()
  private var state = State.idle

  private enum State {
    /// Not started yet.
    case idle
    /// Cancelled before it started.
    case cancelledEarly
    case waiting(CheckedContinuation<Void, any Error>, LoopTimer)
    case finished
  }

  /// Returns false (having resumed the continuation with CancellationError) if already cancelled.
  func start(_ continuation: CheckedContinuation<Void, any Error>, timer: LoopTimer) -> Bool {
    let proceed: Bool = lock.withLock {
      switch state {
      case .idle:
        state = .waiting(continuation, timer)
        return true
      case .cancelledEarly, .waiting, .finished:
        state = .finished
        return false
      }
    }
    if !proceed { continuation.resume(throwing: CancellationError()) }
    return proceed
  }

  /// Timer fired, or was invalidated: resume once.
  func finish(_ result: Result<Void, any Error>) {
    let continuation: CheckedContinuation<Void, any Error>? = lock.withLock {
      switch state {
      case .waiting(let continuation, _):
        state = .finished
        return continuation
      case .idle, .cancelledEarly, .finished:
        return nil
      }
    }
    continuation?.resume(with: result)
  }

  /// The task was cancelled: invalidate the timer (which resumes with CancellationError).
  func cancel() {
    let timer: LoopTimer? = lock.withLock {
      switch state {
      case .idle:
        state = .cancelledEarly
        return nil
      case .waiting(_, let timer):
        return timer
      case .cancelledEarly, .finished:
        return nil
      }
    }
    timer?.invalidate()
  }
}
