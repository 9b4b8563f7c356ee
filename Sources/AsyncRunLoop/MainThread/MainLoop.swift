import CAsyncRunLoop
import Glibc

/// The process's main-thread loop.
///
/// `RunLoopThread.main` is a loop like any other (modes, sources, timers, observers, executor) whose
/// thread is the process's main thread (thread id == process id). It also serves libdispatch's
/// main queue, as CFRunLoop does: the main queue's wake-up eventfd is a readiness source in the
/// common modes, and when it is readable the loop drains the queue with
/// `_dispatch_main_queue_callback_4CF`. So while the main thread runs the main loop in a common
/// mode, `DispatchQueue.main` blocks and `@MainActor` jobs (Swift's main executor on Linux is the
/// main dispatch queue) run on the real main thread, interleaved with the loop's sources and timers.
///
/// Starting it: call `runMainLoop()` at the end of a *synchronous* main (top-level code without
/// `await`, or `static func main()` of an `@main` type), or make an `async` main run on it with
/// `AsyncRunLoopExecutorFactory` (see the AsyncMain article) and `await runMainLoop()`. Without
/// the factory an async main gives the main thread away at its first suspension (it calls
/// `dispatchMain()`: libdispatch then drains the main queue on pool threads), so only its code
/// before the first `await` runs on the main thread. Measured on Linux with Swift 6.3.1.
extension RunLoopThread {
  private static let mainStorage: LockedValue<RunLoopThread?> = LockedValue(nil)

  /// The loop of the process's main thread. Any thread may get it and hand it work; only the
  /// main thread may run it (`runMainLoop()`, or `run(...)` on the main thread).
  ///
  /// Created on first use, with the main dispatch queue's source and the main-loop bookkeeping
  /// observer in its common modes (so the default mode is never empty: running it does not return
  /// `.finished` at once).
  public static var main: RunLoopThread {
    mainStorage.withLock { stored in
      if let stored { return stored }
      let created: RunLoopThread
      do {
        created = try RunLoopThread(name: "main", ownsThread: false, isMainLoop: true)
      } catch {
        preconditionFailure("AsyncRunLoop: cannot create the main loop: \(error)")
      }
      // Under the lock, so no thread can get the loop (and run it) before the source is queued.
      MainLoopControl.install(on: created)
      stored = created
      return created
    }
  }

  static var mainIfCreated: RunLoopThread? { mainStorage.withLock { $0 } }

  /// True when the caller runs on the process's main thread (thread id == process id). Any thread;
  /// cheap: after a thread's first call, one thread-local read.
  public static var isMainThread: Bool { MainThread.isCurrent }

  /// True while the main thread runs the main loop: inside `runMainLoop()`, inside any
  /// `RunLoopThread.main.run(...)` in a common mode (the modes that drain the main queue), while a
  /// host loop embeds it (`beginEmbedding()`), or for the whole life of an `async` main on
  /// `AsyncRunLoopExecutorFactory` once its first `await` gave the main thread to the loop. Any
  /// thread. To wait for it, see `waitUntilMainLoopRuns()`.
  public static var isMainLoopRunning: Bool { MainLoopControl.isRunning }
}

