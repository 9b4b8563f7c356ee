/// Something a loop can schedule in its modes: an `InputSource`, a `DescriptorSource`, a
/// `LoopTimer` or a `LoopObserver`. Every kind shares one lifecycle, `MemberBinding`, held under
/// the member's own lock; the loop-thread side of a member (its modes, heap entries, epoll
/// registration) lives in the loop's `MemberRecord`, never on the member, so a member moving from
/// one loop to another is never touched by two loop threads at once.
protocol LoopMember: AnyObject, Sendable {
  /// The member's kind, for messages ("InputSource", "LoopTimer", ...).
  static var kindName: String { get }
  /// Releases the closures of an invalidated member that its loop holds no record of: on the
  /// thread of `loop` (the loop it was last on, which was told), or on the caller's thread with
  /// `loop` nil when that loop has terminated.
  func releaseAfterInvalidation(onThreadOf loop: RunLoopThread?)
  /// Runs `body` with the member's binding, under the member's lock. Any thread. `body` must not
  /// call out (user code, other locks than the loop's inbox lock).
  func withBinding<Result>(_ body: (inout MemberBinding) -> Result) -> Result
}

/// The one lifecycle every loop member shares (a pure state machine, held under the member's
/// lock): unbound → bound to one loop (its `LoopShared`: a member never keeps a loop's handle
/// alive) (in a set of mode names) → unbound again after its last
/// mode was removed (free to move to another loop) → … → invalidated (final).
///
/// The binding changes on the *calling* thread, at the moment `add`, `remove` or `invalidate` is
/// called; the loop applies the matching change on its own thread later (in the order the calls
/// were made). So "one loop at a time" is checked where the mistake is made, a member removed from
/// its last mode may be added to another loop at once, and the loop can tell, when it applies an
/// `add`, whether the member was invalidated since (it then schedules and detaches it at once, so
/// the cancel routine and the closing delivery still happen: nothing accepted is lost).
struct MemberBinding {
  private enum State {
    /// On no loop.
    case unbound
    /// On `loop`, in the modes `add` named (`.common` counts as one name).
    case bound(LoopShared, modes: [RunLoopMode])
    /// `invalidate()` was called: final.
    case invalidated
  }

  private var state = State.unbound
  /// The loop the member was last bound to. After its last mode was removed that loop may still
  /// hold the member until it applies the removal; an invalidation is sent there too, so that loop
  /// releases the member's closures after the removal (and its cancel routine) ran. (The loop's
  /// shared half, not its handle: a removed member never keeps a loop's handle alive.)
  private var lastLoop: LoopShared?

  /// The loop the member is on, if any.
  var loop: LoopShared? {
    switch state {
    case .bound(let loop, _): return loop
    case .unbound, .invalidated: return nil
    }
  }

  /// False once invalidated.
  var isValid: Bool {
    switch state {
    case .unbound, .bound: return true
    case .invalidated: return false
    }
  }

  enum BindAction {
    /// Bound (or already bound here): send the add to the loop.
    case accepted
    /// The member was invalidated: ignore the add.
    case refused
    /// The member is on another loop: a programming error (the caller traps, naming both loops).
    case onAnotherLoop(LoopShared)
  }

  /// `loop.add(member, to: mode)`.
  mutating func bind(to loop: LoopShared, mode: RunLoopMode) -> BindAction {
    switch state {
    case .unbound:
      state = .bound(loop, modes: [mode])  // joins this loop
      lastLoop = loop
      return .accepted
    case .bound(let current, var modes):
      guard current === loop else { return .onAnotherLoop(current) }
      if !modes.contains(mode) { modes.append(mode) }  // one more mode on the same loop
      state = .bound(current, modes: modes)
      return .accepted
    case .invalidated:
      return .refused  // adding an invalidated member is a no-op
    }
  }

