import AsyncRunLoop
import CoreFoundation

/// One performance of a `CFRunLoopSourceSequence`'s source, or several folded together when the
/// consumer fell behind by more than the buffer limit.
public struct CFRunLoopSourcePerformance: Sendable, Equatable {
  /// The `signal()` calls this element covers (CF folds the signals that arrive before the
  /// source is performed into one performance). Can be 0: for a performance caused only by a
  /// direct `CFRunLoopSourceSignal` of `source`, and for one that a `signal()` racing the
  /// previous performance caused after that performance had already counted it.
  public var signals: Int
  /// How many performances this element stands for: 1, more when the buffer was full, 0 for the
  /// last element of a sequence that ended with signals no performance had taken yet (when the
  /// buffer was full then, those signals are folded into the newest element instead).
  public var performances: Int

  public init(signals: Int, performances: Int) {
    self.signals = signals
    self.performances = performances
  }
}

extension CFRunLoopSourcePerformance: FoldableFiring {
  mutating func fold(_ later: CFRunLoopSourcePerformance) {
    signals += later.signals
    performances += later.performances
  }
}

/// A version-0 CFRunLoopSource on a `CFRunLoopExecutor`'s run loop, consumed with `for await`:
/// each element reports a performance of the source. Make one with
/// `executor.sourceSequence(order:modes:bufferLimit:)`.
///
/// Signal it with `signal()` from any thread (or with `CFRunLoopSourceSignal(sequence.source)` and
/// `CFRunLoopWakeUp` from C code). CF performs the source on the executor's thread while its run
/// loop runs in one of the source's modes, once for all the signals since the last performance.
/// Every `signal()` that returned true is counted in exactly one delivered element (its
/// `signals`), also when the sequence ends by `invalidate()` or the executor's `shutdown()`
/// before CF performed the source (the last element then has `performances == 0`, or they are
/// folded into the newest element when the buffer is full); cancelling the consumer discards
/// what it had not taken. Elements the consumer has not taken yet wait in a buffer of
/// `bufferLimit`; a performance that finds it full is folded into the newest element.
///
/// CF offers no way to observe the performances of a source someone else created (its context,
/// perform callback included, is fixed at creation), so the sequence makes its own source.
///
/// One consumer (a second `makeAsyncIterator()` traps). It ends:
/// - when the consuming task is cancelled, or the consumer drops its iterator (`break`):
///   `next()` returns nil, buffered elements are discarded, later signals return false, and the
///   source is invalidated;
/// - on `invalidate()` and on the executor's `shutdown()` (its final drain): later signals return
///   false; what was signalled is delivered, then `next()` returns nil;
/// - when the sequence and its iterator are dropped: the source is invalidated.
public final class CFRunLoopSourceSequence: AsyncSequence, @unchecked Sendable {  // Safety: proof below
  public typealias Element = CFRunLoopSourcePerformance
  public typealias Failure = Never
  // Safety: every stored property is immutable after init; the mutable state is in `storage`,
  // under its lock. `source` and `runLoop` are only passed to CF's thread-safe calls (add, signal,
  // invalidate, wake up).

  /// The executor whose run loop the source is on.
  public let executor: CFRunLoopExecutor
  /// The underlying version-0 CF source. Signal it directly (`CFRunLoopSourceSignal`, then
  /// `CFRunLoopWakeUp(CFRunLoopGetCurrent())` on the executor's thread or the executor's run
  /// loop elsewhere) where `signal()` cannot be called; such signals are not counted. End the
  /// sequence with `invalidate()`, not by invalidating `source` or removing it from its modes
  /// directly: the sequence is not told of those, and its consumer would wait on.
  public let source: CFRunLoopSource
  /// The executor's run loop, which `signal()` wakes; nil when its thread had exited already.
  private let runLoop: CFRunLoop?
  let storage: FiringSequenceStorage<CFRunLoopSourcePerformance>

  init(executor: CFRunLoopExecutor, order: Int, modes: [RunLoopMode], limit: Int) {
    let owner = WeakFiringStorage<CFRunLoopSourcePerformance>()
    var context = CFRunLoopSourceContext()
    // CF retains the owner box for as long as the source lives (and releases it with the source).
    context.info = Unmanaged.passUnretained(owner).toOpaque()
    context.retain = { info in
      guard let info else { return nil }
      _ = Unmanaged<WeakFiringStorage<CFRunLoopSourcePerformance>>.fromOpaque(info).retain()
      return info
    }
    context.release = { info in
      guard let info else { return }
      Unmanaged<WeakFiringStorage<CFRunLoopSourcePerformance>>.fromOpaque(info).release()
    }
    // The performance, on the executor's thread: it takes the signals counted so far.
    context.perform = { info in
      guard let info else { return }
      let owner = Unmanaged<WeakFiringStorage<CFRunLoopSourcePerformance>>.fromOpaque(info).takeUnretainedValue()
      owner.value?.deliver { machine in
        CFRunLoopSourcePerformance(signals: machine.takeSignals(), performances: 1)
      }
    }
    guard let source = CFRunLoopSourceCreate(nil, CFIndex(order), &context) else {
      preconditionFailure("AsyncRunLoopFoundation: CFRunLoopSourceCreate failed")
    }
    let reference = CFReference(object: source)
    self.executor = executor
    self.source = source
    runLoop = executor.threadRunLoop
    storage = FiringSequenceStorage(limit: limit) { CFRunLoopSourceInvalidate(reference.object) }
    owner.value = storage
    guard executor.adopt(ObjectIdentifier(self), ender: { owner.value?.endKeepingSignals() }) else {
      storage.end()  // the executor has terminated: the sequence ends at once
      return
    }
    // No loop: the thread has exited, and the termination ends the sequence.
    guard let runLoop else { return }
    for mode in modes { CFRunLoopAddSource(runLoop, source, mode.coreFoundationMode) }
  }

