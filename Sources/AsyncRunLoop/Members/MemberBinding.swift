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
  /// Loop thread of `core`: applies an accepted `add` of this member to `mode`, with its record
  /// there (`RunLoopThread.bind`). Returns the failure to throw to the caller when the caller waits
  /// on the loop thread (`callerWaits`); only a readiness source's add can fail.
  func applyAdd(on core: LoopCore, record: MemberRecord, mode: RunLoopMode, callerWaits: Bool) -> SystemCallError?
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
///
/// While bound, the binding holds the member's `MemberRecord` for that loop (made when it binds),
/// and every change it sends carries that record: the loop never looks a member up.
struct MemberBinding {
  private enum Phase {
    /// On no loop.
    case unbound
    /// On `loop`, in the modes `add` named (`.common` counts as one name), with the loop's record.
    case bound
    /// `invalidate()` was called: final.
    case invalidated
  }

  // Plain stored fields rather than an enum with payloads: every callout and signal reads the
  // binding, and copying an enum payload retained and released each of its references.
  private var phase = Phase.unbound
  /// The loop the member is on (bound only).
  private(set) var loop: LoopShared?
  /// The member's record on `loop` (bound only).
  private var boundRecord: MemberRecord?
  /// The mode names it was added to on `loop` (bound only).
  private var modes = ModeNames()
  /// The loop the member was last bound to. After its last mode was removed that loop may still
  /// hold the member until it applies the removal; an invalidation is sent there too, so that loop
  /// releases the member's closures after the removal (and its cancel routine) ran. (The loop's
  /// shared half, not its handle: a removed member never keeps a loop's handle alive.)
  ///
  /// Cleared once nothing needs it (`invalidate()`, `loopLetGo(_:)`): the shared half holds the
  /// loop's poller, so a member that outlived its loop kept an epoll instance, an eventfd and a
  /// timerfd open for as long as the application kept the member.
  private(set) var lastLoop: LoopShared?
  /// Records made by `bind` that their loop has not attached yet (their add is on its way):
  /// each such loop will still schedule the member. Counted for every kind; custom sources use it
  /// (`SignalState` keeps their routines until every loop that was sent an add has had them).
  private(set) var pendingJoins = 0
  /// Per loop, the inbox's sequence number of the last add or removal another thread sent for
  /// this member there (under this lock): a loop-thread call nested in the loop's application of
  /// changes applies the queue only as far as this (`LoopCore.changeBindingInOrder`). Kept per
  /// loop: a member removed from loop A (the removal waiting there) and then sent to B still has
  /// that removal to come first on A, and a number from another loop's inbox means nothing on A
  /// (compared with A's numbers it applied a whole waiting burst in one callout).
  private var sent = SentSequences()

  /// Another thread sent an add or a removal of this member to `loop` (under this lock).
  mutating func noteSent(_ sequence: UInt64, to loop: LoopShared) { sent.note(sequence, serial: loop.serial) }

  /// The number of the last add or removal another thread sent for this member to `loop`; 0 when
  /// none was sent there.
  func lastSentSequence(on loop: LoopShared) -> UInt64 { sent.last(serial: loop.serial) }

  /// The loop the member is on and its record there, if it is on one.
  var loopAndRecord: (loop: LoopShared, record: MemberRecord)? {
    guard let loop, let boundRecord else { return nil }
    return (loop, boundRecord)
  }

  /// The member's record on `loop`, if it is bound to `loop`.
  func record(on loop: LoopShared) -> MemberRecord? { self.loop === loop ? boundRecord : nil }

  /// False once invalidated.
  var isValid: Bool { phase != .invalidated }

  /// Loop thread of `loop`: whether the calls made so far still have `record` in the mode of
  /// `claim`: named, or in the common set with `.common` named (whichever way the loop holds it
  /// there now). A removal made on another thread changed the binding at the call, but the loop
  /// applies it later (behind a burst of changes, passes later) and holds the record in that mode
  /// until then: no callout of the member may start there meanwhile, as none would had the removal
  /// been applied at once. (False only while such a removal is on its way: the loop then drops
  /// the record from the mode.)
  @inline(__always)
  func keeps(_ record: MemberRecord, _ claim: ModeClaim, on loop: LoopShared) -> Bool {
    guard self.loop === loop, boundRecord === record else { return false }
    return modes.contains(claim.mode) || (claim.modeIsCommon && modes.contains(.common))
  }

