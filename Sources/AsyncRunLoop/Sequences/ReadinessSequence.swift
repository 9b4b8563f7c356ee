/// The readiness of a file descriptor (a "version 1" source), consumed with `for await`:
/// each element is the set of events (`.readable`, `.writable`, `.error`, `.hangUp`) that occurred
/// since the consumer last looked.
///
/// Built on a `DescriptorSource` scheduled in the given modes; events are seen on the loop thread
/// while the loop runs in one of them. Readiness is level-triggered: after an element, read (or
/// write) until `EAGAIN`, then ask for the next element; if the descriptor is still ready it comes
/// at once. While an element waits for the consumer, the registration is paused, so a consumer on
/// another executor does not make the loop spin on a descriptor that stays ready; it is resumed
/// when the consumer takes the element (listening again at once if the loop runs one of its modes
/// then, otherwise as soon as it does).
///
/// The sequence does not own the descriptor: close it after the sequence has ended. One consumer
/// (a second `makeAsyncIterator()` traps). It ends when the consuming task is cancelled or drops
/// its iterator (the descriptor is deregistered), on `invalidate()`, or on the loop's shutdown
/// (events already seen are delivered first).
public final class ReadinessSequence:
  AsyncSequence, SingleConsumerStorage, @unchecked Sendable  // Safety: proof below
{
  public typealias Element = DescriptorEvents
  public typealias Failure = Never
  /// The single consumer's iterator. Not `Sendable`: iterate from one task.
  public typealias Iterator = SingleConsumerIterator<ReadinessSequence>
  // Safety: `loop`, `source` and `lock` are immutable after init. `machine` is only touched with
  // `lock` held, here and in `SingleConsumerStorage`'s shared consumer code; continuations are resumed and the registration paused or resumed (on the loop
  // thread) after the lock is released.
  // No dynamic exclusivity checks on `machine`: see `SingleConsumerStorage.machine`.

  /// The loop that watches the descriptor.
  public let loop: RunLoopThread
  /// The underlying readiness source.
  let source: DescriptorSource
  @usableFromInline let lock = PthreadLock.make()
  @exclusivity(unchecked) @usableFromInline var machine = ReadinessSequenceStateMachine<
    UnsafeContinuation<Void, Never>
  >()

  init(loop: RunLoopThread, descriptor: Int32, events: DescriptorEvents, order: Int) {
    let owner = WeakOwner<ReadinessSequence>()
    self.loop = loop
    self.source = DescriptorSource(
      descriptor: descriptor, interest: events, order: order,
      handler: { source, events in owner.value?.ready(source, events) },
      onInvalidate: { owner.value?.memberEnded() })
    owner.value = self
  }

  /// Dropping the sequence (and its iterator) invalidates the source.
  deinit {
    source.invalidate()
  }

  /// The watched descriptor.
  public var descriptor: Int32 { source.descriptor }

  /// Why the loop refused to register the descriptor, when `readiness(of:…)` was called off the
  /// loop thread and only epoll could see the problem (`EEXIST`: another source on this loop
  /// watches the descriptor): the sequence then delivers one `.error` element and ends, and this
  /// says why. Nil otherwise: an `.error` element with no `registrationError` is the descriptor's
  /// own. Any thread.
  public var registrationError: SystemCallError? { source.registrationError }

  /// Ends the sequence after the events already seen are delivered, and deregisters the
  /// descriptor. Any thread; idempotent.
  public func invalidate() {
    source.invalidate()  // its onInvalidate ends the machine
  }

  /// The source's handler (loop thread).
  private func ready(_ source: DescriptorSource, _ events: DescriptorEvents) {
    lock.lock()
    let action = machine.ready(events)
    lock.unlock()
    switch action {
    case .recorded:
      break
    case .resumeConsumer(let consumer):
      consumer.resume()
    case .pauseRegistration:
      loop.core.setPaused(source, true)  // level-triggered: it would fire every pass until the consumer reads
    }
  }

  /// The consumer took an element while the registration was paused: resume it on the loop
  /// thread, unless another element is already waiting again.
  private func resumeRegistration() {
    let accepted = loop.onLoopThread { [self] in
      lock.lock()
      let deliver = machine.registrationCheck()
      lock.unlock()
      if deliver { loop.core.setPaused(source, false) }
    }
    _ = accepted  // a terminated loop: the source is invalidated and the sequence ends anyway
  }

  /// The consumer took an element: resume the paused registration when asked.
  @usableFromInline
  func tookElements(_ resumeRegistration: Bool) {
    if resumeRegistration { self.resumeRegistration() }
  }

  @usableFromInline
  func detachMember() { source.invalidate() }

  /// Makes the iterator of the sequence's single consumer. Traps when called a second time.
  public func makeAsyncIterator() -> Iterator { makeSingleConsumerIterator() }
}