  /// Dropping the sequence (and its iterator) invalidates the source.
  deinit {
    executor.forget(ObjectIdentifier(self))
    CFRunLoopSourceInvalidate(source)
  }

  /// Signals the source and wakes the executor's run loop: CF performs the source on the
  /// executor's thread. Any thread; never blocks.
  /// - Returns: true when the signal was counted (it will be in exactly one delivered element);
  ///   false once the sequence has ended.
  @discardableResult
  public func signal() -> Bool {
    guard storage.withState({ $0.acceptSignal() }) else { return false }
    CFRunLoopSourceSignal(source)
    if let runLoop { CFRunLoopWakeUp(runLoop) }
    return true
  }

  /// Ends the sequence: later signals return false; what was signalled is still delivered, then
  /// `next()` returns nil; the source is invalidated. Any thread; idempotent.
  public func invalidate() {
    storage.endKeepingSignals()
    executor.forget(ObjectIdentifier(self))
  }

  /// Makes the iterator of the sequence's single consumer. Traps when called a second time.
  public func makeAsyncIterator() -> Iterator {
    storage.claimIterator(sequenceName: "CFRunLoopSourceSequence")
    return Iterator(sequence: self)
  }

  /// The single consumer's iterator. Iterate from one task.
  public struct Iterator: AsyncIteratorProtocol {
    // Holds the sequence, so the source lives as long as someone iterates.
    private let sequence: CFRunLoopSourceSequence
    // Its deinit ends the sequence once no copy of the iterator is left.
    private let token: ConsumerToken<CFRunLoopSourcePerformance>

    init(sequence: CFRunLoopSourceSequence) {
      self.sequence = sequence
      token = ConsumerToken(storage: sequence.storage)
    }

    /// The next performance; nil once the sequence ended or the consuming task was cancelled.
    /// Runs in the caller's isolation (`nonisolated(nonsending)`; `actor` is not used): an
    /// `isolated` parameter would make the compiler hop to it on entry and back to the caller's
    /// actor after the return, two executor switches per element for a `for await` in an actor.
    nonisolated(nonsending) public mutating func next(isolation actor: (any Actor)? = #isolation) async
      -> CFRunLoopSourcePerformance?
    {
      await token.storage.next()
    }

    nonisolated(nonsending) public mutating func next() async -> CFRunLoopSourcePerformance? {
      await next(isolation: nil)
    }
  }
}

extension FiringSequenceStorage where Element == CFRunLoopSourcePerformance {
  /// Ends a source sequence: signals no performance took yet become its last element.
  func endKeepingSignals() {
    end { machine in
      let signals = machine.takeSignals()
      return signals > 0 ? CFRunLoopSourcePerformance(signals: signals, performances: 0) : nil
    }
  }
}

extension CFRunLoopExecutor {
  /// A version-0 CFRunLoopSource on this executor's run loop, whose performances are consumed
  /// with `for await`. Any thread; CF performs the source on the executor's thread. See
  /// `CFRunLoopSourceSequence`.
  ///
  /// ```swift
  /// let wakeups = executor.sourceSequence()
  /// // any thread:
  /// wakeups.signal()
  /// // the consumer:
  /// for await performance in wakeups { drain(performance.signals) }
  /// ```
  /// - Parameters:
  ///   - order: CF's order among the sources ready at once (lower first).
  ///   - modes: The modes it is performed in (`.common` by default: CF's common modes).
  ///   - bufferLimit: Elements kept for a consumer that falls behind (positive); more
  ///     performances are folded into the newest element.
  public func sourceSequence(order: Int = 0, modes: [RunLoopMode] = [.common], bufferLimit: Int = 16)
    -> CFRunLoopSourceSequence
  {
    precondition(!modes.isEmpty, "AsyncRunLoopFoundation: a source sequence needs at least one mode in 'modes'")
    return CFRunLoopSourceSequence(executor: self, order: order, modes: modes, limit: bufferLimit)
  }
}