/// Runs the main loop on the main thread, in the default mode, until `stopMainLoop()` is called
/// or the main loop shuts down (`RunLoopThread.main.shutdown()`; the loop is then drained as
/// `shutdown()` promises before this returns). Main thread only.
///
/// While it runs, `@MainActor` code, `DispatchQueue.main` blocks, `runOnMain` bodies and
/// everything scheduled on `RunLoopThread.main` run on the main thread. Call it at the end of a
/// synchronous main:
///
/// ```swift
/// // main.swift: top-level code with no `await` (an `await` here makes main async)
/// import AsyncRunLoop
/// let app = App()          // set up sources, timers, delegates...
/// runMainLoop()            // returns after stopMainLoop()
///
/// // or, with an @main type: a synchronous `static func main()`, not `async`
/// @main struct Tool {
///   static func main() {
///     runMainLoop()
///   }
/// }
/// ```
///
/// In an `async` main, write `await runMainLoop()` with `AsyncRunLoopExecutorFactory` installed
/// (see the AsyncMain article); this blocking form traps there, as it would hold the main actor.
/// Without the factory an async main may call it only before its first `await` (after that it
/// runs on pool threads).
///
/// When it returns after `stopMainLoop()`, every main-queue block accepted before the stop has
/// run (see `stopMainLoop()`); after `RunLoopThread.main.shutdown()` (from any thread, the main
/// one too, before this call), every one accepted before the shutdown, and then the loop drained.
///
/// Traps with a clear message when called on another thread (including from an async main after
/// its first `await`) or while `runMainLoop()` is already running (for a nested run use
/// `RunLoopThread.main.run(mode:until:)`).
public func runMainLoop() {
  precondition(
    RunLoopThread.isMainThread,
    """
    AsyncRunLoop: runMainLoop() must be called on the process's main thread, but was called on \
    thread \(carl_gettid()) (main thread is \(getpid())). Call it at the end of a synchronous \
    main (top-level code without `await`, or a non-async `static func main()`). After an async \
    main's first `await`, or after dispatchMain(), code runs on pool threads, not the main thread.
    """)
  precondition(
    !MainLoopExecutor.isServingAsyncMain,
    """
    AsyncRunLoop: runMainLoop() was called in an async main that runs on AsyncRunLoopExecutorFactory: \
    there the main loop already runs, and a blocking call would hold the main actor. Write \
    `await runMainLoop()` to wait for stopMainLoop(), in an async function: in top-level code of \
    main.swift, Swift resolves `await runMainLoop()` to this blocking form (it warns "no 'async' \
    operations occur within 'await' expression"), so call an `@MainActor func … async` that awaits \
    it, or use @main.
    """)
  let loop = RunLoopThread.main
  switch MainLoopControl.beginServing() {
  case .serve:
    break
  case .returnAtOnce:
    // stopMainLoop() was called before: the stop is consumed by this call, after the blocks
    // queued before it ran; callers blocked on a hold between host runs are released. A shut-down
    // loop is drained as well, as below.
    if loop.isShutDown {
      endServingAfterShutdown(loop)
      return
    }
    MainLoopControl.endServing()
    MainQueueService.drainAcceptedBlocks()
    return
  case .alreadyServing:
    preconditionFailure(
      """
      AsyncRunLoop: runMainLoop() is already running on the main thread. For a nested run (a \
      modal loop), call RunLoopThread.main.run(mode:until:) instead.
      """)
  }
  while true {
    let result = loop.run(mode: .default)
    if loop.isShutDown || result == .finished { break }
    if !MainLoopControl.continueServing() { break }
  }
  if loop.isShutDown {
    endServingAfterShutdown(loop)
  } else {
    // Blocked callers whose blocks have not started are released first (their blocks are then
    // skipped). A stop ends the run between passes, possibly with main-queue blocks queued before
    // the stop still waiting: run them now, so that nothing accepted before stopMainLoop() is lost.
    MainLoopControl.endServing()
    MainQueueService.drainAcceptedBlocks()
  }
}

/// `runMainLoop()` ends after `RunLoopThread.main.shutdown()`: the main queue's blocks
/// (`DispatchQueue.main`, `runOnMain` bodies, main-actor jobs) accepted before it run first, while
/// the loop can still take the registration changes they send (its drain applies them); then the
/// loop is drained. Main thread.
private func endServingAfterShutdown(_ loop: RunLoopThread) {
  MainQueueService.drainAcceptedBlocks()
  loop.core.drainForShutdown()
  MainLoopControl.endServing()
}

/// Makes `runMainLoop()` return: stops the main loop's current run (if the main thread is in a
/// nested run, that run and every enclosing one end) and `runMainLoop()` does not start another.
/// If `runMainLoop()` is not running, the stop is remembered and the next `runMainLoop()` returns
/// at once. Any thread.
///
/// Nothing accepted before the stop is lost: every `runOnMain` body, `DispatchQueue.main` block
/// and main-actor job queued before this call (by this thread, or by any thread whose call
/// finished before this one started) has run when `runMainLoop()` returns — as Cocoa's
/// `CFRunLoopStop` leaves the main queue's blocks to run, not to vanish. In an `async` main on
/// `AsyncRunLoopExecutorFactory`, it ends `await runMainLoop()` the same way. To stop a run you started with `RunLoopThread.main.run(...)`, use
/// `RunLoopThread.main.stop()`.
public func stopMainLoop() {
  MainLoopControl.requestStop()
}

