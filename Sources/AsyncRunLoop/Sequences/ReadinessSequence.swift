/// The readiness of a file descriptor (SPEC §3, "version 1" sources), consumed with `for await`:
/// each element is the set of events (`.readable`, `.writable`, `.error`, `.hangUp`) that occurred
/// since the consumer last looked.
///
/// Built on a `DescriptorSource` scheduled in the given modes; events are seen on the loop thread
/// while the loop runs in one of them. Readiness is level-triggered: after an element, read (or
/// write) until `EAGAIN`, then ask for the next element; if the descriptor is still ready it comes
/// at once. While an element waits for the consumer, the registration is paused, so a consumer on
/// another executor does not make the loop spin on a descriptor that stays ready; it is resumed
/// when the consumer takes the element.
///
/// The sequence does not own the descriptor: close it after the sequence has ended. One consumer
/// (a second `makeAsyncIterator()` traps). It ends when the consuming task is cancelled or drops
/// its iterator (the descriptor is deregistered), on `invalidate()`, or on the loop's shutdown
/// (events already seen are delivered first).
public final class ReadinessSequence: AsyncSequence, StoppableConsumption, @unchecked Sendable {  // Safety: proof below
  public typealias Element = DescriptorEvents
  public typealias Failure = Never
  // Safety: `loop`, `source` and `lock` are immutable after init. `machine` is only touched with
  // `lock` held; continuations are resumed and the registration paused or resumed (on the loop
  // thread) after the lock is released.

  /// The loop that watches the descriptor.
  public let loop: RunLoopThread
  /// The underlying readiness source.
  let source: DescriptorSource
  private let lock = PthreadLock.make()
  private var machine = ReadinessSequenceStateMachine<UnsafeContinuation<Void, Never>>()

  init(loop: RunLoopThread, descriptor: Int32, events: DescriptorEvents, order: Int) {
    let owner = WeakOwner<ReadinessSequence>()
    self.loop = loop
    self.source = DescriptorSource(
      descriptor: descriptor, interest: events, order: order,
      handler: { source, events in owner.value?.ready(source, events) },
      onInvalidate: { owner.value?.sourceInvalidated() })
    owner.value = self
  }

  /// Dropping the sequence (and its iterator) invalidates the source.
  deinit {
    source.invalidate()
  }

