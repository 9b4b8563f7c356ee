/// A custom ("version 0", signal-based) input source (SPEC §3).
///
/// The owner keeps whatever state the source needs (usually a command buffer, see
/// `CommandSource`). Clients call `signal()` from any thread: that marks the source as ready
/// *and* wakes its loop, in one call; on the loop's next pass the `perform` routine runs on the
/// loop thread. Many signals before the loop gets to it coalesce into one `perform`.
///
/// Routines, all called on the loop's thread:
/// - `schedule(source, loop, mode)`: once, when the source is first added to a loop (its first
///   mode there) — the place to tell clients how to reach it.
/// - `perform(source)`: each time the loop fires the signalled source.
/// - `cancel(source, loop)`: exactly once, when the source leaves its loop (removed from its last
///   mode there, invalidated, or the loop shut down) — clients drop their references here.
///
/// A source is scheduled on at most one loop at a time (in any number of its modes). Adding it to
/// a second loop while it is on one is a programming error and traps with a clear message.
public final class InputSource: ModeMember, @unchecked Sendable {  // Safety: proof below
  // Safety: `order` is immutable. `state` (which also holds the routines) is only touched with
  // `lock` held. `memberships` is only touched on the thread of the loop the source is scheduled
  // on, which `RunLoopThread` asserts at every entry point.

  /// Among sources that are ready in the same pass, lower orders fire first.
  public let order: Int

  private let lock = PthreadLock.make()
  // No dynamic exclusivity checks (see `ModeContents`): `state` is only touched under `lock`,
  // `memberships` only on the loop thread, and neither is accessed across a callout.
  @exclusivity(unchecked) private var state: SignalState

  /// Loop thread: the modes of the attached loop that hold this source.
  @exclusivity(unchecked) var memberships: [ModeContents] = []

  /// Creates a source. The routines are called on the thread of the loop it is added to, and
  /// released once the source is invalidated.
  /// - Parameters:
  ///   - order: Lower orders fire first among sources ready in the same pass.
  ///   - schedule: Called once when the source is first added to a loop.
  ///   - cancel: Called once when the source leaves its loop or is invalidated.
  ///   - perform: Called each time the loop fires the signalled source.
  public init(
    order: Int = 0,
    schedule: (@Sendable (InputSource, RunLoopThread, RunLoopMode) -> Void)? = nil,
    cancel: (@Sendable (InputSource, RunLoopThread) -> Void)? = nil,
    perform: @escaping @Sendable (InputSource) -> Void
  ) {
    self.order = order
    self.state = SignalState(
      routines: .init(schedule: schedule, perform: perform, cancel: cancel))
  }

  /// Marks the source ready and wakes its loop so that `perform` runs on its next pass
  /// ("signal + wake" as one call). Any thread. A no-op on an invalidated source.
  /// Signals that arrive before the source is added to a loop are kept and fire once it is.
  public func signal() {
    let loop = lock.withLock { state.signal() }
    loop?.enqueueSignalled(self)
  }

  /// Removes the source from every mode of its loop and calls `cancel` exactly once (on the
  /// loop's thread; before this returns when called there) if it was on a loop. Releases the
  /// routines. Any thread; idempotent.
  public func invalidate() {
    switch lock.withLock({ state.invalidate() }) {
    case .none:
      break
    case .detach(let loop):
      loop.detachEverywhere(self)
    }
  }

  /// False once `invalidate()` was called. Any thread.
  public var isValid: Bool { lock.withLock { state.isValid } }

  /// Whether the source is signalled and waiting for its loop to fire it. Any thread.
  public var isSignalled: Bool { lock.withLock { state.isSignalled } }

  // MARK: Loop-facing (loop thread)

  /// Records that the source is now scheduled on `loop`. Loop thread of `loop`.
  func attach(to loop: RunLoopThread) -> SignalState.AttachAction {
    lock.withLock { state.attach(to: loop) }
  }

  /// Records that the source left `loop` and returns the cancel routine to call (after the lock
  /// is released), releasing every routine when the source was invalidated. Loop thread.
  func detach() -> (@Sendable (InputSource, RunLoopThread) -> Void)? {
    lock.withLock { state.detach() }
  }

