import AsyncRunLoop
import CoreFoundation
import Dispatch
import Foundation

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// A Foundation run-loop thread as a Swift `SerialExecutor` and `TaskExecutor`: jobs run on that
/// thread, between its run loop's timers, sources and performed blocks, in the order they were
/// enqueued.
///
/// Jobs reach the thread as blocks (`CFRunLoopPerformBlock` in the common modes, then
/// `CFRunLoopWakeUp`; Foundation's `RunLoop.perform` alone does not wake a sleeping loop), one
/// block per burst. So they run while the thread runs its run loop (`RunLoop.current.run()`,
/// `CFRunLoopRun()`, `run(mode:before:)`) in the default mode or another common mode; during a
/// modal run in a private mode they wait, as `@MainActor` work does on the main thread.
///
/// Pin an actor to it:
///
/// ```swift
/// let executor = CFRunLoopExecutor.startThread(name: "network")
/// actor Connection {
///   nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }
/// }
/// ```
///
/// `shutdown()` loses no job: every job accepted before the final drain ran runs on the thread;
/// jobs enqueued after it run, in order, on a serial fallback queue (isolated to this executor
/// there too, and no longer on the thread). Nor does a thread that exits first (see `init()`),
/// before `shutdown()` or before its final drain ran: the final drain runs on the fallback queue.
///
/// A job may run the thread's run loop itself (`RunLoop.current.run(until:)`, a nested run): no
/// other job of the executor starts until it returns, and a `shutdown()` meanwhile waits for it
/// (its final drain runs once the job has returned, so it neither runs jobs under it nor stops
/// the nested run). So, as with any job that never returns, a job that runs the loop with no end
/// (`CFRunLoopRun()`) keeps the executor from ever terminating.
public final class CFRunLoopExecutor: SerialExecutor, TaskExecutor, @unchecked Sendable {  // Safety: proof below
  // Safety: `thread`, `ownsThread`, `fallback` and `fallbackKey` are immutable after init; the
  // mutable state is `inbox` (which holds the thread's run loop; a CFRunLoop may be used from any
  // thread for PerformBlock, WakeUp and Stop, the calls made here from other threads) and
  // `members`, each under its own lock, and `jobOnStack` and `finalDrainWaits`, which only the
  // executor's thread touches (in its drain blocks).
  private let thread: pthread_t
  private let ownsThread: Bool
  private let inbox: BridgeLock<CFRunLoopExecutorInbox<UnownedJob, CFRunLoop>>
  private let members = BridgeLock(ExecutorMembers())
  private let fallback: DispatchQueue
  private let fallbackKey = DispatchSpecificKey<Bool>()
  /// Thread only: a job is running on the thread now (a run nested in it must not start another
  /// job, nor end the executor under it).
  private var jobOnStack = false
  /// Thread only: the final drain came up in a run nested in a job; the drain running that job
  /// does it once the job has returned.
  private var finalDrainWaits = false

  /// The executor of the calling thread's run loop. That thread must run its run loop for jobs to
  /// run (see the type's comment), and keep running it until the executor has terminated: create
  /// the executor on the thread, then call `runUntilTerminated()` (or run the loop yourself, in
  /// the default mode or another common mode; nothing stops a run of yours when the executor
  /// terminates).
  ///
  /// A thread that exits before the executor has terminated ends it as `shutdown()` would, off
  /// the thread: the jobs still queued run first, in order, on the fallback queue, then every later
  /// one; its timer and source sequences end. (Not promised for the main thread: returning from
  /// `main` ends the process, and `dispatchMain()` parks the thread as it exits, before or after
  /// this hand-over.)
  /// Jobs queued on a thread that is alive but has stopped running its loop for good wait for
  /// ever. So do those of an executor made on a thread that never runs its loop, such as a thread
  /// of Swift's cooperative pool, until that thread exits (a pool thread retires when it has been
  /// idle for a while, if it ever is): do not make one there. Any thread.
  public convenience init() {
    self.init(ownsThread: false)
  }

