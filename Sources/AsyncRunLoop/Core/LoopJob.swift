/// The role in which a job reached a loop, which decides how the loop runs it.
///
/// The Swift runtime decides whether an `await` must hop by comparing the executors a job runs on
/// (its serial executor and its task executor) with the ones the code wants. A job run as
/// "isolated to the loop *and* on the loop's task executor" matches neither an actor's code in a
/// task without a preference (the task executor differs) nor nonisolated code under
/// `withTaskExecutorPreference(loop)` (the serial executor differs), so every `await` in them
/// would go through the loop's job queue again. Each job therefore runs in the role it was
/// enqueued in, and the two roles have different identities so that the runtime tells them apart.
///
/// An actor's job whose task prefers the loop (`Task(executorPreference: loop)`) wants both: run
/// as `serial`, each of its hops inside the actor fails the runtime's task-executor check and the
/// task enqueues itself again on the serial role it is running in. `ExecutorJob` does not say
/// which task executor its task prefers, so the loop reads it from the enqueue: a job that
/// enqueues *itself* on the loop's serial role from inside its own run comes back as
/// `serialOnTaskExecutor` (see `LoopSerialExecutor.enqueue`), and its later hops in the actor run
/// inline. That covers a `serial` job re-enqueueing itself after a failed hop, and a `task` job —
/// a task the runtime sent to the loop because it prefers it — hopping into an actor on the loop,
/// which then needs no second trip. (A task that prefers another executor alternates between the
/// two serial roles, one re-enqueue per hop, as it would without this.)
enum JobRole {
  /// Enqueued on the loop's serial executor (an actor's job): runs isolated to it.
  case serial
  /// An actor's job that re-enqueued itself from its own run: runs isolated to the loop's serial
  /// role *and* on the loop's task executor.
  case serialOnTaskExecutor
  /// Enqueued on the loop as a task executor (a task that prefers the loop): runs nonisolated, on
  /// the loop's thread.
  case task
}

/// A job in a loop's queue, with the role it was enqueued in.
struct LoopJob {
  let job: UnownedJob
  let role: JobRole
  /// The inbox's sequence number when it arrived (see `LoopInbox.sequence`).
  var sequence: UInt64 = 0
  /// When it was enqueued (a `MetricsClock` reading), while the loop keeps metrics; else 0.
  var enqueuedAt: Int64 = 0
}
