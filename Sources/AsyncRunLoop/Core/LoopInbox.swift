/// A block handed to a loop with `perform`, with the modes it may run in.
struct PerformRequest {
  let modes: [RunLoopMode]
  /// Runs in whatever mode the loop runs (`runModal`'s block).
  var anyMode = false
  let block: @Sendable () -> Void
  /// The inbox's sequence number when it arrived (see `LoopInbox.sequence`).
  var sequence: UInt64 = 0
}

/// A signalled source's record, with the inbox's sequence number when the signal arrived: the
/// source fires only once every change that arrived before the signal was applied (0: no change
/// to wait for).
struct SignalledRecord {
  let record: MemberRecord
  let sequence: UInt64
}

/// A registration change sent to the loop thread, with the inbox's sequence number when it
/// arrived: a block or job runs only once every change that arrived before it was applied.
struct SequencedChange {
  let sequence: UInt64
  /// Applied on the loop thread, to its core.
  let change: RegistrationChange
}

/// Everything other threads hand to a loop: a pure state machine held under the loop's inbox
/// lock. Each event is one mutating method whose result says what the caller must do after
/// releasing the lock (wake the sleeping loop, run a job elsewhere, ...).
///
/// Wake-ups are coalesced: `wakePending` is true while the loop is awake (it will look at the
/// inbox before sleeping) or a wake-up is already on its way. Only the producer that flips
/// it from false to true wakes the loop, so a busy loop costs producers no syscall at all.
struct LoopInbox {
  /// The loop's life: what arrivals become, who runs jobs (see `LoopLifecycle`).
  private(set) var life: LoopLifecycle

  init(kind: LoopLifecycle.Kind = .ownsThread) {
    life = LoopLifecycle(kind: kind)
  }

  /// A current loop's thread enters or leaves its outermost run (see `LoopLifecycle`).
  mutating func setThreadIsInRun(_ inRun: Bool) {
    life.setThreadIsInRun(inRun)
  }
  /// Executor jobs, oldest first, with the role they were enqueued in.
  var jobs = ChunkedQueue<LoopJob>()
  /// Blocks from `perform`, oldest first.
  var performs = ChunkedQueue<PerformRequest>()
  /// Sources signalled since the loop last looked.
  var signalled: [SignalledRecord] = []
  /// Registration changes requested from other threads, applied on the loop thread in order.
  var controls = ChunkedQueue<SequencedChange>()
  /// Numbers changes, blocks and jobs in the order they arrive (under the inbox lock), so the loop
  /// can run a block or job as soon as the changes that arrived before it are applied, while
  /// later changes still wait (a pass applies a bounded number of them).
  private(set) var sequence: UInt64 = 0

  private mutating func nextSequence() -> UInt64 {
    sequence &+= 1
    return sequence
  }
  /// `stop()` was called and no run has consumed it yet.
  var stopRequested = false
  /// `wakeUp()` was called since the loop last looked.
  var wakeRequested = false
  /// See the type's comment. Starts true: a new loop is not asleep.
  private(set) var wakePending = true
  /// How the loop sleeps (or last slept): the producer that wakes it must use the same way.
  private(set) var sleepMechanism = SleepMechanism.epoll

  /// The two ways a loop sleeps.
  enum SleepMechanism: Equatable {
    /// In `epoll_wait`, watching descriptors, its timerfd and the wake-up eventfd.
    case epoll
    /// On a futex word: the loop watches no descriptor and no timer, so only a producer can
    /// wake it, and a futex wake-up is cheaper than an eventfd write read back through epoll.
    case futex
  }

  enum WakeAction: Equatable {
    /// The loop is awake or already being woken.
    case none
    /// Wake the sleeping loop the way it sleeps (after releasing the lock).
    case wakeLoop(SleepMechanism)
  }

  /// Flips `wakePending`; only the flipper wakes the loop.
  private mutating func requestWake() -> WakeAction {
    if wakePending { return .none }  // awake, or a wake-up is on its way: coalesced
    wakePending = true
    return .wakeLoop(sleepMechanism)
  }

  enum JobAction {
    case accepted(WakeAction)
    /// The loop has terminated: run the job on the fallback executor.
    case runElsewhere
  }

  /// A job arrives (executor enqueue).
  mutating func enqueue(_ job: LoopJob) -> JobAction {
    switch life.jobRoute {
    case .queue:
      var job = job
      job.sequence = nextSequence()
      jobs.append(job)  // shutting down: the draining loop still runs it
      return .accepted(requestWake())
    case .hold:
      jobs.append(job)  // the finishing loop hands it over at termination, behind the others
      return .accepted(.none)
    case .fallback:
      return .runElsewhere  // nobody will run it here; never drop a job
    }
  }

  /// A block arrives; nil once shutdown has begun (the block is refused: a caller that keeps
  /// performing must not keep the draining loop alive forever). Blocks accepted before run.
  mutating func perform(_ request: PerformRequest) -> WakeAction? {
    guard life.acceptsBlocks else { return nil }
    var request = request
    request.sequence = nextSequence()
    performs.append(request)
    return requestWake()
  }

  /// While shutting down, changes arriving at or after this monotonic time are refused (the
  /// drain's time cap, set when the drain begins): producers that outpace the draining loop would
  /// otherwise keep it applying for as long as they send.
  var refusesChangesFrom = Int64.max

