/// A custom input source whose elements are consumed with `for await`.
///
/// Producers hand elements in from any thread:
/// - `post(_:)` never waits and never suspends: it is safe from plain threads and C callbacks. It
///   buffers the element, signals the source and wakes its loop, in one call.
/// - `send(_:)` is for async code: with `.bounded` buffering it suspends while the buffer is full.
/// - `post(_:timeout:)` is for plain threads that must not lose an element: with `.bounded`
///   buffering it blocks the calling thread while the buffer is full, up to `timeout`.
///
/// When the loop fires the source (on its thread, while it runs in one of the source's modes) the
/// elements posted so far are released to the consumer. The consumer takes everything released in
/// one go into a local batch, and suspends only when that batch is empty, so a busy producer
/// costs the consumer one lock per batch, not per element. A consumer that runs on the source's
/// own loop (a task under `withTaskExecutorPreference(loop)`, or a `LoopActor` of that loop) is
/// resumed from the loop thread itself, which enqueues on that thread without waking anything.
/// Such a consumer that finds nothing to take, while elements posted since it was resumed wait
/// for the source to fire, fires the source itself when the loop has nothing else to do before
/// it would fire it (see "One pass of the loop"), and takes them without suspending, for up to
/// 20 µs after the first such fire in a loop job; then it waits for the loop.
///
/// Every element that was accepted (`.enqueued`, `.enqueuedDroppingOldest`) is delivered exactly
/// once and in order (per producer; posts from different threads interleave in the order they
/// took the lock), unless the consumer stops first or, with `.dropOldest`, a later post pushes it
/// out of the buffer before the consumer takes it (counted in `droppedCount`: there, delivered =
/// accepted − `droppedCount`).
///
/// **One consumer.** A sequence has a single consumer: a second `makeAsyncIterator()` traps with
/// a message saying so, as does a second concurrent `next()`. Fan out from that one task if
/// several need the elements.
///
/// **How it ends.**
/// - The consuming task is cancelled, or it drops its iterator (`break`): the sequence ends
///   (`next()` returns nil), buffered elements are discarded, later posts answer `.terminated`,
///   and the source leaves its loop: `onCancel` runs once, on the loop thread. A consumer waiting
///   in `next()` ends at the cancellation; one busy in its loop body ends at its next `next()`,
///   and posts accepted until then are discarded with the buffer.
/// - `invalidate()`: later posts answer `.terminated`; what was accepted is still delivered, then
///   `next()` returns nil. `onCancel` runs once on the loop thread.
/// - The loop shuts down: as `invalidate()`.
/// - The sequence and its iterator are dropped: the source is invalidated.
public final class SourceSequence<Element: Sendable>:  // Safety: proof below
  AsyncSequence, InputSourceSequence, @unchecked Sendable
{
  public typealias Failure = Never
  /// The single consumer's iterator. Not `Sendable`: iterate from one task.
  public typealias Iterator = SingleConsumerIterator<SourceSequence<Element>>
  // Safety: `loop`, `source` and `lock` are immutable after init. `machine` is only touched with
  // `lock` held, here and in `SingleConsumerStorage`'s shared consumer code (every access below is between `lock.lock()` and `lock.unlock()` or inside
  // `lock.withLock`); continuations are resumed and the source signalled after the lock is
  // released.
  // No dynamic exclusivity checks on `machine`: see `SingleConsumerStorage.machine`.

  /// The loop the source is scheduled on.
  public let loop: RunLoopThread
  /// The underlying custom source (its perform routine releases posted elements).
  @usableFromInline let source: InputSource
  // `@usableFromInline`: `post` and the iterator's fast path are inlined into the client.
  @usableFromInline let lock = PthreadLock.make()
  @exclusivity(unchecked) @usableFromInline var machine: Machine

  @usableFromInline typealias Machine = SourceSequenceStateMachine<
    Element, UnsafeContinuation<Void, Never>, SourceProducer
  >

  /// `@inlinable`, like the factory that calls it: the source's perform routine is then made
  /// (and specialized for the element type) in the client.
  @inlinable
  init(
    loop: RunLoopThread, buffering: SourceBuffering, order: Int,
    onSchedule: (@Sendable (RunLoopThread, RunLoopMode) -> Void)?,
    onCancel: (@Sendable (RunLoopThread) -> Void)?
  ) {
    let owner = WeakOwner<SourceSequence<Element>>()
    self.loop = loop
    self.machine = Machine(buffering: buffering)
    self.source = SourceSequence<Element>.makeSource(
      owner: owner, order: order, onSchedule: onSchedule, onCancel: onCancel)
    owner.value = self
  }

  /// Dropping the sequence (and its iterator) invalidates the source.
  deinit {
    source.invalidate()
  }

  // MARK: Producers (any thread)

  /// Buffers `element`, signals the source and wakes its loop. Any thread; never waits, never
  /// suspends (safe from C callbacks and plain threads).
  ///
  /// The result is not discardable, unlike `CommandSource.post(_:)`'s: a command source's buffer
  /// has no limit, so its post is refused only once the source has ended, and ignoring that loses
  /// nothing anyone would still receive; this buffer may be bounded, and a live sequence can
  /// refuse (`.full`) or drop (`.dropped`) the element. Whoever posts decides what that means: write
  /// `_ = sequence.post(x)` where losing it is fine (an `.unbounded` buffer, or a newest-wins
  /// stream), otherwise retry, use `send(_:)` from async code, or `post(_:timeout:)` to block a
  /// plain thread until there is room.
  /// - Returns: `.enqueued` (or `.enqueuedDroppingOldest`) when the element was taken; `.full`
  ///   when a `.bounded` buffer is full (the element was not taken: retry, or use `send`);
  ///   `.dropped` when a `.dropNewest` buffer is full; `.terminated` when the sequence has ended.
  @inlinable
  public func post(_ element: Element) -> SourcePostResult {
    lock.lock()
    let action = machine.post(element)
    lock.unlock()
    switch action {
    case .accepted(let result, let signalSource, _):
      if signalSource { source.signal() }
      return result
    case .refused(let result):
      return result
    }
  }

  /// Buffers `element`, suspending the calling task while a `.bounded` buffer is full (producers
  /// that wait are admitted oldest first). With other buffering it never suspends and answers as
  /// `post(_:)`. Any task.
  /// - Returns: `.enqueued` once the element was taken; `.terminated` if the sequence ended
  ///   first; `.full` if the task was cancelled while it waited (the element was not taken).
  public func send(_ element: Element, isolation actor: isolated (any Actor)? = #isolation) async -> SourcePostResult {
    let first = post(element)
    guard first == .full else { return first }
    let id = lock.withLock { machine.makeProducerID() }
    return await withTaskCancellationHandler {
      await withUnsafeContinuation(isolation: actor) { (continuation: UnsafeContinuation<SourcePostResult, Never>) in
        lock.lock()
        let action = machine.suspendProducer(
          id: id, element: element, continuation: .task(continuation), isCancelled: Task.isCancelled)
        lock.unlock()
        switch action {
        case .suspended:
          break
        case .resume(let result, let signalSource):
          if signalSource { source.signal() }
          continuation.resume(returning: result)
        }
      }
    } onCancel: {
      self.cancelProducer(id: id)
    }
  }

  /// Ends the sequence: later posts answer `.terminated`, producers waiting in `send` get
  /// `.terminated`, and what was accepted is still delivered before `next()` returns nil. The
  /// source leaves its loop and `onCancel` runs on the loop thread (if the source was scheduled).
  /// Any thread; idempotent.
  public func invalidate() { closeThroughLoop() }

  /// Elements buffered and not yet taken by the consumer. Any thread.
  public var bufferedCount: Int { lock.withLock { machine.bufferedCount } }

  /// Elements dropped so far by `.dropOldest` / `.dropNewest` buffering. Any thread.
  public var droppedCount: Int { lock.withLock { machine.droppedCount } }

  /// Producers waiting for room (in `send`, or blocked in `post(_:timeout:)`). Any thread.
  var waitingProducerCount: Int { lock.withLock { machine.waitingProducerCount } }

  private func cancelProducer(id: UInt64) {
    lock.lock()
    let action = machine.cancelProducer(id: id)
    lock.unlock()
    switch action {
    case .none: break
    case .resume(let producer): producer.continuation.resume(returning: .full)
    }
  }

  // MARK: Loop side (loop thread)

  /// The perform routine: what was posted becomes available to the consumer.
  @inlinable
  func release() {
    lock.lock()
    let action = machine.release()
    lock.unlock()
    switch action {
    case .none: break
    case .resumeConsumer(let consumer, _): consumer.resume()
    }
  }

  // MARK: Consumer (the shared parts are in `SingleConsumerStorage`)

  /// Taking a batch made room: resume the producers whose elements joined the buffer.
  @inlinable
  func tookElements(_ effect: (producers: [SourceProducer], signalSource: Bool)) {
    for producer in effect.producers { producer.resume(returning: .enqueued) }
    if effect.signalSource { source.signal() }
  }

  /// A consumer on the source's own loop takes what was posted while it ran, without waiting for
  /// the next pass, when the loop has nothing else to do first (`InputSource.fireEarlyFromJob`).
  /// Off the loop's thread: false at once, without the source's lock.
  @usableFromInline
  func fireEarly() -> Bool { loop.isOnLoopThread && source.fireEarlyFromJob() }

  /// Producers that still waited learn that their element was not taken; discarded elements are
  /// released here, after the lock.
  @usableFromInline
  func dispose(_ leftovers: Machine.Discarded) {
    for producer in leftovers.producers { producer.continuation.resume(returning: .terminated) }
  }

  /// Makes the iterator of the sequence's single consumer. Traps when called a second time.
  /// `@inlinable`: the iterator's per-batch path is then specialized for the element type.
  @inlinable
  public func makeAsyncIterator() -> Iterator { makeSingleConsumerIterator() }
}

