/// The loop-thread half of a loop: its mode table and member records, the timer heaps (inside the
/// modes), and, one small type per concern, the loop's own copies of the work other threads sent:
/// the job queue (`LoopJobQueue`), the block queue (`LoopBlockQueue`), the registration changes
/// with the ordering rule every other kind of work follows (`LoopChangeQueue`), the signalled
/// sources (`SignalledSources`) and the descriptor state (`LoopDescriptors`). Not `Sendable`: only
/// the loop's thread touches it (the `RunLoopThread` handle forwards to it after checking
/// `isOnLoopThread`, or through the inbox).
///
/// Re-entrancy: a callout may run the loop nested. Everything here that a pass iterates while it
/// calls out is either per run (`RunContext`) or one queue with a cursor that a nested run
/// continues instead of starting over (blocks, registration changes), so a nested run never
/// disturbs the batch of the run it is nested in, and work still runs in the order it was sent.
/// A run nested in one of the loop's own executor jobs runs no jobs (`LoopJobQueue.depth`; see
/// "One pass of the loop").
///
/// Every pass reads these, so the hot ones skip dynamic exclusivity checks (a thread-local lookup
/// each): they are confined to the loop thread, and no access spans a callout (the queues' methods
/// never call out: the core takes an item from a queue, then calls out).
final class LoopCore {
  /// The cross-thread half: inbox, wake-up, thread bookkeeping; members bind to it.
  let shared: LoopShared
  let poller: EpollPoller
  let modeTable = ModeTable()
  /// Metrics and stall-watch stamps (see `LoopCore.observed`).
  let monitor: LoopMonitor

  /// The handle callouts receive: the user's, or, once it was dropped, a stand-in.
  @inline(__always)
  var loop: RunLoopThread { shared.handle.unsafelyUnwrapped }

  // MARK: The owned thread's hold on its handle

  /// The owned thread's reference to its handle, held while it is awake and released around its
  /// top-level sleeps, so that the user's last release can reclaim the loop.
  @exclusivity(unchecked) var heldHandle: Unmanaged<RunLoopThread>?
  /// The stand-in handle of a dropped loop (kept until the thread exits).
  var standIn: RunLoopThread?

  // MARK: Runs and the drain

  /// How many runs are on the stack (kept for loops that divert jobs at shutdown only).
  @exclusivity(unchecked) var runDepth = 0
  /// The shutdown drain has terminated the loop: an add made on its thread now (a cancel routine
  /// of the last detach) invalidates the member, as an add from another thread does.
  @exclusivity(unchecked) var hasTerminated = false
  /// `drainForShutdown` is running (a callout of the drain that drains again is a no-op).
  @exclusivity(unchecked) var isDraining = false
  /// How long this loop's shutdown drain accepts new jobs and changes (see `drainForShutdown`):
  /// `shutdownDrainNanoseconds`, unless a test raised it to see an uncut drain on a slow run.
  @exclusivity(unchecked) var drainCapNanoseconds = LoopCore.shutdownDrainNanoseconds

  // MARK: The work other threads sent, by concern

  /// Executor jobs taken from the inbox and not run yet, and the jobs on the stack.
  @exclusivity(unchecked) var jobs = LoopJobQueue<LoopJob>()
  /// The serial- or task-role job `runCollectedJobs` is running now, if any (see
  /// `isRunningJobThatMayPreferTheLoop`).
  @exclusivity(unchecked) var runningJob: UnownedJob?
  /// Blocks (`perform`) taken from the inbox and not run yet.
  @exclusivity(unchecked) var blocks = LoopBlockQueue()
  /// Registration changes taken from the inbox and not applied yet, with the ordering rule that
  /// every block, job and signal follows.
  @exclusivity(unchecked) var changes = LoopChangeQueue()
  /// Custom sources signalled and not fired yet.
  @exclusivity(unchecked) var signalled = SignalledSources()

  // MARK: Descriptors and timers

  /// Readiness registrations, the armed mode, the silenced list, unknown tokens.
  @exclusivity(unchecked) var descriptors = LoopDescriptors()
  /// Sequence numbers for timer-heap entries (equal deadlines fire in scheduling order).
  @exclusivity(unchecked) var timerSequence: UInt64 = 0

  // MARK: Early fires (see `LoopCore+EarlyFire`)

  /// The terms of the innermost run on the stack, nil outside every run.
  @exclusivity(unchecked) var innermostRun: RunTerms?
  /// When the job on the stack first fired a source early (0: it has not).
  @exclusivity(unchecked) var earlyFireWindowStart: Int64 = 0

  /// The most executor jobs one work point runs before the pass looks at timers and sources again.
  static let jobsPerPass = 1024

  init(shared: LoopShared) {
    self.shared = shared
    self.poller = shared.poller
    monitor = LoopMonitor(observation: shared.observation)
  }

  // MARK: Taking the inbox

