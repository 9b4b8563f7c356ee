import CAsyncRunLoop
import Glibc

/// A custom input source with a typed command buffer (the "command buffer" pattern).
///
/// Any thread may `post(_:)` a command: the command is appended to the buffer, the source is
/// signalled and its loop woken, in one call. On the loop's next pass the handler runs on the loop
/// thread once per command, in the order the commands were posted (per posting thread; posts
/// from different threads interleave in the order they took the buffer's lock).
///
/// Nothing is lost silently: every command that `post` accepted (returned true for) is delivered
/// exactly once, on a loop thread. When the source is invalidated (or dropped, or its loop shuts
/// down) while on a loop, the loop delivers what is still buffered, refuses later posts (`post`
/// returns false), and then calls `cancel` — also when the invalidation races an `add` that was
/// made before it, a removal, or the shutdown. Commands posted while the source is on no loop
/// (before its first `add`, or after its removal from its last mode) wait for its next `add`; if
/// it is invalidated instead, the loop that lets go of it last delivers them:
/// the loop it was last on, or, when the loop it was on before that has not applied its removal
/// yet (a removal takes effect on the loop's thread, later; `add` to another loop does not wait
/// for it), that earlier loop once it has. Only a source that has no loop to deliver on —
/// invalidated before it was ever added, or while the loop it was last on is finishing its
/// shutdown drain or after it terminated — drops what
/// it holds: `invalidate()` releases those commands on the calling thread (rather than keeping
/// them until the `CommandSource` is freed) and counts them in `droppedCount`; `pendingCount` is
/// 0 from then on.
///
/// So that it can deliver there, a source removed from its last mode keeps a reference to the
/// loop it was on (the loop's shared half: its inbox and its epoll instance, eventfd and timerfd,
/// not its thread or handle) until it is added again, invalidated or released. Other members let
/// go of a loop once it has applied their removal.
///
/// A handler that moves the source to another loop keeps the order too: the first loop finishes
/// the batch it was delivering, and the new loop delivers later commands only after it. If the
/// source is invalidated on the new loop meanwhile, that loop's thread waits for the batch to end
/// before its closing delivery and `cancel`; a handler of that batch that then waits for the new
/// loop with `performAndWait` is refused with `RunLoopError.wouldDeadlock` rather than hanging
/// both. The new loop does not wait, and delivers what it holds at once (the rest of the batch
/// then comes after its `cancel`, each command still exactly once), when the handler is already
/// waiting for it (`performAndWait`, `invalidateAndWait`, `shutdownAndWait`), or when the batch
/// has not ended after a second (the handler may be waiting for it in a way the loops cannot
/// see, a semaphore say).
public final class CommandSource<Command: Sendable>: Sendable {
  /// The underlying input source: add it to a loop's modes, or invalidate it. Keep the
  /// `CommandSource` itself alive while you post to it: dropping it invalidates the source.
  public let source: InputSource
  /// The commands. The source's routines hold it strongly and hold nothing of `self`, so there
  /// is no cycle to break with a weak reference (which would put every retain and release of
  /// `self` on the runtime's slow path).
  @usableFromInline let buffer = CommandBuffer<Command>()

  /// Creates a command source. (`@inlinable`, like `post`, so that the per-command paths are
  /// specialized for `Command`: unspecialized, every drain looked up array metadata in the
  /// runtime — about a fifth of a wake-up's user-space time in the wake-rtt profile.)
  /// - Parameters:
  ///   - order: Among ready sources, lower orders fire first.
  ///   - schedule: Called once, on the loop thread, when the source is first added to a loop.
  ///   - cancel: Called once, on the loop thread, when the source leaves its loop.
  ///   - label: A name for diagnostics (stall reports name the source by it).
  ///   - handler: Called on the loop thread for each command, in posting order.
  @inlinable
  public init(
    order: Int = 0,
    label: String? = nil,
    schedule: (@Sendable (InputSource, RunLoopThread, RunLoopMode) -> Void)? = nil,
    cancel: (@Sendable (InputSource, RunLoopThread) -> Void)? = nil,
    handler: @escaping @Sendable (Command) -> Void
  ) {
    let buffer = self.buffer
    source = InputSource(
      order: order, label: label, schedule: schedule,
      cancel: cancel,
      // Invalidated: refuse further posts, then deliver what was accepted (before cancel).
      close: { _ in _ = buffer.drain(into: handler, closing: true) },
      // No loop is left to deliver on: drop what waits, now rather than with the source.
      discard: { buffer.discardPending() },
      perform: { source in
        // A drain that found another loop's thread still delivering left the commands pending;
        // that thread asks for another fire here once it is done.
        if buffer.drain(into: handler, closing: false) { source.signal() }
      })
  }