extension RunLoopThread {
  /// Creates a custom input source on this loop whose elements are consumed with `for await`.
  /// Any thread. See `SourceSequence`.
  ///
  /// ```swift
  /// let events = loop.sourceSequence(of: Int.self, buffering: .bounded(1024))
  /// // any thread, C callback included:
  /// _ = events.post(42)
  /// // the consumer:
  /// for await value in events { handle(value) }
  /// ```
  /// - Parameters:
  ///   - elementType: The element type.
  ///   - buffering: What happens when the consumer falls behind (`.unbounded` by default).
  ///   - modes: The modes the source is scheduled in (`.common` by default): elements are
  ///     released to the consumer only while the loop runs in one of them.
  ///   - order: Among custom sources ready in the same pass, lower orders fire first.
  ///   - onSchedule: Called once on the loop thread when the source joins the loop.
  ///   - onCancel: Called once on the loop thread when the source leaves the loop (the consumer
  ///     stopped, `invalidate()`, or the loop shut down), if it had joined it.
  /// - Returns: The sequence; it ends at once if the loop has already shut down.
  @inlinable
  public func sourceSequence<Element: Sendable>(
    of elementType: Element.Type = Element.self, buffering: SourceBuffering = .unbounded,
    modes: [RunLoopMode] = [.common], order: Int = 0,
    onSchedule: (@Sendable (RunLoopThread, RunLoopMode) -> Void)? = nil,
    onCancel: (@Sendable (RunLoopThread) -> Void)? = nil
  ) -> SourceSequence<Element> {
    precondition(!modes.isEmpty, "AsyncRunLoop: a SourceSequence on loop '\(name)' needs at least one mode in 'modes'")
    let sequence = SourceSequence<Element>(
      loop: self, buffering: buffering, order: order, onSchedule: onSchedule, onCancel: onCancel)
    for mode in modes { add(sequence.source, to: mode) }
    adoptSequence(sequence) { sequence.invalidate() }
    return sequence
  }
}