  private init(ownsThread: Bool) {
    inbox = BridgeLock(CFRunLoopExecutorInbox(runLoop: CFRunLoopGetCurrent()))
    thread = pthread_self()
    self.ownsThread = ownsThread
    fallback = DispatchQueue(label: "AsyncRunLoopFoundation.CFRunLoopExecutor.fallback")
    fallback.setSpecific(key: fallbackKey, value: true)
    ExecutorThreadExit.register(self)
  }

  /// Starts a Foundation `Thread` named `name` that runs its run loop (in the default mode)
  /// until `shutdown()`, and returns its executor once the thread is running. Any thread.
  public static func startThread(name: String) -> CFRunLoopExecutor {
    let started = BridgeLock<CFRunLoopExecutor?>(nil)
    let ready = DispatchSemaphore(value: 0)
    let thread = Thread {
      // swift-corelibs-foundation hands a `Thread.name` to the kernel only once it has recorded
      // the thread's pthread, which `start()` does after the thread may already run: the kernel's
      // name is set here, by the thread itself.
      RunLoopThread.nameCallingThread(name)
      let executor = CFRunLoopExecutor(ownsThread: true)
      started.withLock { $0 = executor }
      ready.signal()
      executor.runLoopUntilTerminated()
    }
    thread.name = name  // Foundation's own record, read before it knows the thread's pthread
    thread.start()
    ready.wait()
    guard let executor = started.withLock({ $0 }) else { preconditionFailure("unreachable: the thread publishes it") }
    return executor
  }

  /// Runs the calling thread's run loop, in the default mode, until the executor has terminated
  /// (the final drain of `shutdown()` has run), then returns: how a thread serves an executor it
  /// made with `init()` (a thread made by `startThread` does this already). Returns at once when
  /// the executor has terminated; until `shutdown()` is called (from another thread, or from a job
  /// of the executor) it does not return. Runs nested in the loop's callouts are left alone.
  ///
  /// Call it on the executor's thread, outside its jobs: it traps on another thread, and in a job
  /// (where it could never return: no other job runs while one is on the thread, and the final
  /// drain waits for the job).
  @available(*, noasync, message: "a task on the executor's thread is one of its jobs")
  public func runUntilTerminated() {
    precondition(
      inbox.withLock({ $0.runLoop }).map { CFEqual(CFRunLoopGetCurrent(), $0) } == true,
      "AsyncRunLoopFoundation: runUntilTerminated() runs the executor's run loop: call it on the executor's thread")
    precondition(
      !jobOnStack,
      "AsyncRunLoopFoundation: runUntilTerminated() called in one of the executor's jobs would never return")
    runLoopUntilTerminated()
  }

  /// The run loop until the executor has terminated. A source that never fires keeps the default
  /// mode from being empty (CF returns at once from an empty mode).
  ///
  /// The final drain's `CFRunLoopStop` ends the innermost run: when that is a run nested in a
  /// callout (a Foundation timer's handler that runs the loop), this outer run would sleep on. So
  /// an observer counts the runs entered from here and, once the executor has terminated, stops
  /// this one (the outermost) before it would sleep; runs nested deeper are left alone.
  private func runLoopUntilTerminated() {
    let runLoop = CFRunLoopGetCurrent()
    var context = CFRunLoopSourceContext()
    context.perform = { _ in }
    guard let keepAlive = CFRunLoopSourceCreate(nil, 0, &context) else {
      preconditionFailure("AsyncRunLoopFoundation: CFRunLoopSourceCreate failed")
    }
    CFRunLoopAddSource(runLoop, keepAlive, CFPlatform.commonModes)
    let activities =
      CFRunLoopActivity.entry.rawValue | CFRunLoopActivity.exit.rawValue | CFRunLoopActivity.beforeWaiting.rawValue
    let depth = RunDepth()
    // Captures the inbox, not the executor: no cycle through the run loop if the thread ends
    // without returning here.
    let stopper = CFRunLoopObserverCreateWithHandler(nil, activities, true, 0) { [inbox] _, activity in
      switch activity {
      case .entry: depth.value += 1
      case .exit: depth.value -= 1
      default:
        if depth.value == 1 && inbox.withLock({ $0.lifecycle }) == .terminated { CFRunLoopStop(CFRunLoopGetCurrent()) }
      }
    }
    CFRunLoopAddObserver(runLoop, stopper, CFPlatform.commonModes)
    while inbox.withLock({ $0.lifecycle }) != .terminated {
      _ = CFRunLoopRunInMode(CFPlatform.defaultMode, 1e9, false)
    }
    CFRunLoopObserverInvalidate(stopper)
    CFRunLoopSourceInvalidate(keepAlive)
  }

