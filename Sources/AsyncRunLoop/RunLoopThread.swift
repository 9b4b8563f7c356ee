import CAsyncRunLoop
import Glibc

/// Errors from loop operations that cannot be completed.
public enum RunLoopError: Error, Equatable, CustomStringConvertible {
  /// The loop has shut down (or its thread exited): it runs nothing any more.
  case shutDown(loop: String)
  /// A blocking call would wait forever: e.g. waiting on a loop that no thread is running.
  case wouldDeadlock(String)

  public var description: String {
    switch self {
    case .shutDown(let name): return "AsyncRunLoop: loop '\(name)' has shut down"
    case .wouldDeadlock(let what): return "AsyncRunLoop: \(what)"
    }
  }
}

/// A run loop: one thread's event loop in the CFRunLoop model (see the DocC article
/// "One pass of the loop"), and a Swift `SerialExecutor`/`TaskExecutor` for that thread.
///
/// Get one with `RunLoopThread(name:)` (a new thread that runs the loop until `shutdown()`),
/// `RunLoopThread.current` (the calling thread's loop, created on first use, run by that thread
/// with `run(...)`), or `RunLoopThread.main` (the process's main thread).
///
/// Thread rules, for every method: "any thread" means it is safe from any thread, including the
/// loop's own; "loop thread" means only the loop's own thread may call it (checked with a
/// precondition). Every callback (source routines, timer and observer callouts, performed blocks,
/// executor jobs) runs on the loop's thread.
public final class RunLoopThread: @unchecked Sendable {  // Safety: proof below
  // Safety: `name`, `shared` and `isStandIn` are immutable; `core` and `serialExecutorRole` are
  // written once in init, before the loop is published, and only read afterwards. The cross-thread
  // state lives in `shared` (a `LoopShared`, with its own proof); `core`'s state (a `LoopCore`) is
  // touched only on the loop's thread: the public entry points that use it call
  // `preconditionOnLoopThread()` or check `isOnLoopThread` (or forward to the loop thread through
  // the inbox).

  /// The loop's name (also its thread's name, truncated to 15 bytes by the kernel).
  public let name: String
  /// The cross-thread half (inbox, wake-up, thread bookkeeping); what members bind to.
  let shared: LoopShared
  /// The loop-thread half (modes, members, the pass). Written once in init.
  private(set) var core: LoopCore!
  /// The loop's `SerialExecutor` role (see `JobRole`). Written once, at the end of init, before
  /// the loop is visible to any other thread; only read afterwards.
  private(set) var serialExecutorRole: LoopSerialExecutor!
  /// A stand-in that a dropped loop's thread hands to callouts while it drains (see `deinit`).
  let isStandIn: Bool
  /// Jobs scheduled through `SchedulingExecutor` (Task.sleep under the loop's preference).
  let scheduledJobCounter = LockedValue(0)

  var poller: EpollPoller { shared.poller }
  /// True for loops created with `init(name:)`: they run on a thread of their own until shutdown.
  var ownsThread: Bool { shared.ownsThread }
  var isMainLoop: Bool { shared.isMainLoop }

  /// Creates a loop on a new thread named `name`, which runs it (in the default mode) until
  /// `shutdown()`, or until the last reference to the loop is released. Any thread.
  /// - Parameters:
  ///   - name: The loop's and thread's name.
  ///   - cpu: If given, the thread is pinned to this CPU from its start. It must be in
  ///     `0 ..< CPU_SETSIZE` (1024) and in the process's affinity mask (`sched_getaffinity` of the
  ///     process: the CPUs `taskset` or a cpuset allow); this is checked on the calling thread
  ///     before anything is created.
  /// - Throws: `SystemCallError` if the kernel refuses a descriptor or the thread; for a `cpu`
  ///   the thread cannot be pinned to, `EINVAL` with a `reason` naming the loop, the CPU and the
  ///   rule. Nothing is left behind when it throws: no thread, no descriptor.
  public convenience init(name: String, cpu: Int? = nil) throws(SystemCallError) {
    var pin: Int32?
    if let cpu { pin = try CPUAffinity.validatedCPU(cpu, loop: name) }
    try self.init(name: name, ownsThread: true, isMainLoop: false)
    try startThread(pinnedTo: pin)
  }