  /// Dropping the last reference invalidates the source: its loop removes it and calls cancel.
  deinit {
    source.invalidate()
  }

  /// Appends `command`, signals the source and wakes its loop. Any thread.
  ///
  /// The result is discardable, unlike `SourceSequence.post(_:)`'s: the buffer has no limit, so
  /// a post is refused only once the source has been invalidated (or its loop shut down), and the
  /// command would then have had nobody to run it anyway. A sequence's bounded buffer can refuse
  /// an element while its consumer is still there, so its caller must look at the answer.
  /// - Returns: true when the command was accepted (it will be delivered exactly once); false
  ///   when the source has been invalidated and the command was refused.
  @inlinable @discardableResult
  public func post(_ command: Command) -> Bool {
    switch buffer.append(command, whileValid: source) {
    case .refused: return false
    case .accepted(let firstPending):
      if firstPending { source.signal() }  // later posts ride on the signal already pending
      return true
    }
  }

  /// The number of commands posted and not yet taken by the loop for delivery. Any thread.
  ///
  /// A batch the loop has taken and is delivering counts in neither this nor the deliveries
  /// until each command's handler has run, so accepted = delivered + `pendingCount` +
  /// `droppedCount` holds between batches (at rest), not while one is delivered.
  public var pendingCount: Int { buffer.pendingCount }

  /// The number of accepted commands that were never delivered because the source was
  /// invalidated with no loop to deliver on (see above); 0 otherwise. Any thread.
  public var droppedCount: Int { buffer.droppedCount }
}

/// The command buffer of a `CommandSource`: filled from any thread, drained on the loop thread.
@usableFromInline
final class CommandBuffer<Command: Sendable>: @unchecked Sendable {  // Safety: proof below
  // Safety: `pending`, `isOpen`, `drainingThread`, `drainingLoop`, `deferredDrain`, `dropped` and
  // `closingWaiters` are only touched with `lock` held. `draining` and `drainIndex` are only touched by `drain` on the thread that
  // `drainingThread` names (set under the lock by its outermost drain, cleared under the lock
  // after its last access): the source's perform and close routines, on a loop thread; a nested
  // run or a handler that invalidates the source may drain again from inside a handler on that
  // thread. A source that moved to another loop while its old loop was delivering a batch may be
  // fired on the new loop's thread meanwhile: that drain leaves `draining` alone (see `drain`).
  // No dynamic exclusivity checks (see `ModeContents`): no access spans a call out.
  @usableFromInline let lock = PthreadLock.make()
  @exclusivity(unchecked) @usableFromInline var pending: [Command] = []
  @exclusivity(unchecked) @usableFromInline var isOpen = true
  /// The commands taken from `pending` and not all delivered yet: `draining[drainIndex...]`.
  @exclusivity(unchecked) @usableFromInline var draining: [Command] = []
  @exclusivity(unchecked) @usableFromInline var drainIndex = 0
  /// The thread whose drain is on its stack (it owns `draining`), nil when none.
  @exclusivity(unchecked) @usableFromInline var drainingThread: pthread_t?
  /// That thread's loop (its `LoopShared`, unretained: alive while its thread drains), for a
  /// closing drain on another loop that waits for the batch to end.
  @exclusivity(unchecked) @usableFromInline var drainingLoop: UnsafeMutableRawPointer?
  /// Closing drains on other loops' threads waiting for the batch to end: opened when it does.
  @exclusivity(unchecked) @usableFromInline var closingWaiters: [BlockingGate] = []
  /// A drain on another thread found `drainingThread` busy and left its commands pending: the
  /// busy drain asks for another fire when it ends.
  @exclusivity(unchecked) @usableFromInline var deferredDrain = false
  /// Commands dropped because no loop was left to deliver them (`discardPending`).
  @exclusivity(unchecked) var dropped = 0