  // MARK: Executor

  /// Any thread.
  public func enqueue(_ job: consuming ExecutorJob) {
    let unowned = UnownedJob(job)
    switch inbox.withLock({ $0.enqueue(unowned) }) {
    case .none: break
    case .scheduleDrain(let runLoop): scheduleDrain(on: runLoop)
    case .runElsewhere: fallback.async { self.run(unowned) }
    }
  }

  public func asUnownedSerialExecutor() -> UnownedSerialExecutor {
    UnownedSerialExecutor(ordinary: self)
  }

  public func asUnownedTaskExecutor() -> UnownedTaskExecutor {
    UnownedTaskExecutor(ordinary: self)
  }

  /// True on the executor's thread until the final drain of `shutdown()` has run (or the thread
  /// has exited), and on its fallback queue from then on; nil — "unknown", so the runtime calls
  /// `checkIsolated()`, which traps — elsewhere. Any thread.
  public func isIsolatingCurrentContext() -> Bool? {
    isOnExecutor ? true : nil
  }

  /// Traps unless called where `isIsolatingCurrentContext()` is true.
  public func checkIsolated() {
    precondition(
      isOnExecutor,
      "AsyncRunLoopFoundation: expected to run on the CFRunLoopExecutor's thread (or, after its shutdown, its "
        + "fallback queue), but ran elsewhere")
  }

  /// Once terminated, or once its thread has exited, the thread is no longer the executor's: the
  /// fallback queue runs its jobs, and a later thread may reuse the exited thread's `pthread_t` (a
  /// worker of the fallback queue itself, for one).
  private var isOnExecutor: Bool {
    if pthread_equal(pthread_self(), thread) != 0, inbox.withLock({ $0.jobsRunOnTheThread }) { return true }
    return DispatchQueue.getSpecific(key: fallbackKey) == true
  }

  private func run(_ job: UnownedJob) {
    job.runSynchronously(isolatedTo: asUnownedSerialExecutor(), taskExecutor: asUnownedTaskExecutor())
  }

  // MARK: Draining on the thread

  private func scheduleDrain(on runLoop: CFRunLoop) {
    CFRunLoopPerformBlock(runLoop, CFPlatform.performMode(CFPlatform.commonModes)) { self.drain() }
    CFRunLoopWakeUp(runLoop)
  }

  /// On the thread: runs the jobs queued now, in order; schedules another drain for those that
  /// arrive meanwhile (the run loop serves its timers and sources in between).
  ///
  /// In a run nested in a job (the job runs the run loop itself), a drain block does nothing: one
  /// job at a time, as on the main actor. While a drain runs no other is scheduled, so the blocks
  /// that can come up there are those scheduled while the final drain ran jobs; the drain running
  /// the job looks at the queue again once the job returns.
  private func drain() {
    guard !jobOnStack else { return }
    runOnThread(inbox.withLock({ $0.takeJobs() }))
    if finalDrainWaits {
      finalDrainWaits = false
      finalDrain()
    } else if let runLoop = inbox.withLock({ $0.finishDrain() }) {
      scheduleDrain(on: runLoop)
    }
  }