  /// Takes everything other threads sent since the last look, under one lock: registration
  /// changes (behind those still waiting), blocks, a new batch of jobs (when the current one is
  /// used up and no job runs) and signalled sources. `afterWake` also records that the loop is
  /// awake (producers need not wake it) and that the pass a `wakeUp()` asked for is happening.
  func collectInbox(afterWake: Bool = false) {
    // Nothing arrived since the loop last looked: no lock (a wake-up must still be noted).
    guard afterWake || shared.arrivalsWaiting.load(ordering: .acquiring) else { return }
    // A current loop's thread takes jobs only inside a run: outside one, every job it accepted
    // stays in the inbox (a loop-thread add there collects the inbox too), where a shutdown hands
    // them to the fallback in order.
    let needJobs = (runDepth > 0 || !shared.divertsJobsAtShutdown) && jobs.prepareForNewBatch()
    shared.inboxLock.lock()
    if afterWake {
      shared.inbox.didWake()
      shared.inbox.wakeRequested = false
    }
    if changes.take(from: &shared.inbox.controls) {
      shared.changesWaiting.store(false, ordering: .relaxed)  // (under the lock, as every store)
    }
    let takesBlockChunks = blocks.take(from: &shared.inbox.performs)
    let takesJobChunks = needJobs && jobs.take(from: &shared.inbox.jobs)
    signalled.take(from: &shared.inbox.signalled)
    // Jobs left here, a stop or wake-up request to consume, a shutdown: the next look takes the
    // lock. (Relaxed: every store of the flag is made under the lock, so stores are ordered by it;
    // what an arrival wrote is published by the arrival's own releasing store.)
    shared.arrivalsWaiting.store(shared.inbox.hasWork() || shared.inbox.life.isShutDown, ordering: .relaxed)
    shared.inboxLock.unlock()
    if takesBlockChunks { blocks.adoptArrived() }
    if takesJobChunks { jobs.adoptArrived() }
  }

  // MARK: Registration changes

  /// Collects the inbox and applies the registration changes other threads sent, in the order
  /// they were sent (see `LoopChangeQueue` for the rule). A change that runs the loop nested (a
  /// schedule routine, say) has the nested run continue this same queue.
  ///
  /// `bounded` (the pass's own calls) draws on the pass's budget (`LoopChangeQueue.passBudget`).
  /// While changes wait, the pass runs no block or job sent after them and does not sleep.
  ///
  /// `through` stops before the first change with a later sequence number (see
  /// `sequenceOfWaitingChanges`). `stoppingAtSignals` (step 2) also stops before the first change
  /// sent after a signal that was collected and waits to fire: a signal waits only for the changes
  /// sent before it, and step 4 fires it in this pass instead of after another budget of changes
  /// (the rest of the budget goes to the work points after it).
  func applyControls(
    afterWake: Bool = false, bounded: Bool = false, through: UInt64 = UInt64.max, stoppingAtSignals: Bool = false
  ) {
    collectInbox(afterWake: afterWake)
    guard changes.hasWaiting else { return }
    var allowance = changes.allowance(bounded: bounded)
    guard allowance > 0 else { return }
    let through = stoppingAtSignals ? min(through, signalled.oldestWaitingSequence) : through
    // What was collected, and no more: a change that arrives meanwhile was sent after this call
    // began, so it need not come before what follows the call (a loop-thread add, say), and
    // taking it too would let a flood from another thread hold the call forever. (A loop-thread
    // call inside a change collects again when it begins: what was sent before it comes first.)
    changes.beginApplying()
    while let change = changes.takeNext(through: through, allowance: &allowance, bounded: bounded) {
      apply(change)  // (outside the queue's access: it may call out)
    }
    changes.endApplying()
  }

  /// `applyControls()` when a change from another thread may wait (collected or still in the
  /// inbox); otherwise nothing, without taking the inbox lock. For calls on the loop thread that
  /// must come after every change sent before them (adds, removals).
  @inline(__always)
  func applyControlsIfAny() {
    if changes.hasWaiting || shared.changesWaiting.load(ordering: .acquiring) { applyControls() }
  }

  /// Loop thread, under a member's lock right after a loop-thread call changed its binding (having
  /// applied every change sent before it began): the inbox's newest sequence number when a change
  /// from another thread arrived meanwhile, else nil. Applying through it applies exactly the
  /// changes sent before the binding changed: among them any of this member's (its senders hold
  /// the member's lock while they send), which must come first, and none sent after, which must
  /// not overtake this call.
  func sequenceOfWaitingChanges() -> UInt64? {
    guard shared.changesWaiting.load(ordering: .acquiring) else { return nil }
    return shared.inboxLock.withLock { shared.inbox.sequence }
  }

  /// Inside the application of changes: a callout of one of them is running.
  @inline(__always)
  var isApplyingControls: Bool { changes.isApplying }

  // MARK: Work points

