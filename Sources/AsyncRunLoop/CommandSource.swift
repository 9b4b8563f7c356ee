/// A custom input source with a typed command buffer (SPEC §3, the "command buffer" pattern).
///
/// Any thread may `post(_:)` a command: the command is appended to the buffer, the source is
/// signalled and its loop woken, in one call. On the loop's next pass the handler runs on the loop
/// thread once per command, in the order the commands were posted (per posting thread; posts
/// from different threads interleave in the order they took the buffer's lock).
///
/// Nothing is lost silently: every command that `post` accepted (returned true for) is delivered
/// exactly once. When the source is invalidated while on a loop, the loop delivers what is still
/// buffered, refuses later posts (`post` returns false), and then calls `cancel`. A source that is
/// invalidated before it was ever scheduled keeps its buffer undelivered.
public final class CommandSource<Command: Sendable>: @unchecked Sendable {  // Safety: proof below
  // Safety: `source` is immutable. `pending` and `isOpen` are only touched with `lock` held.
  // `draining` is only touched by `drain()`, which runs on the loop thread (the perform routine).

  /// The underlying input source: add it to a loop's modes, or invalidate it. Keep the
  /// `CommandSource` itself alive while you post to it: dropping it invalidates the source.
  public let source: InputSource
  private let lock = PthreadLock.make()
  private var pending: [Command] = []
  private var isOpen = true
  private var draining: [Command] = []

  /// Creates a command source.
  /// - Parameters:
  ///   - order: Among ready sources, lower orders fire first.
  ///   - schedule: Called once, on the loop thread, when the source is first added to a loop.
  ///   - cancel: Called once, on the loop thread, when the source leaves its loop.
  ///   - handler: Called on the loop thread for each command, in posting order.
  public init(
    order: Int = 0,
    schedule: (@Sendable (InputSource, RunLoopThread, RunLoopMode) -> Void)? = nil,
    cancel: (@Sendable (InputSource, RunLoopThread) -> Void)? = nil,
    handler: @escaping @Sendable (Command) -> Void
  ) {
    // The perform routine needs `self`, which does not exist yet: route it through a box that is
    // filled in right after, before the source can be added to a loop. The box holds `self`
    // weakly, so dropping the CommandSource frees it (and `deinit` invalidates the source).
    let drainer = DrainerBox()
    source = InputSource(
      order: order, schedule: schedule,
      cancel: { source, loop in
        // Invalidated: refuse further posts, then deliver what was accepted before cancel.
        if !source.isValid { drainer.drain?(true) }
        cancel?(source, loop)
      },
      perform: { _ in drainer.drain?(false) })
    drainer.drain = { [weak self] closing in self?.drain(into: handler, closing: closing) }
  }

  /// Dropping the last reference invalidates the source: its loop removes it and calls cancel.
  deinit {
    source.invalidate()
  }

  /// Appends `command`, signals the source and wakes its loop. Any thread.
  /// - Returns: true when the command was accepted (it will be delivered exactly once); false
  ///   when the source has been invalidated and the command was refused.
  @discardableResult
  public func post(_ command: Command) -> Bool {
    lock.lock()
    // `isOpen` alone is not enough: it closes only when the loop runs the cancel routine, which
    // is later than `invalidate()` returning (another thread) or never (never scheduled). Checked
    // under our lock, before the cancel routine's closing drain can take it: a command accepted
    // here is in the buffer that drain delivers.
    guard isOpen, source.isValid else {
      lock.unlock()
      return false
    }
    let wasEmpty = pending.isEmpty
    pending.append(command)
    lock.unlock()
    if wasEmpty { source.signal() }
    return true
  }

  /// The number of commands posted and not yet handed to the handler. Any thread.
  public var pendingCount: Int { lock.withLock { pending.count } }

  /// Loop thread (the perform and cancel routines): swaps the buffer out under the lock, then
  /// delivers. `closing` refuses every later post first.
  private func drain(into handler: (Command) -> Void, closing: Bool) {
    lock.lock()
    if closing { isOpen = false }
    swap(&pending, &draining)
    lock.unlock()
    for command in draining { handler(command) }
    draining.removeAll(keepingCapacity: true)
  }
}

/// Holds the perform closure of a `CommandSource` until the source exists.
private final class DrainerBox: @unchecked Sendable {  // Safety: proof below
  // Safety: `drain` is written once in `CommandSource.init`, before the source is published to any
  // other thread, and only read afterwards (on the loop thread).
  var drain: ((_ closing: Bool) -> Void)?
}