  /// Releasing the last reference to a loop that owns its thread shuts it down (as `shutdown()`):
  /// the thread drains the loop — every accepted job and block runs, every member is detached
  /// (cancel routines run) — and exits, and the loop's descriptors are closed. Callouts during
  /// that drain receive a stand-in `RunLoopThread` for the same loop (the original is gone). It
  /// does not wait for the drain. Actors and tasks that use the loop as their executor hold it,
  /// so they keep it alive.
  deinit {
    guard !isStandIn, shared.ownsThread else { return }
    // Not joined: a drain must not block whoever dropped the loop. The thread detaches itself.
    core.handleWillDeinit(makeStandIn: { RunLoopThread(standInFor: self) })
  }

  init(
    name: String, ownsThread: Bool, isMainLoop: Bool, timeSource: LoopTimeSource = .system
  ) throws(SystemCallError) {
    self.name = name
    self.isStandIn = false
    shared = LoopShared(
      name: name, ownsThread: ownsThread, isMainLoop: isMainLoop, poller: try EpollPoller(), timeSource: timeSource)
    let core = LoopCore(shared: shared)
    self.core = core
    shared.coreIfSet = core
    shared.handle = self
    serialExecutorRole = LoopSerialExecutor(loop: self)
  }

  /// A stand-in for a dropped handle: the same loop, another object (see `deinit`).
  private init(standInFor dropped: RunLoopThread) {
    name = dropped.name
    isStandIn = true
    shared = dropped.shared
    core = dropped.core
    serialExecutorRole = LoopSerialExecutor(loop: self)
  }

  // MARK: Thread identity

  /// The loop whose thread is calling, if it has one, without creating one. Any thread.
  public static var currentIfExists: RunLoopThread? {
    if let pointer = carl_current_loop() {
      return Unmanaged<LoopShared>.fromOpaque(pointer).takeUnretainedValue().handle
    }
    if carl_is_main_thread() != 0, let main = mainIfCreated, main.isOnLoopThread { return main }
    return nil
  }

  /// The calling thread's loop, created on first use (on the main thread: `RunLoopThread.main`).
  /// Any thread. The loop lives as long as its thread; only that thread may run it.
  public static var current: RunLoopThread {
    if let existing = currentIfExists { return existing }
    if carl_is_main_thread() != 0 { return main }
    return makeCurrentLoop()
  }

  /// True when the caller is on this loop's thread. Any thread. Not fooled by thread-id reuse:
  /// the check reads a thread-local slot, which a new thread starts empty.
  @inline(__always)
  public var isOnLoopThread: Bool { shared.isOnLoopThread }

  /// Traps with a clear message unless called on the loop's thread.
  @inline(__always)
  func preconditionOnLoopThread(_ function: StaticString = #function) {
    precondition(
      isOnLoopThread,
      "AsyncRunLoop: \(function) must be called on the thread of loop '\(name)'")
  }

  private static func makeCurrentLoop() -> RunLoopThread {
    let loop: RunLoopThread
    do {
      loop = try RunLoopThread(name: "current-\(carl_gettid())", ownsThread: false, isMainLoop: false)
    } catch {
      preconditionFailure("AsyncRunLoop: cannot create the current thread's loop: \(error)")
    }
    carl_set_current_loop(loop.shared.identity)
    // The thread keeps its loop; when the thread exits, the loop terminates (late jobs go to the
    // fallback) and is released.
    _ = carl_set_thread_exit_release(Unmanaged.passRetained(loop).toOpaque()) { pointer in
      guard let pointer else { return }
      let loop = Unmanaged<RunLoopThread>.fromOpaque(pointer).takeRetainedValue()
      loop.threadDidExit()
    }
    return loop
  }