  /// Runs the collected blocks that may run in `mode`, oldest first; keeps the others. A run
  /// nested in one of them continues the same queue (see `LoopBlockQueue`).
  /// (Performed blocks are not input sources: they never end a run as "handled a source".)
  @inline(__always)
  func runCollectedPerforms(in mode: RunLoopMode) {
    guard !blocks.isEmpty else { return }  // (inlined: most work points have no block)
    runCollectedPerformsNow(in: mode)
  }

  /// `runCollectedPerforms(in:)` once blocks were collected.
  private func runCollectedPerformsNow(in mode: RunLoopMode) {
    let inCommon = modeTable.commonModes.contains(mode)
    blocks.beginScan()
    var index = 0
    // (The barrier is read again for each block: one may apply changes.)
    while let request = blocks.takeNext(from: &index, in: mode, inCommon: inCommon, before: changes.barrier) {
      observed(.performedBlock) { request.block() }
    }
    blocks.endScan()
  }

  /// Whether a collected block may run in `mode`.
  func hasRunnablePerform(in mode: RunLoopMode) -> Bool {
    guard !blocks.isEmpty else { return false }
    return blocks.hasRunnable(in: mode, inCommon: modeTable.commonModes.contains(mode), before: changes.barrier)
  }

  /// Whether jobs may run here now: not inside one of the loop's own jobs (see "One pass of the loop").
  @inline(__always)
  var mayRunJobs: Bool { jobs.mayRun }

  /// Whether collected jobs wait to run (and may run now).
  @inline(__always)
  var hasRunnableJobs: Bool { jobs.hasRunnable(before: changes.barrier) }

  /// Runs collected executor jobs, oldest first, at most `jobsPerPass` per call, so timers and
  /// sources get their turn (a job that re-enqueues itself lands in the inbox, not in the batch
  /// being run, so it runs at most once per call). Runs nothing inside a job: a run nested in one
  /// of the loop's jobs must not start another (the serial contract).
  @inline(__always)
  func runCollectedJobs() {
    // Inlined: most work points have no job, and the call below sets up its callout first.
    guard jobs.mayRun, jobs.hasLeft else { return }
    runCollectedJobsNow()
  }

  /// `runCollectedJobs()` once it is known there are jobs to run.
  private func runCollectedJobsNow() {
    let end = jobs.end(runningAtMost: Self.jobsPerPass)
    let serial = loop.asUnownedSerialExecutor()
    let task = loop.asUnownedTaskExecutor()
    jobs.depth = 1
    defer { jobs.depth = 0 }
    // A job that arrived after a change that still waits ends the call: it (and every later job)
    // waits too.
    while let job = jobs.takeNext(before: changes.barrier, end: end) {
      // Each job runs in the role it was enqueued in, so its awaits do not hop (see `JobRole`).
      earlyFireWindowStart = 0
      observed(.job, priority: TaskPriority(job.job.priority), since: job.enqueuedAt) {
        switch job.role {
        case .serial:
          runningJob = job.job
          job.job.runSynchronously(on: serial)
          runningJob = nil
        case .serialOnTaskExecutor: job.job.runSynchronously(isolatedTo: serial, taskExecutor: task)
        case .task:
          runningJob = job.job
          job.job.runSynchronously(on: task)
          runningJob = nil
        }
      }
    }
  }

  /// Whether `job` is the serial- or task-role job `runCollectedJobs` is running now, enqueueing
  /// itself on the loop's serial role: the sign of a task that prefers this loop as its task
  /// executor (see `JobRole`). Loop thread.
  @inline(__always)
  func isRunningJobThatMayPreferTheLoop(_ job: UnownedJob) -> Bool {
    guard let running = runningJob else { return false }
    return unsafeBitCast(running, to: UInt.self) == unsafeBitCast(job, to: UInt.self)
  }

  /// Runs `job` as one of the loop's jobs (a job the loop runs outside `runCollectedJobs`, such
  /// as a sleeper's timer resuming it): a run nested in it runs no other job, and it is one `.job`
  /// callout for the stall watch and the metrics, as a job `runCollectedJobs` runs (inside a
  /// timer's handler, nested in the timer's callout).
  @inline(__always)
  func runAsJob(priority: @autoclosure () -> TaskPriority?, _ job: () -> Void) {
    jobs.depth += 1
    defer { jobs.depth -= 1 }
    earlyFireWindowStart = 0
    observed(.job, priority: priority()) { job() }
  }

  /// One work point of a pass: registration changes (when asked), then blocks for `mode`, then
  /// jobs.
  @inline(__always)
  func runWork(in mode: RunLoopMode, applyingControls: Bool) {
    if applyingControls { applyControls(bounded: true) }
    runCollectedPerforms(in: mode)  // each block and job waits for the changes sent before it
    runCollectedJobs()
  }

  /// Collects the inbox, then runs blocks for `mode` and up to `jobsPerPass` jobs. For callers
  /// outside a pass (the shutdown drain).
  func runJobs() {
    applyControls()
    runCollectedJobs()
  }
}