  /// On the thread: runs `jobs` in order, marked as on the stack.
  private func runOnThread(_ jobs: [UnownedJob]) {
    jobOnStack = true
    defer { jobOnStack = false }
    for job in jobs { run(job) }
  }

  // MARK: Shutdown

  /// Ends the executor: a final block on the thread (on the fallback queue if the thread exits
  /// before it ran) runs every job accepted until the queue is empty, and from then on jobs run
  /// on the fallback queue; its timer and source sequences end (what they buffered is still
  /// delivered); a thread made by `startThread` then leaves its run loop and exits. Any thread;
  /// idempotent; does not wait.
  public func shutdown() {
    guard let runLoop = inbox.withLock({ $0.beginShutdown() }) else { return }
    CFRunLoopPerformBlock(runLoop, CFPlatform.performMode(CFPlatform.commonModes)) { self.finalDrain() }
    CFRunLoopWakeUp(runLoop)
  }

  /// On the thread. In a run nested in a job, it waits for that job to return (the drain running
  /// the job does it then): it neither starts jobs under it nor stops the nested run.
  private func finalDrain() {
    guard !jobOnStack else {
      finalDrainWaits = true
      return
    }
    drainUntilTerminated(runOnThread)
    if ownsThread { CFRunLoopStop(CFRunLoopGetCurrent()) }
  }

  /// The executor's thread is exiting (`ExecutorThreadExit`, on that thread) before the final
  /// drain: the final drain runs on the fallback queue instead, first in its order, so the jobs
  /// still queued, and those enqueued until the queue is empty, run before every later job.
  ///
  /// Also after the termination, the executor lets go of the thread's run loop here (the
  /// fallback's final drain holds it until the sequences have ended): a drain block left on it
  /// would never run, and holds the executor, which held the loop.
  func threadExited() {
    let exit = inbox.withLock { $0.threadExited() }
    guard exit.drainsOnFallback else { return }
    // The drain holds the loop until the sequences have ended (their members reach into it).
    let loop = CFReference(object: exit.releasedLoop)
    fallback.async {
      withExtendedLifetime(loop) {
        self.drainUntilTerminated { jobs in for job in jobs { self.run(job) } }
      }
    }
  }

  /// The thread's run loop, for a timer or source sequence to join; nil once the thread has exited
  /// (the executor is terminated or terminating then: the sequence ends). Any thread.
  var threadRunLoop: CFRunLoop? { inbox.withLock { $0.runLoop } }

  /// Runs the queued jobs (with `runJobs`) until the queue is found empty, which terminates the
  /// executor; then ends its sequences. On the thread, or on the fallback queue once it has exited.
  private func drainUntilTerminated(_ runJobs: ([UnownedJob]) -> Void) {
    while !inbox.withLock({ $0.terminateIfIdle() }) {
      runJobs(inbox.withLock({ $0.takeJobs() }))
    }
    for end in members.withLock({ $0.end() }) { end() }
  }

  // MARK: Sequences

  /// A timer or source sequence joins the executor: false once it has terminated (the sequence
  /// then ends at once). `ender` runs at the termination: on the thread, or on the fallback queue
  /// when the thread has exited. Any thread.
  func adopt(_ id: ObjectIdentifier, ender: @escaping @Sendable () -> Void) -> Bool {
    members.withLock { $0.adopt(id, ender: ender) }
  }

  /// The sequence ended or went away. Any thread.
  func forget(_ id: ObjectIdentifier) {
    members.withLock { $0.forget(id) }
  }
}

/// How deep `runUntilTerminated`'s observer is in the runs it saw entered. Only touched by that
/// observer's callouts, on the executor's thread.
private final class RunDepth: @unchecked Sendable {  // Safety: proof below
  // Safety: `value` is only read and written by one CF observer's callouts, which CF makes on the
  // thread of the run loop the observer is on, one at a time.
  var value = 0
}
