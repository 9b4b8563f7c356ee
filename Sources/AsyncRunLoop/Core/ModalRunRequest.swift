/// One `runModal` call's life, from the caller's suspension to its one resumption: a pure state
/// machine (`ModalRunState`) held under a lock by `ModalRunRequest`, which resumes the caller
/// after releasing the lock.
///
/// The caller is resumed exactly once, by whichever comes first:
/// - the run ends (`finish`), on the loop thread;
/// - the task is cancelled before the run started (`cancel`): `.stopped`, and the run never starts
///   (a cancellation after it started asks it to end instead: `isEndRequested`);
/// - the loop is shut down before the run started and will not run it soon (`abandon`, the
///   current loop's hand-off at shutdown): `RunLoopError.shutDown`.
/// The performed block asks `start()` first and runs nothing if the caller was already resumed.
struct ModalRunState<Continuation> {
  enum State {
    /// The caller is suspending; `cancelled` if its task was cancelled already.
    case initial(cancelled: Bool)
    /// Waiting for the loop to run the block.
    case waiting(Continuation)
    /// The run is in progress; `endRequested` after a cancellation.
    case running(Continuation, endRequested: Bool)
    /// The caller was resumed.
    case done
  }

  private(set) var state = State.initial(cancelled: false)

  enum SuspendAction {
    /// Wait for the loop (perform the block).
    case perform
    /// The task was cancelled before it suspended: resume with `.stopped` now.
    case resumeStopped(Continuation)
  }

  /// The caller suspended with `continuation`.
  mutating func suspend(_ continuation: Continuation) -> SuspendAction {
    switch state {
    case .initial(let cancelled):
      if cancelled {
        state = .done  // cancelled before it asked: never runs
        return .resumeStopped(continuation)
      }
      state = .waiting(continuation)
      return .perform
    case .waiting, .running, .done:
      preconditionFailure("AsyncRunLoop: a modal run suspended twice")
    }
  }

  /// The loop thread reached the block: true when the run may start.
  mutating func start() -> Bool {
    switch state {
    case .waiting(let continuation):
      state = .running(continuation, endRequested: false)
      return true
    case .done:
      return false  // resumed already (cancelled or abandoned): run nothing
    case .initial, .running:
      preconditionFailure("AsyncRunLoop: a modal run started twice")
    }
  }

  /// The run ended (or the request failed before it started): the continuation to resume, if the
  /// caller was not resumed already.
  mutating func finish() -> Continuation? {
    switch state {
    case .waiting(let continuation), .running(let continuation, _):
      state = .done
      return continuation
    case .initial, .done:
      return nil
    }
  }

  /// Shutdown gave up on the run before it started: the continuation to resume with the error;
  /// nil when the run started (it ends on its own: shutdown stops every run) or was resumed.
  mutating func abandon() -> Continuation? {
    switch state {
    case .waiting(let continuation):
      state = .done
      return continuation
    case .initial, .running, .done:
      return nil
    }
  }

  enum CancelAction {
    /// Nothing to do (not suspended yet: remembered; or resumed already).
    case none
    /// Not started: resume with `.stopped` now; the block will run nothing.
    case resumeStopped(Continuation)
    /// Running: wake the loop so that the run sees `isEndRequested` between passes.
    case wakeLoop
  }

  /// The caller's task was cancelled.
  mutating func cancel() -> CancelAction {
    switch state {
    case .initial:
      state = .initial(cancelled: true)
      return .none
    case .waiting(let continuation):
      state = .done
      return .resumeStopped(continuation)
    case .running(let continuation, _):
      state = .running(continuation, endRequested: true)
      return .wakeLoop
    case .done:
      return .none
    }
  }

  /// Asked by the run between passes: true ends it as `.stopped`.
  var isEndRequested: Bool {
    if case .running(_, let endRequested) = state { return endRequested }
    return false
  }
}

/// The lock and the resumptions around `ModalRunState`. Any thread.
final class ModalRunRequest: Sendable {
  typealias Continuation = CheckedContinuation<Result<RunLoopRunResult, RunLoopError>, Never>
  private let state = LockedValue(ModalRunState<Continuation>())

  func suspend(_ continuation: Continuation) -> Bool {
    switch state.withLock({ $0.suspend(continuation) }) {
    case .perform:
      return true
    case .resumeStopped(let continuation):
      continuation.resume(returning: .success(.stopped))
      return false
    }
  }

  func start() -> Bool { state.withLock { $0.start() } }

  func finish(_ result: Result<RunLoopRunResult, RunLoopError>) {
    state.withLock { $0.finish() }?.resume(returning: result)
  }

  func abandon(_ error: RunLoopError) {
    state.withLock { $0.abandon() }?.resume(returning: .failure(error))
  }

  /// Returns true when the loop must be woken (the run is in progress).
  func cancel() -> Bool {
    switch state.withLock({ $0.cancel() }) {
    case .none:
      return false
    case .resumeStopped(let continuation):
      continuation.resume(returning: .success(.stopped))
      return false
    case .wakeLoop:
      return true
    }
  }

  var isEndRequested: Bool { state.withLock { $0.isEndRequested } }
}
