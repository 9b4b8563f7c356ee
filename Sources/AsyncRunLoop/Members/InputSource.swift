import Synchronization

/// A custom ("version 0", signal-based) input source.
///
/// The owner keeps whatever state the source needs (usually a command buffer, see
/// `CommandSource`). Clients call `signal()` from any thread: that marks the source as ready
/// *and* wakes its loop, in one call; on the loop's next pass the `perform` routine runs on the
/// loop thread. Many signals before the loop gets to it coalesce into one `perform`.
///
/// Routines, all called on the loop's thread:
/// - `schedule(source, loop, mode)`: once each time the source joins a loop (its first mode there)
///   — the place to tell clients how to reach it. An add made before an invalidation is still
///   scheduled (and then cancelled), so schedule and cancel always come in pairs.
/// - `perform(source)`: each time the loop fires the signalled source.
/// - `cancel(source, loop)`: exactly once per `schedule`, when the source leaves that loop
///   (removed from its last mode there, invalidated, or the loop shut down) — clients drop their
///   references here.
///
/// A source is on at most one loop at a time (in any number of its modes). Adding it to a second
/// loop while it is on one is a programming error and traps with a message naming both loops;
/// once removed from its last mode it may be added to any loop at once, from any thread.
public final class InputSource: LoopMember, @unchecked Sendable {  // Safety: proof below
  // Safety: `order` is immutable. `state` (which also holds the routines) and `binding` are only
  // touched with `lock` held. `invalidated` is atomic.

  static var kindName: String { "InputSource" }

  /// Among sources that are ready in the same pass, lower orders fire first.
  public let order: Int
  /// A name for diagnostics: stall reports name the member by it (see `StallReport.label`).
  public let label: String?

  private let lock = PthreadLock.make()
  // No dynamic exclusivity checks (see `ModeContents`): only touched under `lock`, and no access
  // spans a callout.
  @exclusivity(unchecked) private var state: SignalState
  @exclusivity(unchecked) private var binding = MemberBinding()
  /// When the pending signal was sent (a `MetricsClock` reading), if its loop keeps metrics; else 0.
  @exclusivity(unchecked) private var signalledAt: Int64 = 0
  /// Whether `invalidate()` was called: `!binding.isValid` (both change in one critical section of
  /// `lock`, the binding first), kept apart so that `isValid` reads it
  /// without the lock (a `CommandSource` post asks on every command, under its own buffer's lock:
  /// one lock per command, not two). Set once, under `lock`, with a releasing store before
  /// `invalidate()` returns; never reset.
  private let invalidated = Atomic<Bool>(false)

  /// Creates a source. The routines are called on the thread of the loop it is added to, and
  /// released once the source is invalidated.
  /// - Parameters:
  ///   - order: Lower orders fire first among sources ready in the same pass.
  ///   - schedule: Called once when the source is first added to a loop.
  ///   - cancel: Called once when the source leaves its loop or is invalidated.
  ///   - label: A name for diagnostics (stall reports).
  ///   - perform: Called each time the loop fires the signalled source.
  public convenience init(
    order: Int = 0,
    label: String? = nil,
    schedule: (@Sendable (InputSource, RunLoopThread, RunLoopMode) -> Void)? = nil,
    cancel: (@Sendable (InputSource, RunLoopThread) -> Void)? = nil,
    perform: @escaping @Sendable (InputSource) -> Void
  ) {
    self.init(
      order: order, label: label, schedule: schedule, cancel: cancel, close: nil, discard: nil, perform: perform)
  }

  /// Internal: `close` runs once, on a loop thread, when the invalidated source is done on its
  /// loop, before `cancel`; or, when it was invalidated after leaving its last loop, on the thread
  /// of the loop that lets go of it last: the one it was last on, or an earlier one that applies
  /// its removal later still (`CommandSource` delivers what is still buffered there).
  /// `discard` runs instead, once, when the invalidated source has no loop to close it on: it was
  /// never on one, or the loop it was last on has terminated. It runs on the invalidating thread
  /// (or the one whose change found that loop terminated), after the routines were released
  /// under the lock, so no loop can call `perform` or `close` any more (`CommandSource` drops
  /// what is still buffered there).
  @usableFromInline
  init(
    order: Int,
    label: String? = nil,
    schedule: (@Sendable (InputSource, RunLoopThread, RunLoopMode) -> Void)?,
    cancel: (@Sendable (InputSource, RunLoopThread) -> Void)?,
    close: (@Sendable (InputSource) -> Void)?,
    discard: (@Sendable () -> Void)?,
    perform: @escaping @Sendable (InputSource) -> Void
  ) {
    self.order = order
    self.label = label
    self.state = SignalState(
      routines: .init(schedule: schedule, perform: perform, cancel: cancel, close: close, discard: discard))
  }

