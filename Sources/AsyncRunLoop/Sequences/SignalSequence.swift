/// A coalescing custom source (SPEC §3, the `uv_async_send` shape) consumed with `for await`:
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
public final class SignalSequence: AsyncSequence, StoppableConsumption, @unchecked Sendable {  // Safety: proof below
  public typealias Element = Int
  public typealias Failure = Never
  // Safety: `loop`, `source` and `lock` are immutable after init. `machine` is only touched with
  // `lock` held; continuations are resumed and the source signalled after the lock is released.

  /// The loop the source is scheduled on.
  public let loop: RunLoopThread
  let source: InputSource
  private let lock = PthreadLock.make()
  private var machine = SignalSequenceStateMachine<UnsafeContinuation<Void, Never>>()

  init(
    loop: RunLoopThread, order: Int, onSchedule: (@Sendable (RunLoopThread, RunLoopMode) -> Void)?,
    onCancel: (@Sendable (RunLoopThread) -> Void)?
  ) {
    let owner = WeakOwner<SignalSequence>()
    var schedule: (@Sendable (InputSource, RunLoopThread, RunLoopMode) -> Void)?
    if let onSchedule { schedule = { _, loop, mode in onSchedule(loop, mode) } }
    self.loop = loop
    self.source = InputSource(
      order: order, schedule: schedule,
      cancel: { _, loop in
        owner.value?.sourceDetached()
        onCancel?(loop)
      },
      perform: { _ in owner.value?.release() })
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
  public func invalidate() {
    lock.lock()
    let action = machine.invalidate()
    lock.unlock()
    switch action {
    case .none:
      return
    case .invalidateSource:
      source.invalidate()
      // A source that never reached its loop gets no cancel routine: end after what is queued.
      if !loop.onLoopThread({ [self] in sourceDetached() }) { sourceDetached() }
    }
  }

  /// The perform routine (loop thread): the signals counted so far are released.
  private func release() {
    lock.lock()
    let action = machine.release()
    lock.unlock()
    switch action {
    case .none: break
    case .resumeConsumer(let consumer): consumer.resume()
    }
  }

  /// The cancel routine (loop thread), or the end of an `invalidate()` of a source that never
  /// reached its loop (any thread).
  private func sourceDetached() {
    lock.lock()
    let action = machine.sourceDetached()
    lock.unlock()
    switch action {
    case .none: break
    case .end(let consumer): consumer?.resume()
    }
  }

  /// The consumer stopped (cancelled, or dropped its iterator). Any thread; idempotent.
  @usableFromInline
  func stopConsuming() {
    lock.lock()
    let action = machine.stopConsuming()
    lock.unlock()
    switch action {
    case .none:
      break
    case .stop(let consumer, let invalidateSource):
      consumer?.resume()
      if invalidateSource { source.invalidate() }
    }
  }

  /// The consumer's task: the next element, suspending until the loop releases signals.
  fileprivate func next(isolation actor: isolated (any Actor)?) async -> Int? {
    while true {
      if Task.isCancelled {
        stopConsuming()
        return nil
      }
      lock.lock()
      let action = machine.take()
      lock.unlock()
      switch action {
      case .signals(let count):
        return count
      case .end:
        return nil
      case .suspend:
        await waitForConsumerWake(
          isolation: actor,
          register: { continuation in
            lock.lock()
            defer { lock.unlock() }
            switch machine.suspendConsumer(continuation) {
            case .suspended: return true
            case .resume: return false
            }
          },
          onCancel: { self.stopConsuming() })
      }
    }
  }

  /// The single consumer's iterator. Not `Sendable`: iterate from one task.
  public struct Iterator: AsyncIteratorProtocol {
    private let lifetime: ConsumerLifetime<SignalSequence>

    fileprivate init(_ sequence: SignalSequence) { lifetime = ConsumerLifetime(sequence) }

    /// The number of signals the next element stands for (at least 1), or nil once the sequence
    /// has ended or the task was cancelled.
    public mutating func next(isolation actor: isolated (any Actor)? = #isolation) async -> Int? {
      await lifetime.storage.next(isolation: actor)
    }

    public mutating func next() async -> Int? {
      await next(isolation: nil)
    }
  }

  /// Makes the iterator of the sequence's single consumer. Traps when called a second time.
  public func makeAsyncIterator() -> Iterator {
    let first = lock.withLock { machine.makeIterator() }
    precondition(first, singleConsumerViolation("SignalSequence"))
    return Iterator(self)
  }
}

/// The cross-thread state of a `SignalSequence`: a pure state machine held under its lock, generic
/// over the consumer's waiter handle (a continuation; a token in tests).
///
/// Signals are counted in `pendingSignals` until the loop fires the source, which moves them to
/// `releasedSignals`; the consumer takes all released signals as one element. Lifecycle as in
/// `SourceSequenceStateMachine`: `open` ⇄ `consumerWaiting` → `closing` (invalidate) → `closed`
/// (detached: drain, then end); `cancelled` when the consumer stops.
struct SignalSequenceStateMachine<Consumer> {
  private enum State {
    /// Counting signals; the consumer is not suspended.
    case open
    /// Counting signals; the consumer waits for the loop to release some.
    case consumerWaiting(Consumer)
    /// `invalidate()` was called: signals are refused; the loop has yet to detach the source.
    case closing(consumer: Consumer?)
    /// Detached: the consumer takes what was released, then the sequence ends.
    case closed
    /// The consumer stopped.
    case cancelled
  }

