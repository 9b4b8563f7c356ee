import CAsyncRunLoop
import Glibc
import Synchronization

/// The cross-thread half of a loop: its name, poller (wake-up), inbox and thread bookkeeping.
/// Members bind to this object, never to the `RunLoopThread` handle, so a member scheduled on a
/// loop does not keep the user's handle alive: dropping the last handle reclaims the loop (see
/// `RunLoopThread.deinit`).
///
/// The calling thread's "current loop" slot points at this object, so `isOnLoopThread` is one
/// load and a compare, and stays right when the handle is replaced (a dropped loop drains with a
/// stand-in handle).
final class LoopShared: @unchecked Sendable {  // Safety: proof below
  // Safety: `name`, `ownsThread`, `isMainLoop`, `poller`, `timeSource`, `inboxLock`, `threadLock`,
  // `terminatedGate` and `observation` (itself `Sendable`) are immutable references. `inbox` and
  // `handleDropped` are only touched with `inboxLock` held; `threadState` only with `threadLock`
  // held. `handle` and `core` are written
  // in init, and `handle` again only by the dropping handle's deinit under `inboxLock` while the
  // loop thread holds no reference to it (asleep, see `LoopCore.releaseHandleForSleep`), or by the
  // loop thread itself; the loop thread reads it after `reacquireHandleAfterSleep` took the lock.
  // `handle` is written in init and afterwards only by the loop thread (installing a dropped
  // handle's stand-in, under `inboxLock`), so the loop thread reads it without the lock; other
  // threads read it only through the thread-local slot of that thread (`currentIfExists`).
  // `core` is only dereferenced on the loop thread (checked with `isOnLoopThread`), while the
  // loop thread keeps the core alive.

  /// The loop's name (also its thread's name, truncated to 15 bytes by the kernel).
  let name: String
  /// Who runs the loop's thread (see `LoopLifecycle.Kind`).
  let kind: LoopLifecycle.Kind
  /// True for loops created with `init(name:)`: they run on a thread of their own until shutdown.
  var ownsThread: Bool { kind == .ownsThread }
  var isMainLoop: Bool { kind == .main }
  let poller: EpollPoller
  /// Metrics and the stall watch, as other threads see them (see `LoopMonitor` for the loop's side).
  let observation: LoopObservation
  /// Where the loop reads the time (`LoopTimeSource`); fixed for the loop's life.
  let timeSource: LoopTimeSource

  // `@exclusivity(unchecked)`: a dynamic exclusivity check costs a thread-local lookup per access,
  // which after a wake-up was the largest user-space item left in the wake-rtt profile. `inbox`
  // is only touched under `inboxLock`, and no access spans a call out.
  let inboxLock = PthreadLock.make()
  @exclusivity(unchecked) var inbox: LoopInbox
  /// `inbox.life.loopThreadIsIsolated`, readable without the lock (`isIsolatingCurrentContext`
  /// asks it on every isolation check); stored under `inboxLock` after every event that changes it
  /// (`publishIsolationLocked`). It turns false before the first job is handed to the fallback
  /// (releasing), so a thread that sees a job of the loop run there sees it false (acquiring); the
  /// loop's thread itself writes the changes of its run state, so it reads its own writes.
  let threadIsIsolated: Atomic<Bool>
  /// True from a change's arrival in the inbox until the loop takes it (both under `inboxLock`):
  /// lets a call on the loop thread skip the lock when no change from another thread waits. A
  /// change whose send happened before that call set it before (release), so the call sees it
  /// (acquire); one sent concurrently has no order to keep.
  let changesWaiting = Atomic<Bool>(false)
  /// False only while the inbox holds nothing for the loop thread to take or consume (no change,
  /// block, job or signal, no stop or wake-up request, not shut down): lets the loop's work points
  /// and end-of-pass checks skip the inbox lock when nothing arrived since it last looked. Set by
  /// every arrival (`arrive`), recomputed when the loop takes the inbox (`LoopCore.collectInbox`),
  /// both under `inboxLock`, so the lock orders every store. A read without the lock (acquiring)
  /// sees any arrival that happened before it, or a later collect that took it; an arrival that
  /// races the read is seen under the lock before the loop sleeps (`LoopInbox.prepareToSleep`), so
  /// at worst it waits for the next work point.
  let arrivalsWaiting = Atomic<Bool>(true)
  /// The user's handle was released (`RunLoopThread.deinit`): `handle` is now a stand-in.
  var handleDropped = false