/// The cross-thread side of the main loop: its running state, pending stop and blocked callers.
enum MainLoopControl {
  private static let state = LockedValue(MainLoopState<any AbandonableWait>())

  /// Adds the main dispatch queue's source and the bookkeeping observer to the new main loop's
  /// common modes. Any thread (from another thread the loop applies both before its first run).
  static func install(on loop: RunLoopThread) {
    let observer = LoopObserver(activities: [.entry, .exit, .beforeWaiting], order: Int.min) {
      [unowned loop] _, activity in
      observe(activity, loop: loop)
    }
    loop.add(observer, to: .common)
    // After dispatchMain() (which an async main calls) the main queue is no longer bound to the
    // main thread and libdispatch returns no handle (-1): its pool threads drain the queue, and the
    // main loop cannot take it over — nor can it run, as the main thread has exited.
    let descriptor = _dispatch_get_main_queue_handle_4CF()
    guard descriptor >= 0 else { return }
    let mainQueue = DescriptorSource(descriptor: descriptor, interest: .readable) { _, _ in
      MainQueueService.drain(descriptor)
    }
    do {
      try loop.add(mainQueue, to: .common)
    } catch {
      preconditionFailure("AsyncRunLoop: cannot watch the main dispatch queue: \(error)")
    }
  }

  /// Main thread, from the observer: keeps the run depth, and re-sends a pending stop to the run
  /// that is (or becomes) innermost.
  private static func observe(_ activity: LoopActivity, loop: RunLoopThread) {
    if activity == .entry {
      state.withLock { $0.runEntered() }
    } else if activity == .exit {
      switch state.withLock({ $0.runExited() }) {
      case .none: break
      case .stopEnclosingRun: loop.stop()
      case .abandon(let waiters): for waiter in waiters { waiter.abandon() }
      }
    } else if activity == .beforeWaiting {
      if state.withLock({ $0.aboutToSleep() }) { loop.stop() }
    }
  }

  static var isRunning: Bool { state.withLock { $0.isRunning } }

  /// Whether `runMainLoop()` or a run of the main loop is active (hosting aside): a drain after
  /// an embedded pass waits for them.
  static var isRunningItself: Bool { state.withLock { $0.isServing || $0.runDepth > 0 } }

  static func beginServing() -> MainLoopState<any AbandonableWait>.BeginAction {
    state.withLock { $0.beginServing() }
  }

  static func continueServing() -> Bool { state.withLock { $0.continueServing() } }

  static func endServing() {
    for waiter in state.withLock({ $0.endServing() }) { waiter.abandon() }
  }

  /// A host loop began embedding the main loop (`beginEmbedding()`): the main thread serves it
  /// from now on, so blocked callers may wait.
  static func beginHosting() { state.withLock { $0.hostingBegan() } }

  /// A host loop stopped embedding the main loop (`holdingBetweenRuns`: see
  /// `MainLoopState.hostingEnded`).
  static func endHosting(holdingBetweenRuns: Bool = false) {
    for waiter in state.withLock({ $0.hostingEnded(holdingBetweenRuns: holdingBetweenRuns) }) { waiter.abandon() }
  }

  /// The main loop was shut down (`RunLoopThread.shutdown()`): callers waiting only on a hold
  /// between host runs are released.
  static func shutDown() {
    for waiter in state.withLock({ $0.shutDown() }) { waiter.abandon() }
  }

  static func requestStop() {
    switch state.withLock({ $0.requestStop() }) {
    case .stopLoop: RunLoopThread.mainIfCreated?.stop()
    case .remembered: break
    case .endAsyncRun: AsyncMainLoopRun.end()
    }
  }

  static func beginAsyncServing() -> MainLoopState<any AbandonableWait>.BeginAction {
    state.withLock { $0.beginAsyncServing() }
  }

  /// Registers a blocked caller; nil when waiting could hang: the main loop is shut down, the
  /// main queue was given away (`dispatchMain()`), or the main loop ran and is not running now.
  static func register(_ waiter: any AbandonableWait) -> UInt64? {
    if RunLoopThread.mainIfCreated?.isShutDown == true || MainQueueService.isMainQueueLost { return nil }
    return state.withLock { $0.register(waiter) }
  }