  private var state = State.open
  /// Signals since the loop last fired the source.
  private(set) var pendingSignals = 0
  /// Signals released by the loop and not yet taken by the consumer.
  private(set) var releasedSignals = 0
  private var iteratorMade = false

  /// `makeAsyncIterator()`: false when an iterator was made before.
  mutating func makeIterator() -> Bool {
    if iteratorMade { return false }  // second consumer: the caller traps
    iteratorMade = true
    return true
  }

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
    switch state {
    case .open, .consumerWaiting:
      let (sum, overflow) = pendingSignals.addingReportingOverflow(1)
      pendingSignals = overflow ? Int.max : sum  // saturates: still "many signals"
      return pendingSignals == 1 ? .signalSource : .counted
    case .closing, .closed, .cancelled:
      return .refused  // ended
    }
  }

  enum ReleaseAction {
    case none
    /// Resume the waiting consumer: released signals are there.
    case resumeConsumer(Consumer)
  }

  /// The loop fired the source (loop thread).
  mutating func release() -> ReleaseAction {
    switch state {
    case .open:
      moveSignals()  // the consumer takes them when it asks
      return .none
    case .consumerWaiting(let consumer):
      moveSignals()
      guard releasedSignals > 0 else { return .none }  // a stale fire: nothing new
      state = .open  // hand over
      return .resumeConsumer(consumer)
    case .closing(let consumer):
      moveSignals()
      guard let consumer, releasedSignals > 0 else { return .none }
      state = .closing(consumer: nil)  // the consumer runs; the detach is still to come
      return .resumeConsumer(consumer)
    case .closed, .cancelled:
      return .none  // ended
    }
  }

  enum TakeAction {
    /// One element: this many signals.
    case signals(Int)
    /// Nothing released: suspend.
    case suspend
    /// The sequence has ended.
    case end
  }

  /// The consumer asks for the next element.
  mutating func take() -> TakeAction {
    switch state {
    case .open, .closing(consumer: .none):
      guard releasedSignals > 0 else { return .suspend }  // wait for the loop
      return .signals(takeReleased())
    case .closed:
      guard releasedSignals > 0 else { return .end }  // drained: end
      return .signals(takeReleased())
    case .cancelled:
      return .end  // stopped
    case .consumerWaiting, .closing(consumer: .some):
      preconditionFailure(concurrentNextViolation("SignalSequence"))
    }
  }