  let threadLock = PthreadLock.make()
  var threadState = ThreadState.notStarted
  let terminatedGate = BlockingGate()

  /// The handle that callouts receive (the user's, or after it was dropped a stand-in); set right
  /// after init.
  unowned(unsafe) var handle: RunLoopThread?
  /// The loop-thread half; set right after init. Safety of `unowned(unsafe)`: dereferenced on the
  /// loop thread only, where the running loop (or the handle) keeps the core alive.
  unowned(unsafe) var coreIfSet: LoopCore?
  @inline(__always)
  var core: LoopCore { coreIfSet.unsafelyUnwrapped }

  /// Under `inboxLock`: the owned thread holds its reference to `handle` now (see
  /// `LoopCore.releaseHandleForSleep`).
  var threadHoldsHandle = false
  /// The owned thread has finished its drain and is exiting (under `inboxLock`): a last release
  /// of the handle from now on leaves it be (`LoopCore.handleWillDeinit`).
  var threadIsEnding = false
  /// Under `inboxLock`: a dropping handle's deinit waits here for the thread to let go.
  var handleLetGo: BlockingGate?

  /// The owned thread's life, for joining it exactly once.
  enum ThreadState {
    case notStarted
    case running(pthread_t)
    /// `shutdownAndWait()` will join the thread.
    case joinerRegistered(pthread_t)
    /// The thread's work is done and nobody joined it yet.
    case finished(pthread_t)
    /// Joined, or detached (a dropped loop's thread, which nobody will join).
    case reaped
  }

  /// Unique among every loop this process ever made (never reused, unlike an object's address):
  /// what a member's binding names the loop its last sent change went to with
  /// (`MemberBinding.lastSentSequence(on:)`).
  let serial: UInt64

  /// The next `serial`.
  private static let serials = Atomic<UInt64>(1)

  init(name: String, ownsThread: Bool, isMainLoop: Bool, poller: EpollPoller, timeSource: LoopTimeSource = .system) {
    self.timeSource = timeSource
    serial = Self.serials.wrappingAdd(1, ordering: .relaxed).oldValue
    self.name = name
    kind = isMainLoop ? .main : ownsThread ? .ownsThread : .current
    inbox = LoopInbox(kind: kind)
    threadIsIsolated = Atomic(inbox.life.loopThreadIsIsolated)
    self.poller = poller
    observation = LoopObservation(loopName: name)
  }

  /// Under `inboxLock`, after the lifecycle changed (a current loop's thread entered or left a
  /// run, the jobs left the thread): the lock-free copy of the isolation answer follows.
  @inline(__always)
  func publishIsolationLocked() {
    threadIsIsolated.store(inbox.life.loopThreadIsIsolated, ordering: .releasing)
  }

