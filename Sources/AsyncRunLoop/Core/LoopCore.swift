/// The loop-thread half of a loop: its mode table and member records, the timer heaps (inside the
/// modes), the descriptor registry, and the loop's own copies of the work other threads sent (jobs,
/// blocks, registration changes, signals). Not `Sendable`: only the loop's thread touches it (the
/// `RunLoopThread` handle forwards to it after checking `isOnLoopThread`, or through the inbox).
///
/// Re-entrancy: a callout may run the loop nested. Everything here that a pass iterates while it
/// calls out is either per run (`RunContext`) or one queue with a cursor that a nested run
/// continues instead of starting over (blocks, registration changes), so a nested run never
/// disturbs the batch of the run it is nested in, and work still runs in the order it was sent.
/// A run nested in one of the loop's own executor jobs runs no jobs (`jobDepth`; see "One pass of the loop").
///
/// Every pass reads these, so the hot ones skip dynamic exclusivity checks (a thread-local lookup
/// each): they are confined to the loop thread, and no access spans a callout.
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

  // MARK: Executor jobs

  /// Jobs taken from the inbox and not yet run (oldest first, from `localJobIndex`). A batch is
  /// only replaced while no job runs (`jobDepth == 0`), so a nested run cannot swap it under the
  /// `runCollectedJobs` that is iterating it.
  @exclusivity(unchecked) var localJobs: [LoopJob] = []
  @exclusivity(unchecked) var localJobIndex = 0
  /// Chunks of jobs taken from the inbox (a burst that filled more than one), appended to
  /// `localJobs` once the lock is released.
  @exclusivity(unchecked) var arrivedJobs: [[LoopJob]] = []
  /// A taken chunk kept (emptied) to hand the inbox its next chunk with capacity.
  @exclusivity(unchecked) var spareJobChunk: [LoopJob] = []
  /// How many executor jobs are on the stack (0 or 1: a run nested in a job runs no jobs).
  @exclusivity(unchecked) var jobDepth = 0
  /// How many runs are on the stack (kept for loops that divert jobs at shutdown only).
  @exclusivity(unchecked) var runDepth = 0
  /// The shutdown drain has terminated the loop: an add made on its thread now (a cancel routine
  /// of the last detach) invalidates the member, as an add from another thread does.
  @exclusivity(unchecked) var hasTerminated = false
  /// `drainForShutdown` is running (a callout of the drain that drains again is a no-op).
  @exclusivity(unchecked) var isDraining = false

  // MARK: Registration changes

  /// Registration changes taken from the inbox, applied in order (a nested `applyControls`
  /// continues the same queue, so later changes never overtake earlier ones): a list of batches,
  /// each a chunk of the inbox's queue as the loop took it (moved whole, so taking 100k changes
  /// costs O(chunks), not a copy in one pass), applied from `controlIndex` of batch
  /// `controlBatchIndex`. No batch in the list is empty.
  @exclusivity(unchecked) var controlBatches: [[SequencedChange]] = []
  @exclusivity(unchecked) var controlBatchIndex = 0
  @exclusivity(unchecked) var controlIndex = 0
  @exclusivity(unchecked) var controlDepth = 0
  /// The sequence number of the last change applied (changes are applied in order).
  @exclusivity(unchecked) var appliedThrough: UInt64 = 0
  /// How many more changes the current pass's bounded calls may apply: every bounded call of one
  /// pass (the run's start, step 2, each work point, the one after the wake) shares it, so a pass
  /// applies at most `controlsPerPass` however many calls it makes. Reset when a run begins and
  /// after each pass; a nested run keeps its own and gives the outer pass back what it had.
  @exclusivity(unchecked) var passControlBudget = LoopCore.controlsPerPass
  /// An applied batch kept (emptied, small) to hand the inbox its next array with capacity.
  @exclusivity(unchecked) var spareControlBatch: [SequencedChange] = []

  // MARK: Performed blocks

  /// Blocks taken from the inbox, oldest first; nil slots ran already. Blocks that may not run in
  /// the mode being run stay. A nested run scans the same list, so blocks keep their order.
  @exclusivity(unchecked) var performs: [PerformRequest?] = []
  /// Chunks taken from the inbox, appended to `performs` once the lock is released.
  @exclusivity(unchecked) var arrivedPerforms: [[PerformRequest]] = []
  /// A taken chunk kept (emptied) to hand the inbox its next chunk with capacity.
  @exclusivity(unchecked) var sparePerformChunk: [PerformRequest] = []
  @exclusivity(unchecked) var livePerformCount = 0
  @exclusivity(unchecked) var performScanDepth = 0

  // MARK: Signalled custom sources

  /// Sources signalled since the last step 4 (taken from the inbox), by their records here.
  @exclusivity(unchecked) var spareSignalled: [SignalledRecord] = []
  /// Signalled sources not in the mode being run: they fire when one of their modes runs. May hold
  /// records detached since (skipped, and dropped, by the next scan): a removal does not search it.
  @exclusivity(unchecked) var deferredSignalled: [MemberRecord] = []
  /// The mode whose pass last sorted `deferredSignalled` out, and `ModeTable.sourceJoins` then:
  /// while both still hold, none of those sources is in that mode, so its passes need not look at
  /// them again (with many sources signalled in other modes, every pass did, and a removal
  /// searched them all).
  @exclusivity(unchecked) var deferredScannedMode: ModeContents?
  @exclusivity(unchecked) var deferredScannedJoins: UInt64 = 0
  /// The ready sources of the step 4 on the stack that have not fired yet: a run nested in one of
  /// their handlers considers them too (they are still signalled), so it does not wait for them.
  @exclusivity(unchecked) var unfiredReadySources: ArraySlice<MemberRecord> = []
  /// Warm buffers for runs' ready lists (a nested run takes one, gives it back when it ends).
  @exclusivity(unchecked) var spareReadyBuffers: [[MemberRecord]] = []

  // MARK: Descriptors and timers

  /// Readiness registrations by epoll token, and the owner of each descriptor number.
  @exclusivity(unchecked) var descriptors = DescriptorRegistry()
  /// Sequence numbers for timer-heap entries (equal deadlines fire in scheduling order).
  @exclusivity(unchecked) var timerSequence: UInt64 = 0
  /// Tokens reported by the last wait that belong to no registration. A registration removed by an
  /// earlier handler of the same wait shows up once; one that epoll keeps for a closed number (a
  /// `dup` keeps the file open) shows up in every wait while ready, and the second sighting makes
  /// the loop rebuild its epoll set (`purgeLingeringRegistrations`).
  @exclusivity(unchecked) var unknownTokensLastWait: Set<UInt64> = []
  @exclusivity(unchecked) var unknownTokensThisWait: Set<UInt64> = []
  /// A wait reported a registration that must go (see above): rebuild after the wait.
  @exclusivity(unchecked) var needsEpollPurge = false
  /// The mode whose descriptors are armed in epoll.
  @exclusivity(unchecked) var armedMode: RunLoopMode?
  /// The registrations taken out of the epoll set (silenced in a mode that does not hold them, or
  /// paused) that a mode switch may have to arm again: a switch looks at these, not at every
  /// descriptor of the mode, so running a nested mode costs the same with 20k descriptors on the
  /// loop as with none. Each knows its index here (`DescriptorRegistration.silencedIndex`).
  @exclusivity(unchecked) var silencedDescriptors: [MemberRecord] = []

  /// The most executor jobs one work point runs before the pass looks at timers and sources again.
  static let jobsPerPass = 1024

  init(shared: LoopShared) {
    self.shared = shared
    self.poller = shared.poller
    monitor = LoopMonitor(observation: shared.observation)
    localJobs.reserveCapacity(256)
  }

  // MARK: Taking the inbox

  /// Takes everything other threads sent since the last look, under one lock: registration
  /// changes, blocks, a new batch of jobs (when the current one is used up and no job runs) and
  /// signalled sources. `afterWake` also records that the loop is awake (producers need not wake
  /// it) and that the pass a `wakeUp()` asked for is happening.
  ///
  /// Changes are appended behind those still waiting (each change is moved once); blocks and jobs
  /// carry their arrival number and wait for the changes that arrived before them
  /// (`changeBarrier`).
  func collectInbox(afterWake: Bool = false) {
    // A current loop's thread takes jobs only inside a run: outside one, every job it accepted
    // stays in the inbox (a loop-thread add there collects the inbox too), where a shutdown hands
    // them to the fallback in order.
    let needJobs =
      jobDepth == 0 && localJobIndex >= localJobs.count && (runDepth > 0 || !shared.divertsJobsAtShutdown)
    if needJobs && !localJobs.isEmpty {
      localJobs.removeAll(keepingCapacity: true)
      localJobIndex = 0
    }
    shared.inboxLock.lock()
    if afterWake {
      shared.inbox.didWake()
      shared.inbox.wakeRequested = false
    }
    if !shared.inbox.controls.isEmpty {  // (its chunks are never empty: applying indexes into each)
      shared.inbox.controls.takeAll(appendingTo: &controlBatches, spare: &spareControlBatch)
      shared.changesWaiting.store(false, ordering: .relaxed)  // (under the lock, as every store)
    }
    let takesPerforms = !shared.inbox.performs.isEmpty
    if takesPerforms { shared.inbox.performs.takeAll(appendingTo: &arrivedPerforms, spare: &sparePerformChunk) }
    // Jobs: the inbox's one chunk swapped with the empty batch in O(1) (the usual case, which
    // allocates nothing once both are warm), or a burst's chunks moved out whole.
    let takesJobChunks =
      needJobs && !shared.inbox.jobs.isEmpty && !shared.inbox.jobs.takeTail(swappingWith: &localJobs)
    if takesJobChunks { shared.inbox.jobs.takeAll(appendingTo: &arrivedJobs, spare: &spareJobChunk) }
    if !shared.inbox.signalled.isEmpty {
      spareSignalled.append(contentsOf: shared.inbox.signalled)
      shared.inbox.signalled.removeAll(keepingCapacity: true)
    }
    shared.inboxLock.unlock()
    if takesPerforms { adoptArrivedPerforms() }
    if takesJobChunks { adoptArrivedJobs() }
  }

  /// Appends the jobs taken from the inbox in chunks to the (empty) batch, after the lock is
  /// released.
  private func adoptArrivedJobs() {
    for chunk in arrivedJobs { localJobs.append(contentsOf: chunk) }
    if !arrivedJobs.isEmpty { ChunkedQueue.recycle(&arrivedJobs[arrivedJobs.count - 1], asSpare: &spareJobChunk) }
    arrivedJobs.removeAll(keepingCapacity: true)
  }

  /// Appends the blocks taken from the inbox to `performs`, after the lock is released.
  private func adoptArrivedPerforms() {
    for chunk in arrivedPerforms {
      for request in chunk { performs.append(request) }
      livePerformCount += chunk.count
    }
    if !arrivedPerforms.isEmpty {
      ChunkedQueue.recycle(&arrivedPerforms[arrivedPerforms.count - 1], asSpare: &sparePerformChunk)
    }
    arrivedPerforms.removeAll(keepingCapacity: true)
  }

  /// Collects the inbox and applies the registration changes other threads sent, in the order
  /// they were sent, before any block or job collected with them runs. A change that runs the loop
  /// nested (a schedule routine, say) has the nested run continue this same queue.
  ///
  /// `bounded` (the pass's own calls) draws on `passControlBudget`, which every bounded call of
  /// one pass shares: a pass applies at most `controlsPerPass`, so a burst of 100k removals from
  /// another thread is spread over passes (each one ends quickly, so timers and descriptors keep
  /// their turn) instead of one pass that takes 100 ms. While changes wait, the pass runs no block
  /// or job (they may have been sent after those changes) and does not sleep.
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
    guard hasWaitingControls else { return }
    var budget = bounded ? passControlBudget : Int.max
    guard budget > 0 else { return }
    let through = stoppingAtSignals ? min(through, oldestCollectedSignal) : through
    controlDepth += 1
    // What was collected, and no more: a change that arrives meanwhile was sent after this call
    // began, so it need not come before what follows the call (a loop-thread add, say), and
    // taking it too would let a flood from another thread hold the call forever. (A loop-thread
    // call inside a change collects again when it begins: what was sent before it comes first.)
    while budget > 0 && hasWaitingControls && changeBarrier <= through {
      appliedThrough = controlBatches[controlBatchIndex][controlIndex].sequence
      let change = controlBatches[controlBatchIndex][controlIndex].change
      // Release what the change holds as it is applied, not all at once when the queue empties
      // (100k removals' closures freed together made one pass take 10 ms).
      controlBatches[controlBatchIndex][controlIndex] = Self.appliedChange
      controlIndex += 1
      if controlIndex == controlBatches[controlBatchIndex].count {
        controlBatchIndex += 1
        controlIndex = 0
      }
      budget -= 1
      if bounded { passControlBudget = budget }  // before the callout: a nested run restores it
      apply(change)
    }
    controlDepth -= 1
    if controlDepth == 0 { dropAppliedControlBatches() }
  }

  /// `applyControls()` when a change from another thread may wait (collected or still in the
  /// inbox); otherwise nothing, without taking the inbox lock. For calls on the loop thread that
  /// must come after every change sent before them (adds, removals).
  @inline(__always)
  func applyControlsIfAny() {
    if hasWaitingControls || shared.changesWaiting.load(ordering: .acquiring) { applyControls() }
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

  /// Frees the batches applied so far (no run is applying changes further out), keeping a small
  /// one for the inbox to fill next.
  private func dropAppliedControlBatches() {
    guard controlBatchIndex > 0 else { return }
    ChunkedQueue.recycle(&controlBatches[0], asSpare: &spareControlBatch)
    controlBatches.removeFirst(controlBatchIndex)
    controlBatchIndex = 0
  }

  /// The sequence number of the oldest signal collected and not fired yet (`UInt64.max`: none).
  /// Signals are collected in the order they were sent, after those kept from a nested run or
  /// another mode (numbered 0: they wait for no change).
  private var oldestCollectedSignal: UInt64 {
    spareSignalled.first { $0.sequence > 0 }?.sequence ?? UInt64.max
  }

  /// Inside the application of changes: a callout of one of them is running.
  @inline(__always)
  var isApplyingControls: Bool { controlDepth > 0 }

  /// Registration changes collected and not applied yet (a bounded pass left them).
  @inline(__always)
  var hasWaitingControls: Bool { controlBatchIndex < controlBatches.count }

  /// Blocks and jobs that arrived at or after this number wait: the change with this number (and
  /// later ones) is not applied yet. `UInt64.max` when no change waits.
  @inline(__always)
  var changeBarrier: UInt64 {
    hasWaitingControls ? controlBatches[controlBatchIndex][controlIndex].sequence : UInt64.max
  }

  /// What an applied change's slot holds until the queue empties.
  private static var appliedChange: SequencedChange { SequencedChange(sequence: 0, change: .applied) }

  /// The most registration changes one pass applies (its bounded `applyControls` calls together).
  static let controlsPerPass = 256

  // MARK: Work points

  /// Runs the collected blocks that may run in `mode`, oldest first; keeps the others.
  /// (Performed blocks are not input sources: they never end a run as "handled a source".)
  func runCollectedPerforms(in mode: RunLoopMode) {
    guard livePerformCount > 0 else { return }
    let inCommon = modeTable.commonModes.contains(mode)
    performScanDepth += 1
    var index = 0
    while index < performs.count {
      if let request = performs[index], request.sequence < changeBarrier, request.canRun(in: mode, inCommon: inCommon) {
        performs[index] = nil
        livePerformCount -= 1
        observed(.performedBlock) { request.block() }
      }
      index += 1
    }
    performScanDepth -= 1
    guard performScanDepth == 0 else { return }  // a scan further out still walks the list
    if livePerformCount == 0 {
      performs.removeAll(keepingCapacity: true)
    } else if performs.count > 2 * livePerformCount + 16 {
      performs.removeAll { $0 == nil }
    }
  }

  /// Whether a collected block may run in `mode`.
  func hasRunnablePerform(in mode: RunLoopMode) -> Bool {
    guard livePerformCount > 0 else { return false }
    let inCommon = modeTable.commonModes.contains(mode)
    let barrier = changeBarrier
    return performs.contains { request in
      guard let request else { return false }
      return request.sequence < barrier && request.canRun(in: mode, inCommon: inCommon)
    }
  }

  /// Whether jobs may run here now: not inside one of the loop's own jobs (see "One pass of the loop").
  @inline(__always)
  var mayRunJobs: Bool { jobDepth == 0 }

  /// Whether collected jobs wait to run (and may run now).
  @inline(__always)
  var hasRunnableJobs: Bool {
    jobDepth == 0 && localJobIndex < localJobs.count && localJobs[localJobIndex].sequence < changeBarrier
  }

  /// Runs collected executor jobs, oldest first, at most `jobsPerPass` per call, so timers and
  /// sources get their turn (a job that re-enqueues itself lands in the inbox, not in the batch
  /// being run, so it runs at most once per call). Runs nothing inside a job: a run nested in one
  /// of the loop's jobs must not start another (the serial contract).
  func runCollectedJobs() {
    guard jobDepth == 0, localJobIndex < localJobs.count else { return }
    let end = min(localJobs.count, localJobIndex + Self.jobsPerPass)
    let serial = loop.asUnownedSerialExecutor()
    let task = loop.asUnownedTaskExecutor()
    jobDepth = 1
    defer { jobDepth = 0 }
    while localJobIndex < end {
      let job = localJobs[localJobIndex]
      // It arrived after a change that still waits: it (and every later job) waits too.
      guard job.sequence < changeBarrier else { break }
      localJobIndex += 1
      // Each job runs in the role it was enqueued in, so its awaits do not hop (see `JobRole`).
      observed(.job, priority: TaskPriority(job.job.priority), since: job.enqueuedAt) {
        switch job.role {
        case .serial: job.job.runSynchronously(on: serial)
        case .task: job.job.runSynchronously(on: task)
        }
      }
    }
  }

  /// Runs `job` as one of the loop's jobs (a job the loop runs outside `runCollectedJobs`, such
  /// as a sleeper's timer resuming it): a run nested in it runs no other job.
  @inline(__always)
  func runAsJob(_ job: () -> Void) {
    jobDepth += 1
    defer { jobDepth -= 1 }
    job()
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

extension PerformRequest {
  /// Whether the block may run during a pass in `mode` (`inCommon`: `mode` is in the common set).
  @inline(__always)
  func canRun(in mode: RunLoopMode, inCommon: Bool) -> Bool {
    anyMode || modes.contains(mode) || (inCommon && modes.contains(.common))
  }
}