  @usableFromInline init() {}

  @usableFromInline
  enum AppendResult {
    /// Refused: the source was invalidated.
    case refused
    /// Accepted; `firstPending` when the buffer was empty (the source must be signalled).
    case accepted(firstPending: Bool)
  }

  /// Appends `command` unless `source` was invalidated. Any thread.
  @inlinable
  func append(_ command: Command, whileValid source: InputSource) -> AppendResult {
    lock.lock()
    defer { lock.unlock() }
    // `isOpen` alone is not enough: it closes only when the loop runs the cancel routine, which
    // is later than `invalidate()` returning (another thread) or never (never scheduled). Checked
    // under our lock, before the cancel routine's closing drain can take it: a command accepted
    // here is in the buffer that drain delivers.
    guard isOpen, source.isValid else { return .refused }
    let wasEmpty = pending.isEmpty
    pending.append(command)
    return .accepted(firstPending: wasEmpty)
  }

  /// The number of commands posted and not yet taken by the loop for delivery. Any thread.
  var pendingCount: Int { lock.withLock { pending.count } }

  /// Accepted commands dropped by `discardPending`. Any thread.
  var droppedCount: Int { lock.withLock { dropped } }

  /// The source was invalidated with no loop left to deliver on (its routines are released, so
  /// no drain can start): refuses later posts and releases what waits, outside the lock. Any
  /// thread.
  @usableFromInline
  func discardPending() {
    var dropped: [Command] = []
    lock.lock()
    isOpen = false
    swap(&dropped, &pending)
    self.dropped += dropped.count
    lock.unlock()
    withExtendedLifetime(dropped) {}
  }

  /// Loop thread (the perform and cancel routines): takes the posted commands under the lock,
  /// then delivers them in order. `closing` refuses every later post first.
  ///
  /// `draining[drainIndex...]` is one queue that a re-entrant drain continues instead of starting
  /// over: a handler that runs the loop nested (the source fires again) or invalidates its own
  /// source (the cancel routine's closing drain) gets the rest of the batch delivered first, in
  /// posting order, exactly once, and before `cancel`.
  ///
  /// The queue belongs to one thread at a time. A source removed from its loop while that loop's
  /// thread delivers a batch may at once be added to, and fired on, another loop: that thread's
  /// drain leaves the commands pending (the handler is never called on two threads at once) and
  /// the busy drain returns true when it is done: signal the source again, so that its loop now
  /// delivers them. A closing drain there (the source invalidated on its new loop) waits for the
  /// batch to end, then delivers what is pending, so that every command still comes in posting
  /// order and before `cancel`. It delivers what is pending at once instead when waiting could
  /// deadlock (see `waitForOtherDrainLocked`).
  /// - Returns: true when the source must be signalled again (commands were left for this drain).
  @inlinable
  func drain(into handler: (Command) -> Void, closing: Bool) -> Bool {
    let thread = pthread_self()
    lock.lock()
    if closing { isOpen = false }
    if let owner = drainingThread, pthread_equal(owner, thread) == 0 {
      // Another loop's thread is delivering a batch it took while the source was on its loop.
      guard closing else {
        deferredDrain = true  // it signals the source again when it is done
        lock.unlock()
        return false
      }
      if !waitForOtherDrainLocked() {
        var rest: [Command] = []
        swap(&rest, &pending)
        lock.unlock()
        for command in rest { handler(command) }
        return false
      }
    }
    let outermost = drainingThread == nil
    if outermost { drainingLoop = currentLoopIdentity() }
    drainingThread = thread
    if drainIndex == draining.count {
      // Nothing left from an outer drain: the posted commands become the batch.
      draining.removeAll(keepingCapacity: true)
      drainIndex = 0
      swap(&pending, &draining)
    } else if !pending.isEmpty {
      // Inside an outer drain: queue behind its undelivered commands.
      draining.append(contentsOf: pending)
      pending.removeAll(keepingCapacity: true)
    }
    lock.unlock()
    while drainIndex < draining.count {
      let command = draining[drainIndex]
      drainIndex += 1
      handler(command)
    }
    // Everything delivered (by this drain or a nested one): release the commands now.
    if drainIndex == draining.count {
      draining.removeAll(keepingCapacity: true)
      drainIndex = 0
    }
    guard outermost else { return false }
    lock.lock()
    drainingThread = nil
    drainingLoop = nil
    let again = deferredDrain && !pending.isEmpty
    deferredDrain = false
    if !closingWaiters.isEmpty { openClosingWaitersLocked() }
    lock.unlock()
    return again
  }