  enum BindAction {
    /// Bound (or already bound here): send the add to the loop, with this record.
    case accepted(MemberRecord)
    /// The member was invalidated: ignore the add.
    case refused
    /// The member is on another loop: a programming error (the caller traps, naming both loops).
    case onAnotherLoop(LoopShared)
  }

  /// `loop.add(member, to: mode)`.
  mutating func bind(to loop: LoopShared, mode: RunLoopMode) -> BindAction {
    switch phase {
    case .unbound:
      let record = MemberRecord()  // joins this loop: a new record for it
      pendingJoins += 1
      phase = .bound
      self.loop = loop
      boundRecord = record
      modes = ModeNames(mode)
      lastLoop = loop
      return .accepted(record)
    case .bound:
      guard let current = self.loop, current === loop, let boundRecord else {
        return .onAnotherLoop(self.loop.unsafelyUnwrapped)
      }
      _ = modes.insert(mode)  // one more mode on the same loop (or one it has already)
      return .accepted(boundRecord)
    case .invalidated:
      return .refused  // adding an invalidated member is a no-op
    }
  }

  /// `loop.remove(member, from: mode)`: the record to send the removal with, when the member is
  /// bound to `loop`. Removing the last mode name unbinds it: it may be added to any loop from now
  /// on (and gets a new record there).
  mutating func unbind(from loop: LoopShared, mode: RunLoopMode) -> MemberRecord? {
    guard phase == .bound, self.loop === loop, let record = boundRecord else { return nil }  // not on this loop
    if modes.remove(mode) && modes.isEmpty { becomeUnbound() }
    return record
  }

  /// Loop thread: a loop attached a record this binding made (applied its first add there), or
  /// dropped one it could not attach.
  mutating func recordSettled() {
    if pendingJoins > 0 { pendingJoins -= 1 }
  }

  /// A refused add (the loop had terminated, or could not register the member): forget `loop`
  /// (the member is invalidated next) and make `previousLastLoop` the loop it was last on. A
  /// terminated loop that refused the add never held the member: pass `lastLoop` as it was before
  /// the refused `bind`, so that the invalidation goes to the loop the member really was on last
  /// (which delivers the commands a `CommandSource` accepted while it was on no loop).
  mutating func forget(_ loop: LoopShared, restoringLastLoop previousLastLoop: LoopShared?) {
    guard phase == .bound, self.loop === loop else { return }
    if pendingJoins > 0 { pendingJoins -= 1 }  // that loop never attaches the record
    becomeUnbound()
    lastLoop = previousLastLoop
  }

  /// Loop thread of `loop`: it applied the removal of the member from its last mode there and
  /// detached its record; the member is still valid. If the member is on no loop and `loop` was
  /// its last, an invalidation no longer needs that loop (nothing there holds the member): forget
  /// it, so that the member does not keep the loop's resources. (A custom source with a close
  /// routine keeps it: `CommandSource` has the loop it was last on deliver what was posted while
  /// it was on none; see `InputSource.left`.)
  mutating func loopLetGo(_ loop: LoopShared) {
    guard phase == .unbound, lastLoop === loop else { return }
    lastLoop = nil
  }

  private mutating func becomeUnbound() {
    phase = .unbound
    loop = nil
    boundRecord = nil
    modes = ModeNames()
  }

  /// `invalidate()`: returns the loop that must detach the member (the one it is on, or the one it
  /// was last on, which may not have applied the removal yet; nil when it was never on a loop, or
  /// is invalidated already) with the member's record there (nil when it was removed: that loop
  /// detaches it when it applies the removal), and whether this was the first call. Idempotent.
  mutating func invalidate() -> (loop: LoopShared?, record: MemberRecord?, first: Bool) {
    // The loop to tell is handed out once; the binding keeps no loop from now on.
    defer { lastLoop = nil }
    switch phase {
    case .unbound:
      phase = .invalidated
      return (lastLoop, nil, true)
    case .bound:
      let result = (loop, boundRecord, true)
      phase = .invalidated
      loop = nil
      boundRecord = nil
      modes = ModeNames()
      return result
    case .invalidated:
      return (nil, nil, false)
    }
  }
}

