import CAsyncRunLoop
import Dispatch

/// Each loop is a `SerialExecutor` and a `TaskExecutor`: jobs run on the loop's thread, in the
/// order they were enqueued, interleaved with its sources and timers (at most `jobsPerPass` per
/// pass). Jobs run in every mode, so actors on the loop keep working during a nested modal run.
///
/// To start a task on the loop, use the standard spelling, `Task(executorPreference: loop) { … }`
/// (or `withTaskExecutorPreference(loop) { … }` for structured work). There is deliberately no
/// `loop.task { … }` shorthand: it would save a few characters but hide that the task is
/// unstructured (nobody cancels or awaits it unless the caller keeps the handle), that the
/// preference is inherited by its child tasks, and that it is the same API a reader already knows
/// from any other `TaskExecutor`; a second spelling of it would also need its own overloads for
/// priority, task names and throwing bodies to keep up with the standard one.
extension RunLoopThread: SerialExecutor, TaskExecutor {
  /// Enqueues a job of a task that prefers this loop (the loop is the task-executor identity;
  /// actors' jobs arrive through `asUnownedSerialExecutor()`, see `JobRole`). Any thread. From
  /// another thread it costs at most one (coalesced) wake-up — a futex wake, or an eventfd write when
  /// the loop watches descriptors or timers; from the loop's own thread none.
  ///
  /// A job is never dropped: after the loop has terminated (shut down and drained, or its thread
  /// exited) the job runs on a process-wide fallback serial queue instead, still isolated to this
  /// executor (so an actor's calls keep running one at a time, and `checkIsolated` accepts them),
  /// and a warning is printed once per loop.
  public func enqueue(_ job: consuming ExecutorJob) {
    enqueue(UnownedJob(job), role: .task)
  }

  /// Enqueues a job in `role` (the loop's serial role, or its task-executor role). Any thread.
  func enqueue(_ job: UnownedJob, role: JobRole) {
    let stamp = shared.observation.arrivalStamp()
    switch shared.arrive({ shared.inbox.enqueue(LoopJob(job: job, role: role, enqueuedAt: stamp)) }) {
    case .accepted(let wake):
      perform(wake)
    case .runElsewhere:
      FallbackExecution.run(job, role: role, for: self)
    }
  }

  /// The loop's serial-executor role: a separate identity from the loop itself (its task-executor
  /// role), so that actors on the loop and tasks that prefer the loop both run without hopping on
  /// every `await` (see `JobRole`). Actors pinned to the loop use this.
  public func asUnownedSerialExecutor() -> UnownedSerialExecutor {
    serialExecutorRole.asUnownedSerialExecutor()
  }

  public func asUnownedTaskExecutor() -> UnownedTaskExecutor {
    UnownedTaskExecutor(ordinary: self)
  }

  /// Traps unless the caller runs on this loop (its thread, or the fallback queue running this
  /// terminated loop's late jobs), with a message naming the loop and the calling thread (its
  /// name and kernel thread id, and its loop if it has one). Any thread.
  ///
  /// This is also the message of every failed isolation trap of actors on the loop
  /// (`actor.assumeIsolated`, `preconditionIsolated`, a global actor's dynamic checks): the
  /// runtime calls it because the executor role those actors use answers "unknown" rather than
  /// "no" off the loop (see `LoopSerialExecutor.isIsolatingCurrentContext()`).
  public func checkIsolated() {
    guard isIsolatingCurrentContext() != true else { return }
    if isOnLoopThread {
      preconditionFailure(
        "AsyncRunLoop: expected to be isolated to loop '\(name)', but its thread, \(Self.describeCallingThread()), "
          + "is not isolated to it now: the loop has shut down and its jobs run on the fallback queue, or it is a "
          + "RunLoopThread.current loop whose thread is outside any of its runs")
    }
    preconditionFailure(
      "AsyncRunLoop: expected to run on loop '\(name)', but running on \(Self.describeCallingThread())")
  }