  // MARK: Owned thread

  /// Starts the owned thread, pinned to `cpu` (a validated CPU number) if given. The pin is an
  /// attribute of the new thread: when the kernel refuses it, `pthread_create` fails and no thread
  /// exists (it never runs any of our code).
  func startThread(pinnedTo cpu: Int32?) throws(SystemCallError) {
    var attributes = pthread_attr_t()
    pthread_attr_init(&attributes)
    defer { pthread_attr_destroy(&attributes) }
    if let cpu {
      let rc = carl_thread_attributes_pin(&attributes, cpu)
      guard rc == 0 else { throw SystemCallError(call: "pthread_attr_setaffinity_np(cpu \(cpu))", errno: rc) }
    }
    let started = BlockingGate()
    let start = ThreadStart(core: core, handle: Unmanaged.passRetained(self), started: started)
    let context = Unmanaged.passRetained(start).toOpaque()
    var thread = pthread_t()
    let rc = pthread_create(
      &thread, &attributes,
      { raw in
        let start = Unmanaged<ThreadStart>.fromOpaque(raw!).takeRetainedValue()
        start.core.threadMain(holding: start.handle, started: start.started)
        return nil
      }, context)
    guard rc == 0 else {
      Unmanaged<ThreadStart>.fromOpaque(context).release()
      start.handle.release()
      throw SystemCallError(
        call: cpu.map { "pthread_create (loop '\(name)' pinned to cpu \($0))" } ?? "pthread_create", errno: rc)
    }
    shared.threadLock.withLock { shared.threadState = .running(thread) }
    started.wait()  // the loop is current on its thread before init returns
  }

  /// The longest prefix of `name` the kernel keeps as a thread name: at most 15 bytes, cut
  /// between Unicode scalars. Cutting inside one would decode to U+FFFD (3 bytes), which can push
  /// the name past 15 bytes, and the kernel then refuses it (the thread stays unnamed). Pure.
  /// Names the calling thread for the kernel (what `top -H`, `ps -L` and debuggers show): `name`
  /// cut to the kernel's 15 bytes. For this package's other targets too (the Foundation bridge's
  /// threads). The calling thread only.
  package static func nameCallingThread(_ name: String) {
    _ = carl_set_thread_name(kernelThreadName(name))
  }

  static func kernelThreadName(_ name: String) -> String {
    var bytes = 0
    var kept = String.UnicodeScalarView()
    for scalar in name.unicodeScalars {
      bytes += UTF8.width(scalar)
      guard bytes <= 15 else { break }
      kept.append(scalar)
    }
    return String(kept)
  }

  /// A non-owned loop's thread exited: nothing will run the loop any more.
  private func threadDidExit() {
    // The drain runs jobs on this thread, like a run: a `shutdown()` racing it must not hand them
    // to the fallback meanwhile, and a run nested in one of them is not the outermost.
    _ = shared.arrive {
      shared.inbox.setThreadIsInRun(true)
      shared.publishIsolationLocked()
      return shared.inbox.beginShutdown()
    }
    core.runDepth += 1
    core.drainForShutdown()
    shared.terminatedGate.open()
  }

  // MARK: Cross-thread requests

  /// Runs `action` after releasing the inbox lock.
  @inline(__always)
  func perform(_ action: LoopInbox.WakeAction) {
    shared.perform(action)
  }

  /// Stops the innermost run of the loop (it returns `.stopped`). A stop that arrives while the
  /// loop is not running is remembered and ends the next run at once. Any thread.
  /// An owned loop's thread starts a new run after a stop; use `shutdown()` to end it.
  public func stop() {
    perform(shared.arrive { shared.inbox.stop() })
  }