  /// The watched descriptor.
  public var descriptor: Int32 { source.descriptor }

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
      loop.setArmed(source, false)  // level-triggered: it would fire every pass until the consumer reads
    }
  }

  /// The consumer took an element while the registration was paused: resume it on the loop
  /// thread, unless another element is already waiting again.
  private func resumeRegistration() {
    let accepted = loop.onLoopThread { [self] in
      lock.lock()
      let deliver = machine.registrationCheck()
      lock.unlock()
      if deliver { loop.setArmed(source, true) }
    }
    _ = accepted  // a terminated loop: the source is invalidated and the sequence ends anyway
  }

  /// The source was invalidated (any thread).
  private func sourceInvalidated() {
    lock.lock()
    let action = machine.sourceInvalidated()
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

  /// The consumer's task: the next events, suspending until the descriptor is ready.
  fileprivate func next(isolation actor: isolated (any Actor)?) async -> DescriptorEvents? {
    while true {
      if Task.isCancelled {
        stopConsuming()
        return nil
      }
      lock.lock()
      let action = machine.take()
      lock.unlock()
      switch action {
      case .events(let events, let resume):
        if resume { resumeRegistration() }
        return events
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
    private let lifetime: ConsumerLifetime<ReadinessSequence>

    fileprivate init(_ sequence: ReadinessSequence) { lifetime = ConsumerLifetime(sequence) }

    /// The events seen since the last element, or nil once the sequence has ended or the task
    /// was cancelled.
    public mutating func next(isolation actor: isolated (any Actor)? = #isolation) async -> DescriptorEvents? {
      await lifetime.storage.next(isolation: actor)
    }

    public mutating func next() async -> DescriptorEvents? {
      await next(isolation: nil)
    }
  }

  /// Makes the iterator of the sequence's single consumer. Traps when called a second time.
  public func makeAsyncIterator() -> Iterator {
    let first = lock.withLock { machine.makeIterator() }
    precondition(first, singleConsumerViolation("ReadinessSequence"))
    return Iterator(self)
  }
}

/// The cross-thread state of a `ReadinessSequence`: a pure state machine held under its lock,
/// generic over the consumer's waiter handle.
///
/// Events seen by the loop accumulate in `pending` (a union) until the consumer takes them. A
/// second event while one waits means the consumer has not read yet: the registration is paused
/// (`pauseRegistration`), and resumed when the consumer takes the element.
struct ReadinessSequenceStateMachine<Consumer> {
  private enum State {
    /// Watching; the consumer is not suspended.
    case open
    /// Watching; the consumer waits for events.
    case consumerWaiting(Consumer)
    /// The source was invalidated: pending events are delivered, then the sequence ends.
    case ended
    /// The consumer stopped.
    case cancelled
  }

  private var state = State.open
  private(set) var pending: DescriptorEvents = []
  /// True while the registration is paused because an element waits for the consumer.
  private(set) var paused = false
  private var iteratorMade = false

  /// `makeAsyncIterator()`: false when an iterator was made before.
  mutating func makeIterator() -> Bool {
    if iteratorMade { return false }  // second consumer: the caller traps
    iteratorMade = true
    return true
  }

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
    switch state {
    case .open:
      let waiting = !pending.isEmpty
      pending.formUnion(events)
      guard waiting else { return .recorded }  // the first element: the consumer takes it when it asks
      paused = true  // the consumer has not read yet: stop the level-triggered repeats
      return .pauseRegistration
    case .consumerWaiting(let consumer):
      pending.formUnion(events)
      state = .open  // hand over
      return .resumeConsumer(consumer)
    case .ended, .cancelled:
      return .recorded  // a callout that raced the end: ignored
    }
  }

  enum TakeAction {
    /// An element; resume the paused registration when `resumeRegistration`.
    case events(DescriptorEvents, resumeRegistration: Bool)
    /// Nothing seen yet: suspend.
    case suspend
    /// The sequence has ended.
    case end
  }

  /// The consumer asks for the next element.
  mutating func take() -> TakeAction {
    switch state {
    case .open:
      guard !pending.isEmpty else { return .suspend }  // wait for the loop
      defer { (pending, paused) = ([], false) }
      return .events(pending, resumeRegistration: paused)  // the consumer will read: watch again
    case .ended:
      guard !pending.isEmpty else { return .end }  // drained: end
      defer { pending = [] }
      return .events(pending, resumeRegistration: false)  // deregistered already
    case .cancelled:
      return .end  // stopped
    case .consumerWaiting:
      preconditionFailure(concurrentNextViolation("ReadinessSequence"))
    }
  }

  /// The loop is about to resume the paused registration (loop thread): true to resume it;
  /// false when an element is waiting again (it stays paused until that one is taken).
  mutating func registrationCheck() -> Bool {
    switch state {
    case .open, .consumerWaiting:
      guard pending.isEmpty else {
        paused = true  // still unread: the next take resumes it
        return false
      }
      return true  // nothing waits: watch again
    case .ended, .cancelled:
      return false  // deregistered
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
      guard pending.isEmpty else { return .resume }  // seen meanwhile
      state = .consumerWaiting(consumer)  // wait for the loop
      return .suspended
    case .ended, .cancelled:
      return .resume  // ended meanwhile
    case .consumerWaiting:
      preconditionFailure(concurrentNextViolation("ReadinessSequence"))
    }
  }

  enum StopAction {
    case none
    /// Resume the consumer if it waits; invalidate the source when asked.
    case stop(consumer: Consumer?, invalidateSource: Bool)
  }

  /// The consumer stopped (cancelled, or dropped its iterator).
  mutating func stopConsuming() -> StopAction {
    defer { pending = [] }
    switch state {
    case .open:
      state = .cancelled  // deregister the descriptor
      return .stop(consumer: nil, invalidateSource: true)
    case .consumerWaiting(let consumer):
      state = .cancelled  // end the wait and deregister
      return .stop(consumer: consumer, invalidateSource: true)
    case .ended:
      state = .cancelled  // deregistered already
      return .stop(consumer: nil, invalidateSource: false)
    case .cancelled:
      return .none  // twice: no-op
    }
  }

  enum InvalidatedAction {
    case none
    /// Resume the consumer if it waits: it drains and ends.
    case end(consumer: Consumer?)
  }

  /// The source was invalidated (`invalidate()`, the loop's shutdown, a failed registration).
  mutating func sourceInvalidated() -> InvalidatedAction {
    switch state {
    case .open:
      state = .ended  // deliver what was seen, then end
      return .end(consumer: nil)
    case .consumerWaiting(let consumer):
      state = .ended  // nothing waits (it suspended): wake it to end
      return .end(consumer: consumer)
    case .ended, .cancelled:
      return .none  // ending already
    }
  }
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
  ///   see from another thread is delivered as an `.error` element, and the sequence ends.
  public func readiness(
    of descriptor: Int32, events: DescriptorEvents = .readable, modes: [RunLoopMode] = [.common], order: Int = 0
  ) throws(SystemCallError) -> ReadinessSequence {
    precondition(!modes.isEmpty, "AsyncRunLoop: a ReadinessSequence needs at least one mode")
    let sequence = ReadinessSequence(loop: self, descriptor: descriptor, events: events, order: order)
    do {
      for mode in modes { try add(sequence.source, to: mode) }
    } catch {
      sequence.invalidate()
      throw error
    }
    if isShutDown { sequence.invalidate() }  // it may never reach the loop: end it now
    return sequence
  }
}