/// A member's last sent sequence number per loop (by the loop's never-reused `serial`): nearly
/// always for one loop, stored inline; the loops it was sent to before that are kept after it, at
/// most `othersLimit` (the oldest is forgotten: a member that left it for that many loops while
/// its change there still waited is the only one that loses its place on it). Pure.
struct SentSequences {
  private var serial: UInt64 = 0
  private var sequence: UInt64 = 0
  private var others: [(serial: UInt64, sequence: UInt64)] = []
  static let othersLimit = 16

  mutating func note(_ sequence: UInt64, serial: UInt64) {
    if self.serial != serial && self.serial != 0 {
      // Another loop than the last: the last one's number joins the others (a loop's newest only).
      if !others.isEmpty { others.removeAll { $0.serial == self.serial || $0.serial == serial } }
      if others.count == Self.othersLimit { others.removeFirst() }
      others.append((self.serial, self.sequence))
    }
    self.serial = serial
    self.sequence = sequence
  }

  func last(serial: UInt64) -> UInt64 {
    if self.serial == serial { return sequence }
    guard !others.isEmpty else { return 0 }
    return others.last { $0.serial == serial }?.sequence ?? 0
  }
}

/// The mode names a bound member was added to: nearly always one, so the first is stored inline
/// (binding allocates nothing for it). Pure.
struct ModeNames {
  private var first: RunLoopMode?
  private var others: [RunLoopMode] = []

  init() {}
  init(_ mode: RunLoopMode) { first = mode }

  var isEmpty: Bool { first == nil }

  @inline(__always)
  func contains(_ mode: RunLoopMode) -> Bool { first == mode || (!others.isEmpty && others.contains(mode)) }

  /// Adds `mode`; false when it was there already.
  mutating func insert(_ mode: RunLoopMode) -> Bool {
    if first == mode || others.contains(mode) { return false }
    if first == nil { first = mode } else { others.append(mode) }
    return true
  }

  /// Removes `mode`; false when it was not there.
  mutating func remove(_ mode: RunLoopMode) -> Bool {
    if first == mode {
      first = others.isEmpty ? nil : others.removeFirst()
      return true
    }
    guard let index = others.firstIndex(of: mode) else { return false }
    others.remove(at: index)
    return true
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
///
/// `Callout` is a concrete struct that holds the closure, never a bare function type: a closure
/// stored in a generic field is reabstracted, which allocates a thunk for every member and adds an
/// indirect call to every callout.
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

  /// The callout, if the member is valid, on `loop`, and still in the mode the loop holds
  /// `record` in as `claim` says (`MemberBinding.keeps`): a member removed from that mode, whose
  /// removal the loop has not applied yet, makes no callout there.
  @inline(__always)
  func callout(on loop: LoopShared, for record: MemberRecord, in claim: ModeClaim) -> Callout? {
    binding.keeps(record, claim, on: loop) ? callout : nil
  }

  /// Marks the member invalid (no callout starts after this) and takes its closures; the first
  /// call only.
  mutating func invalidate() -> MemberInvalidation<Callout> {
    let (loop, record, first) = binding.invalidate()
    guard first else { return MemberInvalidation(loop: nil, record: nil, released: nil, onInvalidate: nil) }
    defer {
      callout = nil
      onInvalidate = nil
    }
    return MemberInvalidation(loop: loop, record: record, released: callout, onInvalidate: onInvalidate)
  }
}

/// What an invalidation took out of a member's lock.
struct MemberInvalidation<Callout> {
  let loop: LoopShared?
  /// The member's record on `loop` (nil when it was removed from there).
  let record: MemberRecord?
  let released: Callout?
  let onInvalidate: (@Sendable () -> Void)?

  /// After the lock: releases the callout (what it captured is freed outside the lock), tells the
  /// internal hook, and has the loop detach `member` (unless the loop, holding its record, does).
  func finish(_ member: some LoopMember, detaching: Bool = true) {
    withExtendedLifetime(released) {}
    onInvalidate?()
    if detaching { loop?.detachInvalidated(member, record) }
  }
}

extension LoopMember {
  /// Members with one callout release it at invalidation: nothing is left for the loop.
  func releaseAfterInvalidation(onThreadOf loop: RunLoopThread?) {}
}
