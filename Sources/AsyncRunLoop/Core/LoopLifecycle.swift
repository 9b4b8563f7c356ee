/// The life of one loop, for all three kinds of loop: a pure state machine held in the loop's
/// inbox (under its lock) that every path consults — who may run the loop's jobs, who counts as
/// isolated to it, what a job, block, change or signal that arrives now becomes, and which waits
/// shutdown releases.
///
/// Phases, in order (each moves forward only):
/// - `active`: accepting everything.
/// - `shuttingDown`: `shutdown()` was called (or a current loop's thread is exiting). Every run
///   stops; blocks are refused; jobs, signals and changes are still accepted while the loop drains
///   (changes only until the drain's time cap, invalidations until the end).
/// - `finishing`: the drain's last round is over (the inbox was empty, or the drain hit its cap).
///   The loop thread makes its last callouts (detaching what the last round left); changes are
///   refused; jobs that arrive now are *held*, not run anywhere, so that no job of the loop runs
///   while the loop thread still calls out.
/// - `terminated`: the loop thread is done with the loop. Held and later jobs run on the fallback
///   executor, in arrival order.
///
/// The one rule of isolation: at every moment the loop's jobs run in exactly one place, and code
/// on the loop's thread counts as isolated to the loop only while no job of the loop can run
/// elsewhere (`loopThreadIsIsolated`). While `jobsLeftThread` is false the jobs run on the loop's
/// thread; from the instant it turns true (the hand-over at termination, or a current loop's
/// diversion) the fallback executor runs them, and no code on the loop's thread counts as isolated
/// any more. A current loop's jobs may leave at any instant its thread is out of a run (a
/// `shutdown()` from another thread diverts them then), and nothing tells the loop when code on
/// that thread ends an `assumeIsolated` region: so its thread counts as isolated only while it is
/// inside one of the loop's runs (or its exit drain), where the jobs cannot leave
/// (`divertIfOutOfRun` waits for the outermost run to end, after its last callout).
///
/// What differs between kinds is an input (`kind`), and it decides two things (paths that only
/// need the kind read it from `Kind`, which never changes):
/// - A *current* loop (`RunLoopThread.current` on a plain thread) is drained only when its thread
///   exits, which may be never. So once it is shut down its jobs leave its thread whenever the
///   thread is out of a run (`divertIfOutOfRun`), and waits that a parked thread would hold up are
///   released then (`handsOffWaitsAtShutdown`). For the same reason its thread counts as isolated
///   only inside a run.
/// - An *owned* loop's thread and the *main* thread drain their loop themselves (an owned thread at
///   once, the main thread before `runMainLoop()` returns): their jobs leave only at termination.
///   The main loop's jobs need the main thread, so they wait for it.
struct LoopLifecycle: Equatable {
  /// Who runs the loop's thread.
  enum Kind: Equatable {
    /// `RunLoopThread(name:)`: a thread of its own that runs the loop until shutdown.
    case ownsThread
    /// `RunLoopThread.current` on a thread the user runs: it runs the loop when it calls `run`.
    case current
    /// `RunLoopThread.main`: the process's main thread, in `runMainLoop()` or `run(...)`.
    case main

    /// Only a current loop's thread may never drain it: its jobs and waits leave the thread at
    /// shutdown whenever it is out of a run (`divertIfOutOfRun`), and it tracks its run depth.
    var handsOffWaitsAtShutdown: Bool { self == .current }
  }

  enum Phase: Equatable, Comparable {
    case active
    case shuttingDown
    case finishing
    case terminated
  }

  let kind: Kind
  private(set) var phase = Phase.active
  /// A current loop's thread is inside a run (only there may it run jobs, and only there does it
  /// count as isolated). Kept for every kind; consulted for current loops only.
  private(set) var threadIsInRun = false
  /// The loop's jobs run on the fallback executor from now on (see the type's comment).
  private(set) var jobsLeftThread = false

  init(kind: Kind) {
    self.kind = kind
  }

  // MARK: Questions every path asks

  /// True once shutdown began: every run stops, at every nesting level.
  var isShutDown: Bool { phase != .active }

  /// Code on the loop's thread counts as isolated to the loop (see the type's comment): the jobs
  /// have not left the thread and, for a current loop, the thread is inside a run.
  var loopThreadIsIsolated: Bool { !jobsLeftThread && (kind != .current || threadIsInRun) }

  /// A current loop: once shut down, its jobs, sleeps and blocked callers do not wait for its
  /// thread (which may never run the loop again).
  var handsOffWaitsAtShutdown: Bool { kind.handsOffWaitsAtShutdown }

  /// Where a job that arrives now goes.
  enum JobRoute: Equatable {
    /// Into the queue; the loop thread runs it (wake it).
    case queue
    /// Into the queue without a wake-up: the finishing loop hands it to the fallback at
    /// termination, behind the jobs already there.
    case hold
    /// To the fallback executor now.
    case fallback
  }

  var jobRoute: JobRoute {
    if jobsLeftThread { return .fallback }
    return phase == .finishing ? .hold : .queue
  }

  /// A block (`perform`) is accepted only while active: a caller that keeps performing must not
  /// keep a draining loop alive.
  var acceptsBlocks: Bool { phase == .active }

  /// Whether a registration change is accepted: while active; while shutting down until the
  /// drain's cap has passed, and an invalidation until the drain's last round (its closing work,
  /// a `CommandSource` delivering what it holds, must not be dropped by a loop still able to do
  /// it); never once finishing.
  func acceptsChange(isInvalidation: Bool, drainCapHasPassed: Bool) -> Bool {
    switch phase {
    case .active: return true
    case .shuttingDown: return isInvalidation || !drainCapHasPassed
    case .finishing, .terminated: return false
    }
  }

  /// Signals are meaningful until the loop finishes (its sources are all detached by then).
  var acceptsSignals: Bool { phase <= .shuttingDown }

  // MARK: Events

  /// `shutdown()`, or a current loop's thread exiting: true for the first call only.
  mutating func beginShutdown() -> Bool {
    guard phase == .active else { return false }  // twice: a no-op
    phase = .shuttingDown
    return true
  }

  /// The loop's thread enters or leaves its outermost run (a current loop; harmless for others).
  mutating func setThreadIsInRun(_ inRun: Bool) {
    threadIsInRun = inRun
  }

  /// A current loop shut down while its thread is out of a run: its jobs leave the thread now.
  /// True when they did (the caller hands the queued jobs to the fallback, under the lock, and
  /// releases the waits a parked thread would hold up); false, and nothing changes, otherwise.
  mutating func divertIfOutOfRun() -> Bool {
    guard kind.handsOffWaitsAtShutdown, phase == .shuttingDown, !threadIsInRun, !jobsLeftThread else { return false }
    jobsLeftThread = true
    return true
  }

  /// The drain finished a round: true (now finishing) when `idle` or `force`d by the drain's cap;
  /// false when another round must run.
  mutating func finishDrain(idle: Bool, force: Bool) -> Bool {
    precondition(phase == .shuttingDown, "AsyncRunLoop: the drain finished a round of a loop not shutting down")
    guard idle || force else { return false }  // more to run: another round
    phase = .finishing
    return true
  }

  /// The loop thread made its last callout: the held jobs (and every later one) leave for the
  /// fallback. Returns true when they had not left already (the caller hands over the queue).
  mutating func terminate() -> Bool {
    precondition(phase == .finishing, "AsyncRunLoop: a loop terminated without finishing its drain")
    phase = .terminated
    defer { jobsLeftThread = true }
    return !jobsLeftThread
  }
}
