/// A coalescing custom source (the `uv_async_send` shape) consumed with `for await`:
/// many signals may become one element, and after the last signal at least one element is always
/// delivered.
///
/// `signal()` may be called from any thread, without awaiting (C callbacks, plain threads): it
/// counts the signal and, for the first signal since the loop last fired the source, signals the
/// source and wakes the loop, in one call. When the loop fires the source (on its thread, in one
/// of its modes) the signals counted so far are released; the consumer receives them as one
/// element, the number of signals it stands for (at least 1).
///
/// One consumer (a second `makeAsyncIterator()` traps). It ends as a `SourceSequence` does: the
/// consuming task is cancelled or drops its iterator (the source leaves its loop, `onCancel` runs
/// on the loop thread), `invalidate()` (signals already made are still delivered first), or the
/// loop shuts down.
public final class SignalSequence: AsyncSequence, InputSourceSequence, @unchecked Sendable {  // Safety: proof below
  public typealias Element = Int
  public typealias Failure = Never
  /// The single consumer's iterator. Not `Sendable`: iterate from one task.
  public typealias Iterator = SingleConsumerIterator<SignalSequence>
  // Safety: `loop`, `source` and `lock` are immutable after init. `machine` is only touched with
  // `lock` held, here and in `SingleConsumerStorage`'s shared consumer code; continuations are resumed and the source signalled after the lock is released.
  // No dynamic exclusivity checks on `machine`: see `SingleConsumerStorage.machine`.

  /// The loop the source is scheduled on.
  public let loop: RunLoopThread
  @usableFromInline let source: InputSource
  @usableFromInline let lock = PthreadLock.make()
  @exclusivity(unchecked) @usableFromInline var machine = SignalSequenceStateMachine<UnsafeContinuation<Void, Never>>()

  init(
    loop: RunLoopThread, order: Int, onSchedule: (@Sendable (RunLoopThread, RunLoopMode) -> Void)?,
    onCancel: (@Sendable (RunLoopThread) -> Void)?
  ) {
    let owner = WeakOwner<SignalSequence>()
    self.loop = loop
    self.source = SignalSequence.makeSource(owner: owner, order: order, onSchedule: onSchedule, onCancel: onCancel)
    owner.value = self
  }

  /// Dropping the sequence (and its iterator) invalidates the source.
  deinit {
    source.invalidate()
  }

  /// Counts a signal; the first since the loop last fired the source signals it and wakes the
  /// loop. Any thread; never waits.
  /// - Returns: false when the sequence has ended (the signal is ignored).
  @discardableResult
  public func signal() -> Bool {
    lock.lock()
    let action = machine.signal()
    lock.unlock()
    switch action {
    case .signalSource:
      source.signal()
      return true
    case .counted:
      return true
    case .refused:
      return false
    }
  }

  /// Ends the sequence after the signals already made are delivered; the source leaves its loop
  /// and `onCancel` runs on the loop thread (if it was scheduled). Any thread; idempotent.
  public func invalidate() { closeThroughLoop() }

  /// The perform routine (loop thread): the signals counted so far are released.
  @usableFromInline
  func release() {
    lock.lock()
    let consumer = machine.release()
    lock.unlock()
    consumer?.resume()
  }

  /// Makes the iterator of the sequence's single consumer. Traps when called a second time.
  public func makeAsyncIterator() -> Iterator { makeSingleConsumerIterator() }
}

/// The cross-thread state of a `SignalSequence`: a pure state machine held under its lock, generic
/// over the consumer's waiter handle (a continuation; a token in tests).
///
/// Signals are counted in `pendingSignals` until the loop fires the source, which moves them to
/// `releasedSignals`; the consumer takes all released signals as one element. The lifecycle is the
/// shared `ConsumerLifecycle`, as in `SourceSequenceStateMachine`: `invalidate()` closes it, the
/// source's detach ends it (the consumer drains, then ends), the consumer stopping cancels it.
@usableFromInline
struct SignalSequenceStateMachine<Consumer>: ClosableStateMachine {
  @usableFromInline var lifecycle = ConsumerLifecycle<Consumer>(sequenceName: "SignalSequence")
  /// Signals since the loop last fired the source.
  private(set) var pendingSignals = 0
  /// Signals released by the loop and not yet taken by the consumer.
  private(set) var releasedSignals = 0

  enum SignalAction {
    /// The first signal since the loop last looked: signal the source (and wake the loop).
    case signalSource
    /// Counted; the source is signalled already.
    case counted
    /// The sequence has ended: ignored.
    case refused
  }

  /// A producer signals (any thread).
  mutating func signal() -> SignalAction {
    guard lifecycle.isAccepting else { return .refused }  // ended
    pendingSignals = pendingSignals.addingSaturating(1)  // saturates: still "many signals"
    return pendingSignals == 1 ? .signalSource : .counted
  }

  /// The loop fired the source (loop thread): the signals counted so far are released.
  /// - Returns: the consumer to resume, if it waited.
  mutating func release() -> Consumer? {
    moveSignals()  // nothing moves once ended or stopped: `pendingSignals` is 0 then
    return lifecycle.delivered(hasElements: hasElements)
  }

  // MARK: SingleConsumerStateMachine

  @usableFromInline
  var hasElements: Bool { releasedSignals > 0 }

  /// One element: every released signal.
  @usableFromInline
  mutating func moveElements(into batch: inout ElementBatch<Int>) {
    batch.append(releasedSignals)
    releasedSignals = 0
  }

  @usableFromInline
  mutating func discardAll() { (pendingSignals, releasedSignals) = (0, 0) }

  /// Nobody waits to signal.
  @usableFromInline
  mutating func stopAccepting() {}

  /// The source left its loop: the pending signals are released.
  @usableFromInline
  mutating func finishBuffering() { moveSignals() }

  private mutating func moveSignals() {
    releasedSignals = releasedSignals.addingSaturating(pendingSignals)
    pendingSignals = 0
  }
}

extension Int {
  fileprivate func addingSaturating(_ other: Int) -> Int {
    let (sum, overflow) = addingReportingOverflow(other)
    return overflow ? Int.max : sum
  }
}

extension RunLoopThread {
  /// Creates a coalescing custom source on this loop whose elements (numbers of signals) are
  /// consumed with `for await`. Any thread. See `SignalSequence`.
  /// - Parameters:
  ///   - modes: The modes the source is scheduled in (`.common` by default): signals are
  ///     released to the consumer only while the loop runs in one of them.
  ///   - order: Among custom sources ready in the same pass, lower orders fire first.
  ///   - onSchedule: Called once on the loop thread when the source joins the loop.
  ///   - onCancel: Called once on the loop thread when the source leaves the loop, if it joined.
  /// - Returns: The sequence; it ends at once if the loop has already shut down.
  public func signalSequence(
    modes: [RunLoopMode] = [.common], order: Int = 0,
    onSchedule: (@Sendable (RunLoopThread, RunLoopMode) -> Void)? = nil,
    onCancel: (@Sendable (RunLoopThread) -> Void)? = nil
  ) -> SignalSequence {
    precondition(!modes.isEmpty, "AsyncRunLoop: a SignalSequence on loop '\(name)' needs at least one mode in 'modes'")
    let sequence = SignalSequence(loop: self, order: order, onSchedule: onSchedule, onCancel: onCancel)
    for mode in modes { add(sequence.source, to: mode) }
    adoptSequence(sequence) { sequence.invalidate() }
    return sequence
  }
}
