/// An actor that lives on a loop thread: conform, store the loop, and every isolated method runs
/// on that loop's thread, next to its sources and timers.
///
/// ```swift
/// actor Database: LoopActor {
///   nonisolated let loop: RunLoopThread
///   init(loop: RunLoopThread) { self.loop = loop }
///   func query() { /* runs on loop's thread */ }
/// }
/// ```
///
/// ### Tasks that wait inside the actor
///
/// A task with no executor preference that suspends inside such an actor (in a sequence's `send`
/// or `next()`, a sleep, any continuation) resumes through Swift's global concurrency pool and
/// only then hops back to the loop: the runtime resumes a continuation on the task's own
/// executor, which is the global one. Measured with Swift 6.3 on Linux, with a loop and with a
/// minimal custom executor of one thread alike: while the pool's threads were blocked, a resumed
/// actor waited for them, and its executor was given no job until one was free. Start the tasks that drive the actor
/// with the loop as their preference, `Task(executorPreference: loop) { await actor.work() }`:
/// their resumption then queues on the loop directly and never waits for the pool.
public protocol LoopActor: Actor {
  /// The loop whose thread runs this actor. Must not change over the actor's life.
  nonisolated var loop: RunLoopThread { get }
}

extension LoopActor {
  /// The loop's executor.
  public nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
}

extension RunLoopThread {
  /// Starts a new thread named `name` running a new loop, for places that cannot handle an error
  /// (a global actor's stored loop, a `static let`). Every call starts another thread: it is not
  /// a lookup by name. Traps with the system error if the kernel refuses a descriptor or a thread,
  /// or `cpu` is one the thread cannot be pinned to (see `init(name:cpu:)`) — use
  /// `init(name:cpu:)` where you can handle the error. Any thread.
  ///
  /// ```swift
  /// actor Renderer: LoopActor {
  ///   nonisolated let loop: RunLoopThread = .start(named: "render")
  /// }
  /// ```
  public static func start(named name: String, cpu: Int? = nil) -> RunLoopThread {
    do {
      return try RunLoopThread(name: name, cpu: cpu)
    } catch {
      preconditionFailure("AsyncRunLoop: cannot start loop '\(name)': \(error)")
    }
  }

  /// Starts a new loop thread on every call, as `start(named:cpu:)`: the old name read like a
  /// lookup of an existing loop.
  @available(*, deprecated, renamed: "start(named:cpu:)", message: "it starts a new thread on every call")
  public static func named(_ name: String, cpu: Int? = nil) -> RunLoopThread {
    start(named: name, cpu: cpu)
  }
}
