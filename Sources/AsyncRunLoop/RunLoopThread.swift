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

/// A run loop: one thread's event loop in the CFRunLoop model (see SPEC.md and the DocC article
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
  // Safety: `name`, `poller`, `ownsThread`, `isMainLoop`, `inboxLock` and `threadLock` are
  // immutable references; `serialExecutorRole` is written once at the end of init, before the
  // loop is published, and only read afterwards. `inbox` is only touched with `inboxLock` held;
  // `threadState` only with `threadLock` held. Every other stored property below the "loop
  // thread only" mark is touched only on the loop's thread: the public entry points that use them
  // call `preconditionOnLoopThread()` (or forward to the loop thread through `inbox.controls`).

  /// The loop's name (also its thread's name, truncated to 15 bytes by the kernel).
  public let name: String
  let poller: EpollPoller
  /// True for loops created with `init(name:)`: they run on a thread of their own until shutdown.
  let ownsThread: Bool
  let isMainLoop: Bool

  // `@exclusivity(unchecked)` on the hot state below: a dynamic exclusivity check costs a
  // thread-local lookup per access, which after a wake-up was the largest user-space item left in
  // the wake-rtt profile. These properties are confined to the loop thread (or, for `inbox`, the
  // inbox lock), and the pass copies or swaps an array before calling out of the loop, so no
  // access overlaps a callout's (`runCollectedPerforms`, `fireSignalledSources`, `fireDueTimers`).
  let inboxLock = PthreadLock.make()
  @exclusivity(unchecked) var inbox = LoopInbox()

  let threadLock = PthreadLock.make()
  var threadState = ThreadState.notStarted
  /// The loop's `SerialExecutor` role (see `JobRole`). Written once, at the end of init, before
  /// the loop is visible to any other thread; only read afterwards.
  private(set) var serialExecutorRole: LoopSerialExecutor!
  let terminatedGate = BlockingGate()

  /// The owned thread's life, for joining it exactly once. The thread is never detached while
  /// the loop lives, so `shutdownAndWait()` can always join it (and a loop released without
  /// anyone joining joins, or detaches, its finished thread in `deinit`).
  enum ThreadState {
    case notStarted
    case running(pthread_t)
    /// `shutdownAndWait()` will join the thread.
    case joinerRegistered(pthread_t)
    /// The thread's work is done and nobody joined it yet.
    case finished(pthread_t)
    /// Joined (or, from `deinit` on the thread itself, detached).
    case reaped
  }

  // MARK: Loop thread only

  let modeTable = ModeTable()
  /// Jobs taken from the inbox and not yet run (oldest first, from `localJobIndex`).
  @exclusivity(unchecked) var localJobs: [LoopJob] = []
  @exclusivity(unchecked) var localJobIndex = 0
  /// Registration changes taken from the inbox, applied right after (see `applyControls`).
  @exclusivity(unchecked) var collectedControls: [() -> Void] = []
  /// Performed blocks taken from the inbox, waiting for a mode they may run in.
  @exclusivity(unchecked) var localPerforms: [PerformRequest] = []
  /// Signalled sources not in the mode being run.
  @exclusivity(unchecked) var deferredSignalled: [InputSource] = []
  @exclusivity(unchecked) var spareSignalled: [InputSource] = []
  /// Reused buffer: the sources that fire in this pass.
  @exclusivity(unchecked) var readySources: [InputSource] = []
  /// Readiness registrations by epoll token, and the live token for each descriptor number.
  @exclusivity(unchecked) var descriptorsByToken: [UInt64: DescriptorSource] = [:]
  var tokenByDescriptor: [Int32: UInt64] = [:]
  var nextToken = EpollPoller.firstRegistrationToken
  /// Sequence numbers for timer-heap entries (equal deadlines fire in scheduling order).
  var timerSequence: UInt64 = 0
  /// The mode whose descriptors are armed in epoll.
  @exclusivity(unchecked) var armedMode: RunLoopMode?
  /// Jobs scheduled through `SchedulingExecutor` (Task.sleep under the loop's preference).
  let scheduledJobCounter = LockedValue(0)
  /// Reused buffer for due timers.
  @exclusivity(unchecked) var dueTimers: [(LoopTimer, Int64, UInt64)] = []

  /// The most executor jobs one pass runs before it looks at timers and sources again.
  static let jobsPerPass = 1024

  /// Creates a loop on a new thread named `name`, which runs it (in the default mode) until
  /// `shutdown()`. Any thread.
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

  deinit {
    // Nobody joined the owned thread: reap it now (it has finished its work; on its own thread,
    // which may drop the last reference as it ends, detach instead).
    if case .finished(let thread) = threadState {
      if pthread_equal(thread, pthread_self()) != 0 {
        pthread_detach(thread)
      } else {
        pthread_join(thread, nil)
      }
    }
  }

  init(name: String, ownsThread: Bool, isMainLoop: Bool) throws(SystemCallError) {
    self.name = name
    self.ownsThread = ownsThread
    self.isMainLoop = isMainLoop
    self.poller = try EpollPoller()
    // `collectInbox` swaps these two arrays, so taking jobs allocates nothing once they are warm.
    localJobs.reserveCapacity(256)
    inbox.jobs.reserveCapacity(256)
    serialExecutorRole = LoopSerialExecutor(loop: self)
  }

  // MARK: Thread identity

  /// The loop whose thread is calling, if it has one, without creating one. Any thread.
  public static var currentIfExists: RunLoopThread? {
    if let pointer = carl_current_loop() {
      return Unmanaged<RunLoopThread>.fromOpaque(pointer).takeUnretainedValue()
    }
    if carl_is_main_thread() != 0, let main = mainIfCreated { return main.bindMainThread() }
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
  public var isOnLoopThread: Bool {
    if carl_current_loop() == Unmanaged.passUnretained(self).toOpaque() { return true }
    return isMainLoop && carl_is_main_thread() != 0 && bindMainThread() === self
  }

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
    let retained = Unmanaged.passRetained(loop).toOpaque()
    carl_set_current_loop(retained)
    // When the thread exits, the loop terminates (late jobs go to the fallback) and is released.
    _ = carl_set_thread_exit_release(retained) { pointer in
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
    let context = Unmanaged.passRetained(ThreadStart(loop: self, started: started)).toOpaque()
    var thread = pthread_t()
    let rc = pthread_create(
      &thread, &attributes,
      { raw in
        let start = Unmanaged<ThreadStart>.fromOpaque(raw!).takeRetainedValue()
        start.loop.threadMain(started: start.started)
        return nil
      }, context)
    guard rc == 0 else {
      Unmanaged<ThreadStart>.fromOpaque(context).release()
      throw SystemCallError(
        call: cpu.map { "pthread_create (loop '\(name)' pinned to cpu \($0))" } ?? "pthread_create", errno: rc)
    }
    threadLock.withLock { threadState = .running(thread) }
    started.wait()  // the loop is current on its thread before init returns
  }

  private func threadMain(started: BlockingGate) {
    _ = carl_set_thread_name(Self.kernelThreadName(name))
    carl_set_current_loop(Unmanaged.passUnretained(self).toOpaque())
    started.open()
    while true {
      _ = runLoop(mode: .default, until: .distantFuture, returnAfterSourceHandled: false, servingExecutor: true)
      if inboxLock.withLock({ inbox.lifecycle != .active }) { break }
    }
    drainForShutdown()
    carl_set_current_loop(nil)
    threadLock.withLock {
      switch threadState {
      case .running(let thread):
        threadState = .finished(thread)  // a later shutdownAndWait (or deinit) joins it
      case .notStarted, .joinerRegistered, .finished, .reaped:
        break
      }
    }
    terminatedGate.open()
  }

  /// The longest prefix of `name` the kernel keeps as a thread name: at most 15 bytes, cut
  /// between Unicode scalars. Cutting inside one would decode to U+FFFD (3 bytes), which can push
  /// the name past 15 bytes, and the kernel then refuses it (the thread stays unnamed). Pure.
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
    _ = inboxLock.withLock { inbox.beginShutdown() }
    drainForShutdown()
    terminatedGate.open()
  }

  // MARK: Cross-thread requests

  /// Runs `action` after releasing the inbox lock.
  @inline(__always)
  func perform(_ action: LoopInbox.WakeAction) {
    switch action {
    case .none: break
    case .wakeLoop(let mechanism): poller.wake(mechanism)
    }
  }

  /// Stops the innermost run of the loop (it returns `.stopped`). A stop that arrives while the
  /// loop is not running is remembered and ends the next run at once. Any thread.
  /// An owned loop's thread starts a new run after a stop; use `shutdown()` to end it.
  public func stop() {
    perform(inboxLock.withLock { inbox.stop() })
  }

  /// Wakes the loop if it sleeps, so it makes a pass. Any thread.
  public func wakeUp() {
    perform(inboxLock.withLock { inbox.wakeUp() })
  }

  /// Shuts the loop down, without waiting. Any thread; calling it again is a no-op.
  ///
  /// The loop stops its run, then drains: every executor job and performed block already
  /// accepted (and any that arrive while it drains) runs exactly once, every source, timer and
  /// observer is invalidated (sources' cancel routines run, timers' and sequences' consumers end,
  /// closures are released), and the thread exits, closing its descriptors when the loop is
  /// released. Jobs enqueued after that run on a fallback thread (see `enqueue`); `perform`
  /// refuses new blocks.
  public func shutdown() {
    // A non-owned loop's runs end now; it drains when its thread exits (or, for the main loop,
    // when `runMainLoop()` returns).
    let (_, wake) = inboxLock.withLock { inbox.beginShutdown() }
    perform(wake)
  }

  /// Shuts the loop down and waits until its thread has finished and is gone (joined). Any
  /// thread except the loop's own (there it cannot wait for itself and only starts the shutdown).
  public func shutdownAndWait() {
    guard ownsThread, !isOnLoopThread else { return shutdown() }
    let join: pthread_t? = threadLock.withLock {
      switch threadState {
      case .running(let thread), .finished(let thread):
        threadState = .joinerRegistered(thread)  // this call joins it
        return thread
      case .notStarted, .joinerRegistered, .reaped:
        return nil  // another caller joins (or joined) it: wait for the drain to end
      }
    }
    shutdown()
    if let join {
      pthread_join(join, nil)
      threadLock.withLock { threadState = .reaped }
    } else {
      terminatedGate.wait()
    }
  }

  /// True once `shutdown()` was called (or a non-owned loop's thread exited). Any thread.
  public var isShutDown: Bool { inboxLock.withLock { inbox.lifecycle != .active } }

  /// Runs `block` on the loop thread during a pass in one of `modes` (`.common` by default),
  /// waking the loop to do so. Any thread. Blocks run in the order they were performed.
  ///
  /// `modes` must name at least one mode (traps otherwise, like every API that takes a mode list):
  /// a block performed in no mode would never run, only be dropped at shutdown.
  /// - Returns: false when the loop has shut down and the block was refused (not run).
  @discardableResult
  public func perform(inModes modes: [RunLoopMode] = [.common], _ block: @escaping @Sendable () -> Void) -> Bool {
    precondition(!modes.isEmpty, Self.emptyModesMessage("perform(inModes:)", loop: name))
    guard let wake = inboxLock.withLock({ inbox.perform(PerformRequest(modes: modes, block: block)) }) else {
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
  /// run: when it is not running the call fails instead of hanging.
  ///
  /// `modes` must name at least one mode (traps otherwise, even on the loop's thread), as for
  /// `perform(inModes:_:)`.
  /// - Throws: `RunLoopError.shutDown` if the loop has shut down (or shuts down before running
  ///   it); `RunLoopError.wouldDeadlock` for the main loop when it is not running. Rethrows what
  ///   `block` throws.
  public func performAndWait<T: Sendable>(
    inModes modes: [RunLoopMode] = [.common], _ block: @escaping @Sendable () throws -> T
  ) throws -> T {
    precondition(!modes.isEmpty, Self.emptyModesMessage("performAndWait(inModes:)", loop: name))
    if isOnLoopThread { return try block() }
    if isShutDown { throw RunLoopError.shutDown(loop: name) }
    if isMainLoop && !RunLoopThread.isMainLoopRunning {
      throw RunLoopError.wouldDeadlock("performAndWait on the main loop, which the main thread is not running")
    }
    let box = ResultBox<T>()
    let gate = BlockingGate()
    let accepted = perform(inModes: modes) {
      box.set(Result { try block() })
      gate.open()
    }
    guard accepted else { throw RunLoopError.shutDown(loop: name) }
    gate.wait()
    guard let result = box.take() else { throw RunLoopError.shutDown(loop: name) }
    return try result.get()
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
    if isOnLoopThread {
      change()
      return true
    }
    guard let wake = inboxLock.withLock({ inbox.control(change) }) else { return false }
    perform(wake)
    return true
  }

  /// A source was signalled: queue it and wake the loop. Any thread.
  func enqueueSignalled(_ source: InputSource) {
    perform(inboxLock.withLock { inbox.signal(source) })
  }
}

/// What a new owned thread needs to start.
private final class ThreadStart: @unchecked Sendable {  // Safety: proof below
  // Safety: immutable after init; handed from the creating thread to the new thread once.
  let loop: RunLoopThread
  let started: BlockingGate
  init(loop: RunLoopThread, started: BlockingGate) {
    self.loop = loop
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