/// The cross-thread state of a `ReadinessSequence`: a pure state machine held under its lock,
/// generic over the consumer's waiter handle; who waits and how it ends is the shared
/// `ConsumerLifecycle` (the source's invalidation ends it after the events already seen).
///
/// Events seen by the loop accumulate in `pending` (a union) until the consumer takes them. A
/// second event while one waits means the consumer has not read yet: the registration is paused
/// (`pauseRegistration`), and resumed when the consumer takes the element.
@usableFromInline
struct ReadinessSequenceStateMachine<Consumer>: SingleConsumerStateMachine {
  @usableFromInline var lifecycle = ConsumerLifecycle<Consumer>(sequenceName: "ReadinessSequence")
  private(set) var pending: DescriptorEvents = []
  /// True while the registration is paused because an element waits for the consumer.
  private(set) var paused = false

  enum ReadyAction {
    /// Kept for the consumer.
    case recorded
    /// Resume the waiting consumer.
    case resumeConsumer(Consumer)
    /// Kept, and an element was already waiting: pause the registration (loop thread).
    case pauseRegistration
  }

  /// The loop saw `events` (loop thread).
  mutating func ready(_ events: DescriptorEvents) -> ReadyAction {
    guard lifecycle.isAccepting else { return .recorded }  // a callout that raced the end: ignored
    let waiting = !pending.isEmpty
    pending.formUnion(events)
    if let consumer = lifecycle.delivered(hasElements: hasElements) { return .resumeConsumer(consumer) }
    guard waiting else { return .recorded }  // the first element: the consumer takes it when it asks
    paused = true  // the consumer has not read yet: stop the level-triggered repeats
    return .pauseRegistration
  }

  /// The loop is about to resume the paused registration (loop thread): true to resume it;
  /// false when an element is waiting again (it stays paused until that one is taken).
  mutating func registrationCheck() -> Bool {
    guard lifecycle.isAccepting else { return false }  // deregistered
    guard pending.isEmpty else {
      paused = true  // still unread: the next take resumes it
      return false
    }
    return true  // nothing waits: watch again
  }

  // MARK: SingleConsumerStateMachine

  @usableFromInline
  var hasElements: Bool { !pending.isEmpty }

  /// One element: the events seen so far. Returns whether to resume the paused registration (the
  /// consumer will read: watch again), never once the source is gone.
  @usableFromInline
  mutating func moveElements(into batch: inout ElementBatch<DescriptorEvents>) -> Bool {
    defer { (pending, paused) = ([], false) }
    batch.append(pending)
    return paused && lifecycle.isAccepting
  }

  @usableFromInline
  mutating func discardAll() { pending = [] }

  @usableFromInline
  mutating func finishBuffering() {}
}

extension RunLoopThread {
  /// The readiness of `descriptor`, consumed with `for await`. Any thread. See
  /// `ReadinessSequence`.
  ///
  /// ```swift
  /// for await events in try loop.readiness(of: socket, events: .readable) {
  ///   if events.contains(.readable) { readUntilWouldBlock(socket) }
  /// }
  /// ```
  /// - Parameters:
  ///   - descriptor: The descriptor to watch (pipe, socket, eventfd, timerfd, signalfd, …); it
  ///     must stay open while the sequence runs.
  ///   - events: `.readable`, `.writable`, or both (`.error` and `.hangUp` are always reported).
  ///   - modes: The modes the descriptor is watched in (`.common` by default).
  ///   - order: Among readiness sources ready in the same pass, lower orders fire first.
  /// - Throws: `SystemCallError` (`EBADF` for a closed descriptor, `EPERM` for one epoll cannot
  ///   watch, what epoll reports when called on the loop thread). A failure that only epoll can
  ///   see from another thread is delivered as an `.error` element, the sequence ends, and its
  ///   `registrationError` says why. One registration per descriptor and loop: to await
  ///   writability next to a reader of the same descriptor, watch a `dup()` of it (see
  ///   `DescriptorSource`).
  public func readiness(
    of descriptor: Int32, events: DescriptorEvents = .readable, modes: [RunLoopMode] = [.common], order: Int = 0
  ) throws(SystemCallError) -> ReadinessSequence {
    precondition(
      !modes.isEmpty, "AsyncRunLoop: a ReadinessSequence on loop '\(name)' needs at least one mode in 'modes'")
    let sequence = ReadinessSequence(loop: self, descriptor: descriptor, events: events, order: order)
    do {
      for mode in modes { try add(sequence.source, to: mode) }
    } catch {
      sequence.invalidate()
      throw error
    }
    adoptSequence(sequence) { sequence.invalidate() }
    return sequence
  }
}