  /// Wakes the loop if it sleeps, so it makes a pass. Any thread.
  public func wakeUp() {
    perform(shared.arrive { shared.inbox.wakeUp() })
  }

  /// Shuts the loop down, without waiting. Any thread; calling it again is a no-op.
  ///
  /// The loop stops its run, then drains: every executor job and performed block already
  /// accepted (and any that arrive while it drains) runs exactly once, every source, timer and
  /// observer is invalidated (sources' cancel routines run, timers' and sequences' consumers end,
  /// closures are released), and the thread exits, closing its descriptors when the loop is
  /// released. Jobs enqueued after that run on a fallback thread (see `enqueue`); `perform`
  /// refuses new blocks.
  ///
  /// A loop that does not own its thread (`RunLoopThread.current`, `RunLoopThread.main`) is
  /// drained by that thread, not by the caller: its runs end now (and any run started later ends at
  /// once), and it drains when its thread exits (the main loop: before `runMainLoop()` returns).
  /// A current loop's jobs do not wait for that: as soon as its thread is out of a run (now, or
  /// when the run it is in ends), the jobs it accepted and every later one run on the fallback,
  /// in order, still isolated to the loop. The main loop's jobs wait for the main thread, which
  /// they need. At the same moment a `Task.sleep` scheduled on its timers moves elsewhere (it
  /// completes at its deadline) and a sleep on its `clock` throws `CancellationError`, and blocked
  /// `performAndWait` callers whose block has not started throw `RunLoopError.shutDown`. What
  /// only the loop's thread can do still waits for it: detaching the members (cancel routines,
  /// closing deliveries, ending sequences' consumers).
  public func shutdown() {
    // A non-owned loop's runs end now; it drains when its thread exits (or, for the main loop,
    // when `runMainLoop()` returns). A current loop's jobs go to the fallback at once if its
    // thread is out of a run, else when the thread leaves its run.
    let (wake, diverted) = shared.arrive { () -> (LoopInbox.WakeAction, LoopShared.DivertedJobs) in
      let wake = shared.inbox.beginShutdown().wake
      return (wake, shared.divertJobsLocked(for: self))
    }
    diverted.finish(for: self)
    perform(wake)
    if isMainLoop { MainLoopControl.shutDown() }
  }

  /// Shuts the loop down and waits until its thread has finished and is gone (joined). Any
  /// thread except the loop's own (there it cannot wait for itself and only starts the shutdown).
  ///
  /// From another loop's thread it also only starts the shutdown when this loop's thread is
  /// itself blocked until the caller's loop is done, directly or through other loops (in
  /// `shutdownAndWait()` or `performAndWait` of the caller's loop): waiting would deadlock both.
  /// Two loops shutting each other down at once (two loops of a `LoopGroup` calling its
  /// `shutdownAndWait()`) therefore both return; one of them may not have finished yet.
  ///
  /// A loop that does not own its thread (`RunLoopThread.current`, `RunLoopThread.main`) has no
  /// thread of its own to wait for: this only starts the shutdown, as `shutdown()`, and returns at
  /// once; that loop drains when its thread exits (the main loop: before `runMainLoop()` returns).
  public func shutdownAndWait() {
    guard ownsThread, !isOnLoopThread else { return shutdown() }
    // A loop thread waiting here waits for this loop (`CalloutWaits`): a closing drain of this
    // loop that waits for the caller's loop sees the cycle and gives up. Checked and recorded in
    // one step, so that of two loops shutting each other down at once, one sees the other's wait.
    let waiter = RunLoopThread.currentIfExists?.shared
    if let waiter, !CalloutWaits.beginUnlessDeadlocked(waiter: waiter, target: shared) { return shutdown() }
    defer { if let waiter { CalloutWaits.end(waiter: waiter) } }
    let join: pthread_t? = shared.threadLock.withLock {
      switch shared.threadState {
      case .running(let thread), .finished(let thread):
        shared.threadState = .joinerRegistered(thread)  // this call joins it
        return thread
      case .notStarted, .joinerRegistered, .reaped:
        return nil  // another caller joins (or joined) it: wait for the drain to end
      }
    }
    shutdown()
    if let join {
      pthread_join(join, nil)
      shared.threadLock.withLock { shared.threadState = .reaped }
    } else {
      shared.terminatedGate.wait()
    }
  }