  /// Why waiting for the main loop could hang (see `register`), or nil when it is or will be served.
  static var waitRefusal: String? {
    if RunLoopThread.mainIfCreated?.isShutDown == true { return "the main loop is shut down" }
    if MainQueueService.isMainQueueLost { return "dispatchMain() gave the main queue to pool threads" }
    return state.withLock { $0.hasRun && !$0.isRunning } ? "the main loop ran and has stopped" : nil
  }

  static func unregister(_ ticket: UInt64) {
    _ = state.withLock { $0.unregister(ticket) }
  }
}

/// A caller blocked until the main thread runs its block; `abandon()` releases it with an error
/// when the main loop stops running before the block started. Any thread.
protocol AbandonableWait: AnyObject, Sendable {
  func abandon()
}

/// The main loop's cross-thread state: a pure state machine held under `MainLoopControl`'s lock.
/// Each event is one mutating method; the returned action is performed after the lock is released.
/// Generic over the waiter type so it can be tested as a plain value.
struct MainLoopState<Waiter> {
  /// Runs of the main loop in progress on the main thread, in common modes (told by the observer).
  private(set) var runDepth = 0
  /// `runMainLoop()` is active.
  private(set) var isServing = false
  /// Host loops embedding the main loop now (`beginEmbedding()` calls not yet ended).
  private(set) var hostDepth = 0
  /// The main loop has run (served, hosted, or a run in a common mode entered) at least once.
  private(set) var hasRun = false
  /// `stopMainLoop()` was called and has not ended `runMainLoop()` yet.
  private(set) var isStopPending = false
  /// An `await runMainLoop()` waits for a stop (an `async` main on the executor factory).
  private(set) var isAsyncServing = false
  /// The main loop was shut down.
  private(set) var isShutDown = false
  /// Callers blocked in `runOnMainAndWait`, by ticket.
  private(set) var waiters: [UInt64: Waiter] = [:]
  private var nextTicket: UInt64 = 0

  /// The last host run that embedded the main loop ended with no run of our own around it, and
  /// the host said it runs again soon (`while … { RunLoop.main.run(mode:before:) }`): the main
  /// loop counts as served until the next host run, `runMainLoop()`, a run of its own, or its
  /// shutdown.
  private(set) var isHeldBetweenHostRuns = false

  /// Whether the main thread serves the main loop now (so a blocked caller will be served).
  var isRunning: Bool { isServing || runDepth > 0 || hostDepth > 0 || isHeldBetweenHostRuns }

  enum BeginAction: Equatable {
    /// Run the loop.
    case serve
    /// A stop was requested before: return without running.
    case returnAtOnce
    /// `runMainLoop()` is already active (a nested call): a programming error.
    case alreadyServing
  }

  /// `runMainLoop()` starts. (After `.returnAtOnce` it ends at once: `endServing()`.)
  mutating func beginServing() -> BeginAction {
    if isServing { return .alreadyServing }  // nested runMainLoop()
    isHeldBetweenHostRuns = false  // our loop drives from now on (or runMainLoop() returns)
    if isStopPending {
      isStopPending = false  // the remembered stop ends this call
      return .returnAtOnce
    }
    isServing = true  // served from now until endServing()
    hasRun = true
    return .serve
  }

  /// `await runMainLoop()` starts (the main loop already runs: it waits for a stop).
  mutating func beginAsyncServing() -> BeginAction {
    if isServing || isAsyncServing { return .alreadyServing }  // one runMainLoop at a time
    if isStopPending {
      isStopPending = false  // the remembered stop ends this call
      return .returnAtOnce
    }
    isAsyncServing = true  // until the next requestStop()
    return .serve
  }

  /// A run inside `runMainLoop()` returned: false (consuming the stop) when it must end.
  mutating func continueServing() -> Bool {
    guard isStopPending else { return true }  // some other stop: run again
    isStopPending = false  // this stop ends runMainLoop()
    return false
  }

  /// `runMainLoop()` ends: returns the waiters to abandon (nobody will serve them).
  mutating func endServing() -> [Waiter] {
    isServing = false
    return takeWaitersIfStopped()
  }

  /// A host loop began embedding the main loop.
  mutating func hostingBegan() {
    hostDepth += 1
    isHeldBetweenHostRuns = false  // this run takes the hold over
    hasRun = true
  }