  /// A closing drain, with `lock` held, while another loop's thread delivers a batch: waits until
  /// no other thread drains (the lock is released while waiting, held again on return), with this
  /// loop recorded as waiting for that one. False (give up: deliver at once) when that loop is, or
  /// comes to be, waiting for this one, directly or through other loops, in `performAndWait`,
  /// `invalidateAndWait` or `shutdownAndWait` (checked every `closingWaitSliceNanoseconds`),
  /// when the batch has not ended after `closingWaitLimitNanoseconds` (the handler may be
  /// waiting for this loop in a way the loops cannot see), or when the caller is on no loop
  /// thread.
  @usableFromInline
  func waitForOtherDrainLocked() -> Bool {
    let thread = pthread_self()
    var waited: Int64 = 0
    while let owner = drainingThread, pthread_equal(owner, thread) == 0 {
      guard waited < Self.closingWaitLimitNanoseconds, let identity = drainingLoop,
        let waiter = RunLoopThread.currentIfExists?.shared
      else { return false }
      // Alive: its thread is inside its drain, which cannot end without this lock.
      let busy = Unmanaged<LoopShared>.fromOpaque(identity).takeUnretainedValue()
      let gate = BlockingGate()
      guard busy !== waiter, CalloutWaits.begin(waiter: waiter, target: busy, yields: true, until: gate) else {
        return false
      }
      closingWaiters.append(gate)
      lock.unlock()
      let opened = gate.wait(nanoseconds: Self.closingWaitSliceNanoseconds)
      CalloutWaits.end(waiter: waiter)
      lock.lock()
      if !opened {
        closingWaiters.removeAll { $0 === gate }
        waited += Self.closingWaitSliceNanoseconds
      }
    }
    return true
  }

  /// How often a waiting closing drain looks for a wait cycle, and how long it waits at most.
  @usableFromInline static var closingWaitSliceNanoseconds: Int64 { 10_000_000 }
  @usableFromInline static var closingWaitLimitNanoseconds: Int64 { 1_000_000_000 }

  /// The outermost drain ended (`lock` held): releases the closing drains waiting for it.
  @usableFromInline
  func openClosingWaitersLocked() {
    for gate in closingWaiters { gate.open() }
    closingWaiters.removeAll()
  }
}

/// The calling thread's loop (its `LoopShared`, unretained), if it is a loop thread. Any thread.
@usableFromInline
func currentLoopIdentity() -> UnsafeMutableRawPointer? {
  // A loop thread's slot holds its loop's identity (every outermost drain asks: no handle made);
  // the main thread binds its slot on first use.
  carl_current_loop() ?? RunLoopThread.currentIfExists.map { Unmanaged.passUnretained($0.shared).toOpaque() }
}