  /// True once `shutdown()` was called (or a non-owned loop's thread exited). Any thread.
  public var isShutDown: Bool { shared.isShutDown }

  /// Runs `block` on the loop thread during a pass in one of `modes` (`.common` by default),
  /// waking the loop to do so. Any thread. Blocks run in the order they were performed.
  ///
  /// `modes` must name at least one mode (traps otherwise, like every API that takes a mode list):
  /// a block performed in no mode would never run, only be dropped at shutdown.
  /// - Returns: false when the loop has shut down and the block was refused (not run).
  @discardableResult
  public func perform(inModes modes: [RunLoopMode] = [.common], _ block: @escaping @Sendable () -> Void) -> Bool {
    precondition(!modes.isEmpty, Self.emptyModesMessage("perform(inModes:)", loop: name))
    guard let wake = shared.arrive({ shared.inbox.perform(PerformRequest(modes: modes, block: block)) })
    else {
      return false
    }
    perform(wake)
    return true
  }

  /// Runs `block` on the loop thread and waits for it to finish, returning its result.
  /// On the loop's own thread it runs inline at once (no deadlock). Any thread.
  ///
  /// As in CF, a loop that is not an owned loop thread runs the block when its thread next runs
  /// it: the caller blocks until then. The exception is the main loop, which nothing else could
  /// run: when it is not running the call fails instead of hanging. A `RunLoopThread.current`
  /// loop shut down before the block started, while its thread is out of a run (or when it leaves
  /// the run it is in), releases the caller with `RunLoopError.shutDown` and skips the block,
  /// rather than keeping it until the thread exits.
  ///
  /// `modes` must name at least one mode (traps otherwise, even on the loop's thread), as for
  /// `perform(inModes:_:)`.
  /// - Throws: `RunLoopError.shutDown` if the loop has shut down (or shuts down before running
  ///   it); `RunLoopError.wouldDeadlock` for the main loop when it is not running, and (without
  ///   performing the block) when called on a loop thread that this loop is, directly or through
  ///   other loops, waiting for (in `performAndWait` or `LoopTimer.invalidateAndWait()`): the wait
  ///   could never end. Rethrows what `block` throws.
  public func performAndWait<T: Sendable>(
    inModes modes: [RunLoopMode] = [.common], _ block: @escaping @Sendable () throws -> T
  ) throws -> T {
    precondition(!modes.isEmpty, Self.emptyModesMessage("performAndWait(inModes:)", loop: name))
    if isOnLoopThread { return try block() }
    if isShutDown { throw RunLoopError.shutDown(loop: name) }
    if isMainLoop { return try performAndWaitOnMain(inModes: modes, block) }
    if shared.divertsJobsAtShutdown { return try performAndWaitOnCurrentLoop(inModes: modes, block) }
    let box = ResultBox<T>()
    let gate = BlockingGate()
    return try CalloutWaits.whileWaiting(for: shared, "performAndWait", until: gate) { () throws -> T in
      let accepted = perform(inModes: modes) {
        box.set(Result { try block() })
        gate.open()
      }
      guard accepted else { throw RunLoopError.shutDown(loop: name) }
      gate.wait()
      guard let result = box.take() else { throw RunLoopError.shutDown(loop: name) }
      return try result.get()
    }
  }