  /// True on this loop's thread (or the fallback running this loop's late jobs), false elsewhere:
  /// a definite answer for code that asks the loop directly. Any thread.
  ///
  /// At every moment a loop's jobs run in one place, and only that place counts as isolated.
  /// Until shutdown has drained the loop, that is the loop's thread. Once its jobs leave for the
  /// fallback — when an owned or the main loop terminates, after its thread's last callout, or when
  /// a shut-down `RunLoopThread.current` loop's thread is out of a run (see `shutdown()`) — only the
  /// fallback is isolated to it: the thread answers false from then on (in its own code, in runs it
  /// starts and in the drain when it exits), so that code there cannot assume the isolation of an
  /// actor whose jobs run on the fallback meanwhile. Because a `RunLoopThread.current` loop's jobs
  /// may leave at any instant its thread is out of a run (a `shutdown()` from another thread), its
  /// thread answers true only inside one of the loop's runs (its callouts, blocks and jobs), never
  /// in the thread's own code between runs. The main thread and an owned loop's thread answer true
  /// in and out of runs until their loop terminates.
  ///
  /// Actors on the loop do not use this identity (see `asUnownedSerialExecutor()`); the runtime
  /// asks their executor role, which answers true or nil (see
  /// `LoopSerialExecutor.isIsolatingCurrentContext()`).
  public func isIsolatingCurrentContext() -> Bool? {
    if isOnLoopThread { return shared.loopThreadIsIsolated }
    return FallbackExecution.isRunning(for: self)
  }

  /// The calling thread for a trap message: `thread 'name' (tid 123)`, plus the loop it runs.
  static func describeCallingThread() -> String {
    var buffer = [CChar](repeating: 0, count: 32)
    let named = carl_get_thread_name(&buffer, buffer.count) == 0
    let threadName =
      named ? String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self) : "?"
    var description = "thread '\(threadName)' (tid \(carl_gettid()))"
    if let loop = currentIfExists { description += ", the thread of loop '\(loop.name)'" }
    return description
  }

}

/// Runs jobs that reach a loop after it terminated, so that no awaiting task hangs and no job is
/// dropped. One serial queue for the process: a terminated loop's actors keep their one-at-a-time
/// guarantee.
enum FallbackExecution {
  private static let queue: DispatchQueue = {
    let queue = DispatchQueue(label: "AsyncRunLoop.fallback")
    queue.setSpecific(key: onQueueKey, value: true)
    return queue
  }()
  private static let onQueueKey = DispatchSpecificKey<Bool>()
  private static let state = LockedValue(FallbackState())

  private struct FallbackState {
    var warned = Set<ObjectIdentifier>()
    /// The loop whose job the fallback queue is running now.
    var running: ObjectIdentifier?
  }

  static func run(_ job: UnownedJob, role: JobRole, for loop: RunLoopThread) {
    warnOnce(for: loop)
    dispatch(job, role: role, for: loop)
  }

  /// Prints, once per loop, that its late jobs run here. Not under any lock of the loop (I/O).
  static func warnOnce(for loop: RunLoopThread) {
    let firstWarning = state.withLock { $0.warned.insert(ObjectIdentifier(loop)).inserted }
    if firstWarning {
      print("AsyncRunLoop: loop '\(loop.name)' has shut down; its late jobs run on a fallback queue")
    }
  }

  /// Queues `job` on the fallback queue (a non-blocking enqueue: the terminating loop calls it
  /// under its inbox lock, so that jobs enqueued later queue behind its leftovers).
  static func dispatch(_ job: UnownedJob, role: JobRole, for loop: RunLoopThread) {
    let serial = loop.asUnownedSerialExecutor()
    let task = loop.asUnownedTaskExecutor()
    let identifier = ObjectIdentifier(loop)
    queue.async {
      state.withLock { $0.running = identifier }
      switch role {
      case .serial, .serialOnTaskExecutor: job.runSynchronously(on: serial)
      case .task: job.runSynchronously(on: task)
      }
      state.withLock { $0.running = nil }
      withExtendedLifetime(loop) {}
    }
  }

  static func isRunning(for loop: RunLoopThread) -> Bool {
    // Only meaningful on the fallback queue itself; elsewhere `running` belongs to another thread.
    guard loop.isShutDown else { return false }
    let identifier = ObjectIdentifier(loop)
    return DispatchQueue.getSpecific(key: onQueueKey) == true && state.withLock { $0.running == identifier }
  }
}