  /// A host loop stopped embedding it: returns the waiters to abandon if nothing serves it now.
  /// `holdingBetweenRuns`: the host runs again soon; when no host run and no run of our own is
  /// left, the main loop still counts as served until one of them starts or it shuts down.
  mutating func hostingEnded(holdingBetweenRuns: Bool = false) -> [Waiter] {
    hostDepth -= 1
    if holdingBetweenRuns && hostDepth == 0 && !isServing && runDepth == 0 && !isShutDown {
      isHeldBetweenHostRuns = true
    }
    return takeWaitersIfStopped()
  }

  /// The main loop was shut down: nothing will serve a hold between host runs; returns the
  /// waiters to abandon if nothing serves it now.
  mutating func shutDown() -> [Waiter] {
    isShutDown = true
    isHeldBetweenHostRuns = false
    return takeWaitersIfStopped()
  }

  /// A run in a common mode started on the main thread.
  mutating func runEntered() {
    runDepth += 1
    isHeldBetweenHostRuns = false  // our loop drives now
    hasRun = true
  }

  enum ExitAction {
    case none
    /// A stop is pending and a run encloses this one: stop that too.
    case stopEnclosingRun
    /// The main loop stopped running: release these waiters with an error.
    case abandon([Waiter])
  }

  /// A run in a common mode ended.
  mutating func runExited() -> ExitAction {
    runDepth -= 1
    if isStopPending && isServing && runDepth > 0 { return .stopEnclosingRun }  // unwind nested runs
    let abandoned = takeWaitersIfStopped()
    return abandoned.isEmpty ? .none : .abandon(abandoned)  // the last raw run ended: abandon
  }

  /// The main loop is about to sleep: true when a pending stop must end the run (a nested run in a
  /// mode this observer does not see consumed the first stop).
  mutating func aboutToSleep() -> Bool {
    isStopPending && isServing
  }

  enum StopAction: Equatable {
    /// Stop the main loop's current run.
    case stopLoop
    /// `runMainLoop()` is not active: the next one returns at once.
    case remembered
    /// End the waiting `await runMainLoop()` (the stop is consumed by it).
    case endAsyncRun
  }

  /// `stopMainLoop()`.
  mutating func requestStop() -> StopAction {
    if isAsyncServing && !isServing {
      isAsyncServing = false  // this stop ends the await
      return .endAsyncRun
    }
    isStopPending = true
    return isServing ? .stopLoop : .remembered  // not serving: remembered for the next runMainLoop
  }

  /// A caller wants to block until the main thread runs its block: a ticket, or nil when the main
  /// loop ran and is not running now (it stopped: the caller could wait forever). Before the main
  /// loop first runs, callers wait for it to start (threads started during setup).
  mutating func register(_ waiter: Waiter) -> UInt64? {
    guard isRunning || !hasRun else { return nil }  // it stopped: refuse to wait
    nextTicket += 1
    waiters[nextTicket] = waiter
    return nextTicket
  }

  /// The caller stopped waiting (its block ran, or it was abandoned).
  mutating func unregister(_ ticket: UInt64) -> Waiter? {
    waiters.removeValue(forKey: ticket)
  }

  /// When the main loop no longer runs, hands out every waiter (they must be released).
  private mutating func takeWaitersIfStopped() -> [Waiter] {
    guard !isRunning, !waiters.isEmpty else { return [] }
    defer { waiters.removeAll() }
    return Array(waiters.values)
  }
}

/// "Is this the main thread?", cached per thread in a pthread key (the kernel is asked once per
/// thread; thread-specific data dies with its thread, so a reused thread id is never mistaken).
enum MainThread {
  private static let key: pthread_key_t = {
    var key = pthread_key_t()
    let rc = pthread_key_create(&key, nil)
    precondition(rc == 0, "AsyncRunLoop: pthread_key_create failed: \(rc)")
    return key
  }()

  /// The cached answers (non-nil, so "not asked yet" stays distinguishable).
  private static let isMainMark = 1
  private static let isOtherMark = 2

  static var isCurrent: Bool {
    if let cached = pthread_getspecific(key) { return Int(bitPattern: cached) == isMainMark }
    let isMain = carl_is_main_thread() != 0
    pthread_setspecific(key, UnsafeRawPointer(bitPattern: isMain ? isMainMark : isOtherMark))
    return isMain
  }
}