  func withBinding<Result>(_ body: (inout MemberBinding) -> Result) -> Result {
    lock.lock()
    defer { lock.unlock() }
    return body(&binding)
  }

  /// Marks the source ready and wakes its loop so that `perform` runs on its next pass
  /// ("signal + wake" as one call). Any thread. A no-op on an invalidated source.
  /// Signals that arrive before the source is added to a loop are kept and fire once it is.
  public func signal() {
    let target: (loop: LoopShared, record: MemberRecord)? = lock.withLock {
      guard binding.isValid, state.signal() else { return nil }
      // nil when not on a loop: the loop it joins picks the signal up
      guard let target = binding.loopAndRecord else { return nil }
      signalledAt = target.loop.observation.arrivalStamp()
      return target
    }
    if let target { target.loop.enqueueSignalled(target.record) }
  }

  /// Removes the source from every mode of its loop and calls `cancel` exactly once (on the
  /// loop's thread; before this returns when called there) if it was on a loop. Releases the
  /// routines. Any thread; idempotent.
  public func invalidate() {
    let target: (loop: LoopShared?, record: MemberRecord?, released: SignalState.Routines?) = lock.withLock {
      let (loop, record, first) = binding.invalidate()
      guard first else { return (nil, nil, nil) }
      invalidated.store(true, ordering: .releasing)
      // The loop's detach hands out cancel.
      let released = state.invalidate(keepingRoutines: loop != nil, pendingJoins: binding.pendingJoins)
      return (loop, record, released)
    }
    // No loop held it or will: nothing can deliver what it holds.
    target.released?.discard?()
    withExtendedLifetime(target.released) {}  // whatever the routines captured is freed outside the lock
    target.loop?.detachInvalidated(self, target.record)
  }

  func releaseAfterInvalidation(onThreadOf loop: RunLoopThread?) {
    let released: SignalState.Routines? = lock.withLock {
      binding.isValid ? nil : state.release(pendingJoins: binding.pendingJoins)
    }
    if loop != nil {
      released?.close?(self)
    } else {
      released?.discard?()  // the loop it was last on has terminated
    }
    withExtendedLifetime(released) {}  // whatever the routines captured is freed outside the lock
  }

  /// False once `invalidate()` was called. Any thread.
  public var isValid: Bool { !invalidated.load(ordering: .acquiring) }

  /// Whether the source is signalled and waiting for its loop to fire it. Any thread.
  public var isSignalled: Bool { lock.withLock { binding.isValid && state.isSignalled } }

  // MARK: Loop-facing (loop thread)

  /// The source joined `loop` (its first mode there): the schedule routine to call, and whether it
  /// is signalled already. Loop thread of `loop`.
  func joined(_ loop: RunLoopThread) -> (
    schedule: (@Sendable (InputSource, RunLoopThread, RunLoopMode) -> Void)?, signalled: Bool
  ) {
    lock.withLock {
      binding.recordSettled()
      return state.joined()
    }
  }

  /// The source left `loop`: returns the close routine (when it was invalidated) and the cancel
  /// routine to call, in that order, after the lock is released, and, when the source was
  /// invalidated and this was its last loop, every routine in `released`, for the caller to free
  /// after them. A source without a close routine forgets `loop` as the one it was
  /// last on (`MemberBinding.loopLetGo`): only a close routine needs that loop later. Loop thread.
  func left(_ loop: RunLoopThread) -> SignalState.LeaveRoutines {
    lock.withLock {
      if state.routines?.close == nil { binding.loopLetGo(loop.shared) }
      return state.left(isValid: binding.isValid, pendingJoins: binding.pendingJoins)
    }
  }

  /// Clears the signal just before `perform` runs and returns the routine to run, or nil when the
  /// source was invalidated, is no longer signalled, or is no longer on `loop`; with the time the
  /// signal was sent (0: not stamped). Loop thread.
  func consumeSignal(on loop: LoopShared) -> (perform: @Sendable (InputSource) -> Void, signalledAt: Int64)? {
    // Not `withLock`: a closure returned through its generic result is re-abstracted, which
    // heap-allocated a thunk context on every fire of the source.
    lock.lock()
    defer { lock.unlock() }
    guard binding.isValid, binding.loop === loop, let perform = state.consumeSignal() else { return nil }
    defer { signalledAt = 0 }
    return (perform, signalledAt)
  }