  /// `loop.remove(member, from: mode)`: true when the member is bound to `loop` (send the removal).
  /// Removing the last mode name unbinds it: it may be added to any loop from now on.
  mutating func unbind(from loop: LoopShared, mode: RunLoopMode) -> Bool {
    switch state {
    case .bound(let current, var modes):
      guard current === loop else { return false }  // not on this loop: nothing to remove
      modes.removeAll { $0 == mode }
      state = modes.isEmpty ? .unbound : .bound(current, modes: modes)
      return true
    case .unbound, .invalidated:
      return false
    }
  }

  /// A refused add (the loop had terminated): forget `loop` (the member is invalidated next).
  mutating func forget(_ loop: LoopShared) {
    if case .bound(let current, _) = state, current === loop { state = .unbound }
  }

  /// `invalidate()`: returns the loop that must detach the member (the one it is on, or the one it
  /// was last on, which may not have applied the removal yet; nil when it was never on a loop, or
  /// is invalidated already), and whether this was the first call. Idempotent.
  mutating func invalidate() -> (loop: LoopShared?, first: Bool) {
    switch state {
    case .unbound:
      state = .invalidated
      return (lastLoop, true)
    case .bound(let loop, _):
      state = .invalidated
      return (loop, true)
    case .invalidated:
      return (nil, false)
    }
  }
}

extension LoopMember {
  /// The loop the member is on (nil when on none or invalidated). Any thread.
  var boundLoop: LoopShared? { withBinding { $0.loop } }

  /// Whether the member is on `loop` now. Any thread.
  func isBound(to loop: LoopShared) -> Bool { withBinding { $0.loop === loop } }
}

extension RunLoopThread {
  /// The trap for adding a member that is on another loop.
  static func trapOnAnotherLoop(_ kind: String, current: LoopShared, requested: RunLoopThread) -> Never {
    preconditionFailure(
      """
      AsyncRunLoop: this \(kind) is on loop '\(current.name)' and cannot be added to loop \
      '\(requested.name)': a member is on one loop at a time. Remove it from every mode of \
      '\(current.name)' (or invalidate it and make a new one) first.
      """)
  }
}

/// The cross-thread state of a member with one callout (a timer, an observer, a readiness
/// source): its binding, the callout (released at invalidation) and the internal hook that ends an
/// async consumer. A pure value, held under the member's lock; what an invalidation takes out of
/// it is handled after the lock is released (`MemberInvalidation.finish`).
struct CalloutMemberState<Callout> {
  var binding = MemberBinding()
  private var callout: Callout?
  /// Internal: called once, on the invalidating thread after the lock is released (async
  /// sequences use it to end their consumer).
  private var onInvalidate: (@Sendable () -> Void)?

  init(callout: Callout, onInvalidate: (@Sendable () -> Void)?) {
    self.callout = callout
    self.onInvalidate = onInvalidate
  }

  /// The callout, if the member is valid and on `loop` (a member removed from `loop`, or moved
  /// away, makes no callout there any more).
  @inline(__always)
  func callout(on loop: LoopShared) -> Callout? { binding.loop === loop ? callout : nil }

  /// Marks the member invalid (no callout starts after this) and takes its closures; the first
  /// call only.
  mutating func invalidate() -> MemberInvalidation<Callout> {
    let (loop, first) = binding.invalidate()
    guard first else { return MemberInvalidation(loop: nil, released: nil, onInvalidate: nil) }
    defer {
      callout = nil
      onInvalidate = nil
    }
    return MemberInvalidation(loop: loop, released: callout, onInvalidate: onInvalidate)
  }
}

/// What an invalidation took out of a member's lock.
struct MemberInvalidation<Callout> {
  let loop: LoopShared?
  let released: Callout?
  let onInvalidate: (@Sendable () -> Void)?

  /// After the lock: releases the callout (what it captured is freed outside the lock), tells the
  /// internal hook, and has the loop detach `member` (unless the loop, holding its record, does).
  func finish(_ member: some LoopMember, detaching: Bool = true) {
    withExtendedLifetime(released) {}
    onInvalidate?()
    if detaching { loop?.detachInvalidated(member) }
  }
}

extension LoopMember {
  /// Members with one callout release it at invalidation: nothing is left for the loop.
  func releaseAfterInvalidation(onThreadOf loop: RunLoopThread?) {}
}