  enum SuspendAction {
    case suspended
    /// Something changed since `take`: resume at once.
    case resume
  }

  /// The consumer found nothing and is about to wait.
  mutating func suspendConsumer(_ consumer: Consumer) -> SuspendAction {
    switch state {
    case .open:
      guard releasedSignals == 0 else { return .resume }  // released meanwhile
      state = .consumerWaiting(consumer)  // wait for the loop
      return .suspended
    case .closing(consumer: .none):
      guard releasedSignals == 0 else { return .resume }
      state = .closing(consumer: consumer)  // wait for the detach
      return .suspended
    case .closed, .cancelled:
      return .resume  // ended meanwhile
    case .consumerWaiting, .closing(consumer: .some):
      preconditionFailure(concurrentNextViolation("SignalSequence"))
    }
  }

  enum StopAction {
    case none
    /// Resume the consumer if it waits; invalidate the source when asked.
    case stop(consumer: Consumer?, invalidateSource: Bool)
  }

  /// The consumer stopped (cancelled, or dropped its iterator).
  mutating func stopConsuming() -> StopAction {
    defer { (pendingSignals, releasedSignals) = (0, 0) }
    switch state {
    case .open:
      state = .cancelled  // the source must leave its loop
      return .stop(consumer: nil, invalidateSource: true)
    case .consumerWaiting(let consumer):
      state = .cancelled  // end the wait
      return .stop(consumer: consumer, invalidateSource: true)
    case .closing(let consumer):
      state = .cancelled  // invalidated already
      return .stop(consumer: consumer, invalidateSource: false)
    case .closed:
      state = .cancelled  // the source is gone already
      return .stop(consumer: nil, invalidateSource: false)
    case .cancelled:
      return .none  // twice: no-op
    }
  }

  enum InvalidateAction {
    case none
    /// Invalidate the source; its detach releases the pending signals.
    case invalidateSource
  }

  /// `invalidate()`: refuse later signals; the ones made are still delivered.
  mutating func invalidate() -> InvalidateAction {
    switch state {
    case .open:
      state = .closing(consumer: nil)  // wait for the detach
      return .invalidateSource
    case .consumerWaiting(let consumer):
      state = .closing(consumer: consumer)  // the consumer keeps waiting for the detach
      return .invalidateSource
    case .closing, .closed, .cancelled:
      return .none  // ending already
    }
  }

  enum DetachAction {
    case none
    /// Resume the consumer if it waits: it drains and ends.
    case end(consumer: Consumer?)
  }

  /// The source left its loop (cancel routine; or it never reached a loop).
  mutating func sourceDetached() -> DetachAction {
    switch state {
    case .open:
      moveSignals()
      state = .closed  // shutdown (or removal) without invalidate()
      return .end(consumer: nil)
    case .consumerWaiting(let consumer), .closing(.some(let consumer)):
      moveSignals()
      state = .closed  // wake the consumer to drain and end
      return .end(consumer: consumer)
    case .closing(consumer: .none):
      moveSignals()
      state = .closed  // the detach invalidate() asked for
      return .end(consumer: nil)
    case .closed, .cancelled:
      return .none  // a second notice
    }
  }

  private mutating func moveSignals() {
    let (sum, overflow) = releasedSignals.addingReportingOverflow(pendingSignals)
    releasedSignals = overflow ? Int.max : sum
    pendingSignals = 0
  }

  private mutating func takeReleased() -> Int {
    defer { releasedSignals = 0 }
    return releasedSignals
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
    precondition(!modes.isEmpty, "AsyncRunLoop: a SignalSequence needs at least one mode")
    let sequence = SignalSequence(loop: self, order: order, onSchedule: onSchedule, onCancel: onCancel)
    for mode in modes { add(sequence.source, to: mode) }
    if isShutDown { sequence.invalidate() }  // it may never reach the loop: end it now
    return sequence
  }
}