  /// Fires the source now if it is signalled and the loop has nothing else to do before its next
  /// step 4 would fire it (see `LoopCore+EarlyFire` for what that means), from inside one of the
  /// loop's jobs: a
  /// sequence's consumer running on the source's own loop takes what was posted while it ran,
  /// instead of suspending until the next pass. The fire consumes the signal and its queued
  /// entries, and counts as a handler callout, as in step 4. Returns whether it fired. Call it on
  /// the loop's thread; elsewhere, or outside a job there, it does nothing.
  func fireEarlyFromJob() -> Bool {
    // One critical section from the check to the consumed signal: no other thread can invalidate
    // the source, move it or take it off its modes between the loop's claim (which drops the
    // signal's queued entries) and the consumed signal. The claim takes the inbox lock inside
    // this one; nothing takes a member's lock while it holds the inbox lock.
    lock.lock()
    guard binding.isValid, state.isSignalled, let (loop, record) = binding.loopAndRecord, loop.isOnLoopThread,
      loop.core.claimEarlyFire(of: record), let perform = state.consumeSignal()
    else {
      lock.unlock()
      return false
    }
    let signalledAt = self.signalledAt
    self.signalledAt = 0
    lock.unlock()
    loop.core.observed(.sourceHandler, label: label, since: signalledAt) { perform(self) }
    return true
  }
}

/// The cross-thread state of an `InputSource` besides its binding: its routines and signal. A
/// pure state machine, held under the source's lock.
struct SignalState {
  struct Routines {
    var schedule: (@Sendable (InputSource, RunLoopThread, RunLoopMode) -> Void)?
    var perform: @Sendable (InputSource) -> Void
    var cancel: (@Sendable (InputSource, RunLoopThread) -> Void)?
    var close: (@Sendable (InputSource) -> Void)?
    /// Instead of `close` when no loop is left to run it (see `InputSource.init`).
    var discard: (@Sendable () -> Void)?
  }

  /// What a loop calls when the source leaves it.
  struct LeaveRoutines {
    var close: (@Sendable (InputSource) -> Void)?
    var cancel: (@Sendable (InputSource, RunLoopThread) -> Void)?
    /// The routines given up (the last loop let go of an invalid source): held here so that what
    /// they captured is freed with this value, after the source's lock is released (a captured
    /// object's deinit may reach the source again).
    var released: Routines?
  }

  /// nil once released (the source was invalidated and its loop, if any, detached it).
  private(set) var routines: Routines?
  private(set) var isSignalled = false

  init(routines: Routines) { self.routines = routines }

  /// A client signals: true when the loop must be told (the first signal since the last fire).
  mutating func signal() -> Bool {
    guard !isSignalled else { return false }  // coalesced with the pending signal
    isSignalled = true
    return true
  }

  /// How many loops hold the source now (joined and not yet left): a source moving between loops
  /// is briefly on two. Each of them owes it one cancel; the routines go with the last.
  private(set) var attachments = 0

  /// A loop scheduled the source: its schedule routine, and whether it is signalled already.
  mutating func joined() -> (schedule: (@Sendable (InputSource, RunLoopThread, RunLoopMode) -> Void)?, signalled: Bool)
  {
    attachments += 1
    return (routines?.schedule, isSignalled)
  }

  /// The source was invalidated. A source that a loop holds or will hold (`toldLoop`, or an add
  /// on its way to a loop: `pendingJoins`) keeps its routines until the last such loop detaches it
  /// (each owes a schedule and a cancel); otherwise they go now: returned, for `discard` and their
  /// release outside the lock.
  mutating func invalidate(keepingRoutines toldLoop: Bool, pendingJoins: Int) -> Routines? {
    isSignalled = false
    guard !toldLoop && attachments == 0 && pendingJoins == 0 else { return nil }
    defer { routines = nil }
    return routines
  }

  /// The source left a loop: that loop's cancel routine; and, when the source is invalid and this
  /// was the last loop holding it (none holds it, and no add is on its way to one:
  /// `pendingJoins`), the close routine (first) and the release of every routine. A valid source
  /// keeps its signal for the loop it joins next.
  mutating func left(isValid: Bool, pendingJoins: Int) -> LeaveRoutines {
    attachments -= 1
    let last = !isValid && attachments == 0 && pendingJoins == 0
    let leave = LeaveRoutines(
      close: last ? routines?.close : nil, cancel: routines?.cancel, released: last ? routines : nil)
    if last { routines = nil }  // what they captured is freed with `leave`, outside the lock
    return leave
  }

  /// Hands out the routines of an invalid source that no loop holds any more (for release, and
  /// the close routine, outside the lock); nil while a loop still holds it.
  mutating func release(pendingJoins: Int) -> Routines? {
    guard attachments == 0 && pendingJoins == 0 else { return nil }
    defer { routines = nil }
    return routines
  }

  /// The loop fires the source: clears the signal and returns the perform routine.
  mutating func consumeSignal() -> (@Sendable (InputSource) -> Void)? {
    guard isSignalled else { return nil }
    isSignalled = false
    return routines?.perform
  }
}