  /// The value of the calling thread's "current loop" slot while it is this loop's thread.
  @inline(__always)
  var identity: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }

  /// True when the caller is on this loop's thread. Any thread. Not fooled by thread-id reuse:
  /// the check reads a thread-local slot, which a new thread starts empty.
  @inline(__always)
  var isOnLoopThread: Bool {
    if carl_current_loop() == identity { return true }
    guard isMainLoop, carl_is_main_thread() != 0 else { return false }
    if carl_current_loop() == nil { carl_set_current_loop(identity) }  // bind the main thread once
    return carl_current_loop() == identity
  }

  /// Wakes the loop the way the inbox said (after releasing the inbox lock).
  @inline(__always)
  func perform(_ action: LoopInbox.WakeAction) {
    switch action {
    case .none: break
    case .wakeLoop(let mechanism): poller.wake(mechanism)
    }
  }

  /// Runs `event`, which hands the loop thread something through `inbox` (work, a request, the
  /// shutdown), under `inboxLock`, and notes the arrival (`arrivalsWaiting`). Returns the event's
  /// result: the caller acts on it after the lock is released. Any thread.
  @inline(__always)
  func arrive<Result>(_ event: () -> Result) -> Result {
    inboxLock.lock()
    defer { inboxLock.unlock() }
    arrivalsWaiting.store(true, ordering: .releasing)
    return event()
  }

  /// A source was signalled: queue its record here and wake the loop. Any thread.
  func enqueueSignalled(_ record: MemberRecord) {
    perform(arrive { inbox.signal(record) })
  }

  /// Sends a registration change to the loop thread: at once when called there, otherwise on
  /// the loop's next pass. Returns false when the loop has terminated.
  @discardableResult
  func onLoopThread(_ change: RegistrationChange) -> Bool {
    if isOnLoopThread {
      // Changes sent before from other threads come first; not from inside the application of
      // changes (a callout of one), which would apply the rest of the queue once per nesting
      // level: this change (an invalidation, a new date, a mode joining the common set) does not
      // depend on their order.
      if !core.isApplyingControls { core.applyControlsIfAny() }
      core.apply(change)
      return true
    }
    guard let wake = send(change) else { return false }
    perform(wake)
    return true
  }

  /// `onLoopThread` for a change of no frequent kind (`RegistrationChange.custom`).
  @discardableResult
  func onLoopThread(_ change: @escaping (LoopCore) -> Void) -> Bool { onLoopThread(.custom(change)) }

  /// Queues a change for the loop thread (the caller wakes it with the result, after releasing
  /// any lock it holds). nil once terminated. Any thread.
  func send(_ change: RegistrationChange) -> LoopInbox.WakeAction? {
    sendNumbered(change)?.wake
  }

  /// `send`, with the sequence number the change got in the inbox.
  func sendNumbered(_ change: RegistrationChange) -> (wake: LoopInbox.WakeAction, sequence: UInt64)? {
    arrive {
      guard let wake = inbox.control(change) else { return nil }
      changesWaiting.store(true, ordering: .releasing)
      return (wake, inbox.sequence)
    }
  }

  /// Has the loop detach an invalidated member. A terminated loop has detached every member
  /// already: then only the member's closures are left to release, here.
  /// `record` is the member's record here (nil when it was removed: the removal detaches it).
  func detachInvalidated(_ member: some LoopMember, _ record: MemberRecord?) {
    if !onLoopThread(.invalidate(member, record)) {
      member.releaseAfterInvalidation(onThreadOf: nil)
    }
  }

  /// Loop side of `LoopTimer.setFireDate`: the timer's record here follows its new date. Any thread.
  /// False when the loop has terminated (the change was refused).
  @discardableResult
  func rescheduleTimer(_ record: MemberRecord) -> Bool {
    onLoopThread(.reschedule(record))
  }

  /// A loop that does not own its thread and is not the main loop (`RunLoopThread.current`): its
  /// thread drains it only when the thread exits, so once it is shut down its jobs leave that
  /// thread whenever the thread is out of a run (`LoopInbox.divertJobs`), instead of waiting, with
  /// the tasks that await them, for as long as the thread lives.
  var divertsJobsAtShutdown: Bool { kind.handsOffWaitsAtShutdown }

  /// Under `inboxLock`: for a loop that diverts its jobs, what must not wait for its thread to exit
  /// either, keyed by its owner, run when the jobs are diverted: a sleep pending on its timers
  /// does what its timer's invalidation would (a `Task.sleep` job waits for its deadline
  /// elsewhere, a `clock` sleep throws `CancellationError`), and a caller blocked in
  /// `performAndWait` whose block has not started is released with `RunLoopError.shutDown` (the
  /// block is skipped when the drain reaches it). Each is once-only, so what the thread's drain
  /// later does for the same owner finds it done.
  var divertHandOffs: [ObjectIdentifier: @Sendable () -> Void] = [:]

  /// Under `inboxLock`: how to end each async sequence made on a loop that diverts its jobs, run
  /// when they are diverted (see `registerSequenceEnding`). Entries whose sequence is gone are
  /// pruned when the list has doubled since the last pruning, so it never outgrows twice the
  /// sequences alive.
  private var sequenceEndings: [SequenceEnding] = []
  private var sequenceEndingsPruneAt = 64

  struct SequenceEnding {
    weak var owner: AnyObject?
    let end: @Sendable () -> Void
  }

  /// Registers how to end `owner`, a sequence of this loop, when its jobs are diverted: its consumer
  /// gets what was accepted, then the end, without waiting for the thread to detach it (a detach
  /// later finds it ended). False when they were diverted already: the caller ends it now. Any
  /// thread.
  ///
  /// No weak reference is loaded under the inbox lock: a load takes a strong reference whose
  /// release may be a sequence's last, and its deinit invalidates the source, which takes the lock.
  func registerSequenceEnding(_ owner: AnyObject, _ end: @escaping @Sendable () -> Void) -> Bool {
    let toPrune: [SequenceEnding]? = inboxLock.withLock {
      guard !inbox.life.jobsLeftThread else { return nil }
      sequenceEndings.append(SequenceEnding(owner: owner, end: end))
      guard sequenceEndings.count >= sequenceEndingsPruneAt else { return [] }
      defer { sequenceEndings.removeAll() }
      return sequenceEndings  // pruned outside the lock, below
    }
    guard let toPrune else { return false }
    guard !toPrune.isEmpty else { return true }
    let alive = toPrune.filter { $0.owner != nil }
    let putBack: Bool = inboxLock.withLock {
      guard !inbox.life.jobsLeftThread else { return false }  // diverted meanwhile: end them here
      sequenceEndings.append(contentsOf: alive)
      sequenceEndingsPruneAt = max(64, 2 * sequenceEndings.count)
      return true
    }
    if !putBack { for ending in alive { ending.end() } }
    return true
  }

  /// What diverting the jobs left to do once the inbox lock is released.
  struct DivertedJobs {
    /// Jobs were handed to the fallback: warn (once per loop).
    var handedJobs = false
    /// The hand-offs to run (see `divertHandOffs`).
    var handOffs: [@Sendable () -> Void] = []
    /// The jobs left the thread just now: the loop's stall watch ends (`LoopShared.endObservation`).
    var endsObservation = false

    /// After the inbox lock is released.
    func finish(for loop: RunLoopThread) {
      if handedJobs { FallbackExecution.warnOnce(for: loop) }
      for handOff in handOffs { handOff() }
      if endsObservation { loop.shared.endObservation() }
    }
  }

  /// Under `inboxLock`: if the loop is shut down and its thread is out of a run, hands the jobs it
  /// accepted to the fallback executor (under the lock, so jobs enqueued later queue behind them)
  /// and sends later ones there too; the hand-offs are to be run. Call `finish` on the result once
  /// the lock is released.
  func divertJobsLocked(for loop: RunLoopThread) -> DivertedJobs {
    guard let jobs = inbox.divertJobs() else { return DivertedJobs() }
    publishIsolationLocked()
    for job in jobs { FallbackExecution.dispatch(job.job, role: job.role, for: loop) }
    defer {
      divertHandOffs.removeAll()
      sequenceEndings.removeAll()
    }
    // Each `end` loads its sequence weakly, after the lock is released.
    return DivertedJobs(
      handedJobs: !jobs.isEmpty, handOffs: Array(divertHandOffs.values) + sequenceEndings.map(\.end),
      endsObservation: true)
  }

  /// Registers what `owner` (a pending sleep, a blocked caller) does if the jobs are diverted
  /// before it is done (see `divertHandOffs`); false when they were diverted already: the caller
  /// does it now instead of waiting on the loop. Any thread.
  func registerHandOff(_ owner: AnyObject, _ handOff: @escaping @Sendable () -> Void) -> Bool {
    inboxLock.withLock {
      guard !inbox.life.jobsLeftThread else { return false }
      divertHandOffs[ObjectIdentifier(owner)] = handOff
      return true
    }
  }

  /// `owner` is done (its timer fired or was invalidated; its caller returned). Any thread.
  func unregisterHandOff(_ owner: AnyObject) {
    _ = inboxLock.withLock { divertHandOffs.removeValue(forKey: ObjectIdentifier(owner)) }
  }

  /// Code on the loop's thread counts as isolated to the loop: its jobs have not left the thread
  /// and, for a current loop, the thread is inside a run (see `LoopLifecycle`). Any thread
  /// (meaningful on the loop's thread).
  @inline(__always)
  var loopThreadIsIsolated: Bool { threadIsIsolated.load(ordering: .acquiring) }

  /// True once shutdown began. Any thread.
  var isShutDown: Bool { inboxLock.withLock { inbox.life.isShutDown } }
}