  /// `performAndWait` on the main loop from another thread: the caller registers as a waiter the
  /// main loop releases when it stops running (`runMainLoop()` returns, its last run ends) before
  /// the block started, so the call throws instead of hanging; the block is then skipped.
  private func performAndWaitOnMain<T: Sendable>(
    inModes modes: [RunLoopMode], _ block: @escaping @Sendable () throws -> T
  ) throws -> T {
    let notRunning = RunLoopError.wouldDeadlock("performAndWait on the main loop, which the main thread is not running")
    let waiter = MainCallWaiter<T>()
    return try CalloutWaits.whileWaiting(for: shared, "performAndWait", until: waiter.gate) { () throws -> T in
      guard let ticket = MainLoopControl.register(waiter) else { throw notRunning }
      defer { MainLoopControl.unregister(ticket) }
      let accepted = perform(inModes: modes) {
        guard waiter.begin() else { return }  // abandoned: the caller was told it did not run
        waiter.finish(Result { try block() })
      }
      guard accepted else { throw RunLoopError.shutDown(loop: name) }
      guard let result = waiter.wait() else {
        throw RunLoopError.wouldDeadlock(
          "performAndWait: the main loop stopped running before the block ran; it will not run")
      }
      return try result.get()
    }
  }

  /// `performAndWait` on a `RunLoopThread.current` loop from another thread: the caller blocks
  /// until the loop's thread runs the block, unless the loop is shut down while its thread is out
  /// of a run (or leaves the run it is in) before the block started: then the call throws and the
  /// block is skipped, instead of waiting for the thread to exit.
  private func performAndWaitOnCurrentLoop<T: Sendable>(
    inModes modes: [RunLoopMode], _ block: @escaping @Sendable () throws -> T
  ) throws -> T {
    let waiter = MainCallWaiter<T>()
    return try CalloutWaits.whileWaiting(for: shared, "performAndWait", until: waiter.gate) { () throws -> T in
      guard shared.registerHandOff(waiter, { waiter.abandon() }) else { throw RunLoopError.shutDown(loop: name) }
      defer { shared.unregisterHandOff(waiter) }
      let accepted = perform(inModes: modes) {
        guard waiter.begin() else { return }  // abandoned: the caller was told it did not run
        waiter.finish(Result { try block() })
      }
      guard accepted else { throw RunLoopError.shutDown(loop: name) }
      guard let result = waiter.wait() else { throw RunLoopError.shutDown(loop: name) }
      return try result.get()
    }
  }

  /// The trap message for an empty `modes` list passed to `function`.
  static func emptyModesMessage(_ function: String, loop: String) -> String {
    "AsyncRunLoop: \(function) on loop '\(loop)' needs at least one mode in 'modes' (a block performed in no mode "
      + "would never run)"
  }

  /// Sends a registration change to the loop thread: at once when called there, otherwise on
  /// the loop's next pass. Returns false when the loop has terminated.
  @discardableResult
  func onLoopThread(_ change: @escaping () -> Void) -> Bool {
    shared.onLoopThread { _ in change() }
  }
}

/// What a new owned thread needs to start.
private final class ThreadStart: @unchecked Sendable {  // Safety: proof below
  // Safety: immutable after init; handed from the creating thread to the new thread once.
  let core: LoopCore
  /// One reference to the handle, which the thread holds while it is awake (see
  /// `LoopCore.releaseHandleForSleep`).
  let handle: Unmanaged<RunLoopThread>
  let started: BlockingGate
  init(core: LoopCore, handle: Unmanaged<RunLoopThread>, started: BlockingGate) {
    self.core = core
    self.handle = handle
    self.started = started
  }
}

/// A result handed from the loop thread to a blocked waiter.
final class ResultBox<T: Sendable>: @unchecked Sendable {  // Safety: proof below
  // Safety: `value` is only touched with `lock` held.
  private let lock = PthreadLock.make()
  private var value: Result<T, any Error>?
  func set(_ result: Result<T, any Error>) { lock.withLock { value = result } }
  func take() -> Result<T, any Error>? { lock.withLock { value } }
}
