import AsyncRunLoop
import CoreFoundation

/// One firing of a `CFRunLoopTimerSequence`'s timer, or several folded together when the
/// consumer fell behind by more than the buffer limit.
public struct CFRunLoopTimerTick: Sendable, Equatable {
  /// When the (last folded) firing ran, in CF absolute time (`CFAbsoluteTimeGetCurrent()` in the
  /// timer's callout on the run loop's thread).
  public var firedAt: CFAbsoluteTime
  /// How many firings this tick stands for: 1, more when the buffer was full.
  public var firings: Int

  public init(firedAt: CFAbsoluteTime, firings: Int) {
    self.firedAt = firedAt
    self.firings = firings
  }
}

extension CFRunLoopTimerTick: FoldableFiring {
  mutating func fold(_ later: CFRunLoopTimerTick) {
    firedAt = later.firedAt
    firings += later.firings
  }
}

/// A CFRunLoopTimer on a `CFRunLoopExecutor`'s run loop, consumed with `for await`: each element
/// is a tick for a firing. Make one with `executor.timer(every:tolerance:modes:bufferLimit:)`
/// (repeating; the first firing is due one interval from the call) or `executor.timer(after:)`
/// (one firing, then the sequence ends).
///
/// The timer fires on the executor's thread while its run loop runs in one of the timer's modes
/// (CF's rules: a repeating timer that fires late skips the firings it missed). Firings the
/// consumer has not taken yet wait in a buffer of `bufferLimit` ticks; a firing that finds it full
/// is folded into the newest tick (its `firings` grows). So no firing is lost or counted twice:
/// the `firings` of the delivered ticks add up to the timer's firings.
///
/// One consumer (a second `makeAsyncIterator()` traps). It ends:
/// - when the consuming task is cancelled, or the consumer drops its iterator (`break`):
///   `next()` returns nil, buffered ticks are discarded, and the timer is invalidated;
/// - on `invalidate()`, on the executor's `shutdown()` (its final drain) and after the one firing
///   of a one-shot timer: buffered ticks are delivered, then `next()` returns nil;
/// - when the sequence and its iterator are dropped: the timer is invalidated.
public final class CFRunLoopTimerSequence: AsyncSequence, @unchecked Sendable {  // Safety: proof below
  public typealias Element = CFRunLoopTimerTick
  public typealias Failure = Never
  // Safety: every stored property is immutable after init; the mutable state is in `storage`,
  // under its lock. `timer` is only passed to CF's thread-safe calls (add, invalidate).

  /// The executor whose run loop the timer is on.
  public let executor: CFRunLoopExecutor
  /// The underlying CF timer (its callout turns firings into ticks).
  let timer: CFRunLoopTimer
  /// The executor's run loop, held while the timer may be invalidated; nil when its thread had
  /// exited already.
  private let runLoop: CFRunLoop?
  let storage: FiringSequenceStorage<CFRunLoopTimerTick>

  init(executor: CFRunLoopExecutor, firstFire: CFAbsoluteTime, interval: Double, modes: [RunLoopMode], limit: Int) {
    let owner = WeakFiringStorage<CFRunLoopTimerTick>()
    let repeats = interval > 0
    // The callout runs on the executor's thread; a one-shot timer is done after its firing.
    guard
      let timer = CFRunLoopTimerCreateWithHandler(
        nil, firstFire, interval, 0, 0,
        { _ in
          guard let storage = owner.value else { return }
          let now = CFAbsoluteTimeGetCurrent()
          storage.deliver { _ in CFRunLoopTimerTick(firedAt: now, firings: 1) }
          if !repeats { storage.end() }
        })
    else { preconditionFailure("AsyncRunLoopFoundation: CFRunLoopTimerCreateWithHandler failed") }
    let reference = CFReference(object: timer)
    // A CF timer does not keep its run loop alive, and invalidating it reaches into the loop: the
    // sequence, and every invalidation, holds the loop (after the thread exits, CF's finalizer
    // lets go of it while the fallback queue may be ending the sequence).
    let runLoop = executor.threadRunLoop
    let loopReference = CFReference(object: runLoop)
    self.executor = executor
    self.timer = timer
    self.runLoop = runLoop
    storage = FiringSequenceStorage(limit: limit) {
      withExtendedLifetime(loopReference) { CFRunLoopTimerInvalidate(reference.object) }
    }
    owner.value = storage
    let weakStorage = owner
    guard executor.adopt(ObjectIdentifier(self), ender: { weakStorage.value?.end() }) else {
      storage.end()  // the executor has terminated: the sequence ends at once
      return
    }
    // No loop: the thread has exited, and the termination ends the sequence.
    guard let runLoop else { return }
    for mode in modes { CFRunLoopAddTimer(runLoop, timer, mode.coreFoundationMode) }
  }