  /// Clears the signal just before `perform` runs and returns the routine to run, or nil when the
  /// source was invalidated or is no longer signalled. Loop thread.
  func consumeSignal() -> (@Sendable (InputSource) -> Void)? {
    // Not `withLock`: a closure returned through its generic result is re-abstracted, which
    // heap-allocated a thunk context on every fire of the source.
    lock.lock()
    defer { lock.unlock() }
    return state.consumeSignal()
  }

  func insert(into contents: ModeContents) {
    ModeContents.insertOrdered(self, into: &contents.sources) { $0.order }
  }

  func remove(from contents: ModeContents) {
    contents.sources.removeAll { $0 === self }
  }
}

/// The cross-thread state of an `InputSource`: a pure state machine, held under the source's lock.
struct SignalState {
  struct Routines {
    var schedule: (@Sendable (InputSource, RunLoopThread, RunLoopMode) -> Void)?
    var perform: @Sendable (InputSource) -> Void
    var cancel: (@Sendable (InputSource, RunLoopThread) -> Void)?
  }

  private enum Lifecycle {
    /// Usable: can be scheduled and signalled.
    case active
    /// `invalidate()` was called on a scheduled source; its loop has yet to detach it (and call
    /// cancel). The routines are kept until then.
    case invalidating
    /// Done: the routines are released.
    case invalid
  }

  private var lifecycle = Lifecycle.active
  private var routines: Routines?
  private(set) var isSignalled = false
  /// The loop the source is scheduled on; strong, so that signalling can always reach it.
  private var loop: RunLoopThread?

  init(routines: Routines) { self.routines = routines }

  var isValid: Bool { lifecycle == .active }

  /// A client signals: returns the loop to wake, or nil when there is nothing to do.
  mutating func signal() -> RunLoopThread? {
    switch lifecycle {
    case .active:
      guard !isSignalled else { return nil }  // coalesced with the pending signal
      isSignalled = true
      return loop  // nil when not yet scheduled: the loop picks the signal up in attach()
    case .invalidating, .invalid:
      return nil  // signalling an invalidated source is a no-op
    }
  }

  enum InvalidateAction {
    /// Nothing to do: already invalid, or never scheduled (the routines are released now).
    case none
    /// Remove the source from every mode of this loop; its detach calls cancel.
    case detach(RunLoopThread)
  }

  mutating func invalidate() -> InvalidateAction {
    switch lifecycle {
    case .active:
      isSignalled = false
      if let loop {
        lifecycle = .invalidating  // routines stay until detach() has handed out cancel
        return .detach(loop)
      }
      lifecycle = .invalid  // never scheduled: no cancel is owed
      routines = nil
      return .none
    case .invalidating, .invalid:
      return .none  // a second invalidate is a no-op
    }
  }

  enum AttachAction {
    /// Scheduled: call `schedule` (if any); `signalled` says whether to queue it at once.
    case attached(schedule: (@Sendable (InputSource, RunLoopThread, RunLoopMode) -> Void)?, signalled: Bool)
    /// The source was invalidated: do not schedule it.
    case refused
  }

  mutating func attach(to newLoop: RunLoopThread) -> AttachAction {
    switch lifecycle {
    case .active:
      precondition(
        loop == nil || loop === newLoop,
        "AsyncRunLoop: an InputSource is scheduled on one loop at a time; remove it from its loop first")
      loop = newLoop
      return .attached(schedule: routines?.schedule, signalled: isSignalled)
    case .invalidating, .invalid:
      return .refused
    }
  }

  /// The source left its loop: returns the cancel routine to call.
  mutating func detach() -> (@Sendable (InputSource, RunLoopThread) -> Void)? {
    let cancel = routines?.cancel
    loop = nil  // a later signal is kept until the source is scheduled again
    switch lifecycle {
    case .active:
      break
    case .invalidating, .invalid:
      lifecycle = .invalid
      routines = nil  // release whatever the routines captured
    }
    return cancel
  }

  mutating func consumeSignal() -> (@Sendable (InputSource) -> Void)? {
    switch lifecycle {
    case .active:
      guard isSignalled else { return nil }
      isSignalled = false
      return routines?.perform
    case .invalidating, .invalid:
      return nil
    }
  }
}