  private var drainCapHasPassed: Bool {
    refusesChangesFrom != Int64.max && LoopClock.monotonicNanoseconds() >= refusesChangesFrom
  }

  /// A registration change arrives from another thread; nil when the loop refuses it (see
  /// `LoopLifecycle.acceptsChange`). Invalidations accepted after the cap are bounded: one per
  /// member that was on this loop, and adds are refused by then.
  mutating func control(_ change: RegistrationChange) -> WakeAction? {
    guard life.acceptsChange(isInvalidation: change.isInvalidation, drainCapHasPassed: drainCapHasPassed) else {
      return nil
    }
    controls.append(SequencedChange(sequence: nextSequence(), change: change))
    return requestWake()
  }

  /// A source was signalled.
  mutating func signal(_ source: MemberRecord) -> WakeAction {
    guard life.acceptsSignals else { return .none }  // its loop is gone; the signal is meaningless
    signalled.append(SignalledRecord(record: source, sequence: nextSequence()))
    return requestWake()
  }

  /// A loop-thread job is about to fire `record` early (see `LoopCore+EarlyFire`): when nothing but
  /// `record`'s signals waits here (no change, block, job or stop, no other source's signal; a
  /// block for another mode counts too, to keep this short), drops those signals and returns how
  /// many there were (the fire consumes them; left here, they would let a later signal of the same
  /// source pass changes sent before it); otherwise nil.
  mutating func dropSignalsIfAlone(_ record: MemberRecord) -> Int? {
    guard controls.isEmpty, jobs.isEmpty, performs.isEmpty, !stopRequested,
      signalled.allSatisfy({ $0.record === record })
    else { return nil }
    let dropped = signalled.count
    signalled.removeAll(keepingCapacity: true)
    return dropped
  }

  /// `stop()`: remembered until a run consumes it.
  mutating func stop() -> WakeAction {
    stopRequested = true
    return requestWake()
  }

  /// `wakeUp()`: makes a sleeping loop do a pass.
  mutating func wakeUp() -> WakeAction {
    wakeRequested = true
    return requestWake()
  }

  /// `shutdown()` (or a current loop's thread exiting): returns true for the first call only.
  mutating func beginShutdown() -> (first: Bool, wake: WakeAction) {
    guard life.beginShutdown() else { return (false, .none) }  // shutdown twice: no-op
    stopRequested = true
    return (true, requestWake())
  }

  /// A shut-down current loop whose thread is out of a run stops running jobs on that thread:
  /// returns the jobs accepted so far (oldest first), which the caller hands to the fallback
  /// executor before releasing the lock (so later arrivals, which go there too, queue behind
  /// them). nil, and nothing changes, unless `LoopLifecycle.divertIfOutOfRun` says so.
  mutating func divertJobs() -> [LoopJob]? {
    guard life.divertIfOutOfRun() else { return nil }
    defer { jobs.removeAll() }
    return jobs.elements
  }

  /// The draining loop finished a round: true (finishing: the loop makes its last callouts, see
  /// `LoopLifecycle`) when nothing is left (`localJobsLeft`: jobs the loop thread collected and
  /// has not run), or (`force`) after the drain's cap even if producers
  /// keep sending jobs; false when another round must run. Jobs that arrive from now on are held
  /// for `terminate()`.
  mutating func finishDrain(force: Bool, localJobsLeft: Bool = false) -> Bool {
    let idle = !localJobsLeft && jobs.isEmpty && performs.isEmpty && controls.isEmpty
    guard life.finishDrain(idle: idle, force: force) else { return false }
    signalled.removeAll()  // every source is invalidated already
    return true
  }

  /// The finishing loop made its last callout: returns the jobs held (oldest first), which the
  /// caller hands to the fallback executor before releasing the lock, so later arrivals queue
  /// behind them. From now on jobs go to the fallback.
  mutating func terminate() -> [LoopJob] {
    guard life.terminate() else { return [] }  // diverted already: nothing is held here
    defer { jobs.removeAll() }
    return jobs.elements
  }

  /// Whether anything is waiting for the loop (it must not sleep). `ignoringJobs`: the loop is
  /// inside one of its own jobs and cannot run jobs now.
  func hasWork(ignoringJobs: Bool = false) -> Bool {
    (!ignoringJobs && !jobs.isEmpty) || !performs.isEmpty || !signalled.isEmpty || !controls.isEmpty
      || stopRequested || wakeRequested
  }

  /// The loop is about to sleep on `mechanism`: true if it may (nothing waiting), and from then
  /// on the first producer wakes it that way. False means "poll instead": work is there. A loop
  /// inside one of its own jobs (`ignoringJobs`) sleeps over waiting jobs: it cannot run them,
  /// and each one that arrives still wakes it (it then sleeps again).
  mutating func prepareToSleep(on mechanism: SleepMechanism, ignoringJobs: Bool = false) -> Bool {
    if hasWork(ignoringJobs: ignoringJobs) { return false }  // work arrived since the loop looked: no sleep
    wakePending = false
    sleepMechanism = mechanism
    return true
  }

  /// The loop woke up (or polled): producers need not write until it sleeps again.
  mutating func didWake() {
    wakePending = true
  }
}