  /// Dropping the sequence (and its iterator) invalidates the timer.
  deinit {
    executor.forget(ObjectIdentifier(self))
    CFRunLoopTimerInvalidate(timer)
  }

  /// Sets the timer's tolerance (how late CF may fire it). Any thread.
  func setTolerance(_ seconds: Double) { CFRunLoopTimerSetTolerance(timer, seconds) }

  /// Ends the sequence after the ticks already buffered are delivered; the timer is invalidated.
  /// Any thread; idempotent.
  public func invalidate() {
    storage.end()
    executor.forget(ObjectIdentifier(self))
  }

  /// Makes the iterator of the sequence's single consumer. Traps when called a second time.
  public func makeAsyncIterator() -> Iterator {
    storage.claimIterator(sequenceName: "CFRunLoopTimerSequence")
    return Iterator(sequence: self)
  }

  /// The single consumer's iterator. Iterate from one task.
  public struct Iterator: AsyncIteratorProtocol {
    // Holds the sequence, so the timer lives as long as someone iterates.
    private let sequence: CFRunLoopTimerSequence
    // Its deinit ends the sequence once no copy of the iterator is left.
    private let token: ConsumerToken<CFRunLoopTimerTick>

    init(sequence: CFRunLoopTimerSequence) {
      self.sequence = sequence
      token = ConsumerToken(storage: sequence.storage)
    }

    /// The next tick; nil once the sequence ended or the consuming task was cancelled.
    /// Runs in the caller's isolation (`nonisolated(nonsending)`; `actor` is not used): an
    /// `isolated` parameter would make the compiler hop to it on entry and back to the caller's
    /// actor after the return, two executor switches per element for a `for await` in an actor.
    nonisolated(nonsending) public mutating func next(isolation actor: (any Actor)? = #isolation) async
      -> CFRunLoopTimerTick?
    {
      await token.storage.next()
    }

    nonisolated(nonsending) public mutating func next() async -> CFRunLoopTimerTick? {
      await next(isolation: nil)
    }
  }
}

extension CFRunLoopExecutor {
  /// A repeating CFRunLoopTimer on this executor's run loop, consumed with `for await`. Any
  /// thread; the timer fires on the executor's thread. See `CFRunLoopTimerSequence`.
  ///
  /// ```swift
  /// for await tick in executor.timer(every: .milliseconds(100)) { refresh(tick.firings) }
  /// ```
  /// - Parameters:
  ///   - interval: The period (positive; traps otherwise). The first firing is due one interval
  ///     from now.
  ///   - tolerance: How late CF may fire the timer (`CFRunLoopTimerSetTolerance`). On Linux it
  ///     has no effect: swift-corelibs-foundation's CF keeps a timer's tolerance at 0.
  ///   - modes: The modes it fires in (`.common` by default: CF's common modes).
  ///   - bufferLimit: Ticks kept for a consumer that falls behind (positive); more firings are
  ///     folded into the newest tick.
  public func timer(
    every interval: Duration, tolerance: Duration = .zero, modes: [RunLoopMode] = [.common], bufferLimit: Int = 16
  ) -> CFRunLoopTimerSequence {
    let seconds = interval.cfSeconds
    precondition(seconds > 0, "AsyncRunLoopFoundation: timer(every:) needs a positive interval, not \(interval)")
    return makeTimerSequence(after: seconds, interval: seconds, tolerance: tolerance, modes: modes, limit: bufferLimit)
  }

  /// A one-shot CFRunLoopTimer: one tick `delay` from now, then the sequence ends. Any thread.
  public func timer(after delay: Duration, tolerance: Duration = .zero, modes: [RunLoopMode] = [.common])
    -> CFRunLoopTimerSequence
  {
    makeTimerSequence(after: max(0, delay.cfSeconds), interval: 0, tolerance: tolerance, modes: modes, limit: 1)
  }

  private func makeTimerSequence(
    after delay: Double, interval: Double, tolerance: Duration, modes: [RunLoopMode], limit: Int
  ) -> CFRunLoopTimerSequence {
    precondition(!modes.isEmpty, "AsyncRunLoopFoundation: a timer sequence needs at least one mode in 'modes'")
    let sequence = CFRunLoopTimerSequence(
      executor: self, firstFire: CFAbsoluteTimeGetCurrent() + delay, interval: interval, modes: modes, limit: limit)
    if tolerance > .zero { sequence.setTolerance(tolerance.cfSeconds) }
    return sequence
  }
}

extension Duration {
  /// The duration in seconds, as CF's intervals take it.
  var cfSeconds: Double {
    Double(components.seconds) + Double(components.attoseconds) / 1e18
  }
}
