import CoreFoundation

/// The shared part of `CFRunLoopTimerSequence` and `CFRunLoopSourceSequence`: the state machine
/// under its lock, and the side effects of its actions, performed after the lock is released
/// (resuming the consumer, invalidating the timer or source).
final class FiringSequenceStorage<Element: FoldableFiring>: @unchecked Sendable {  // Safety: proof below
  // Safety: `state` is only touched inside `withLock` (its own pthread mutex); `invalidateMember`
  // is immutable after init and calls only CF's thread-safe invalidation. Continuations are
  // resumed after `withLock` returns.
  typealias Machine = FiringBuffer<Element, UnsafeContinuation<Element?, Never>>
  private let state: BridgeLock<Machine>
  private let invalidateMember: @Sendable () -> Void

  init(limit: Int, invalidateMember: @escaping @Sendable () -> Void) {
    state = BridgeLock(Machine(limit: limit))
    self.invalidateMember = invalidateMember
  }

  /// Reads or changes the machine (a pure transition; no side effects inside `body`).
  func withState<T>(_ body: (inout Machine) -> T) -> T { state.withLock(body) }

  /// A firing, on the run loop's thread: `make` builds its element under the lock.
  func deliver(_ make: (inout Machine) -> Element) {
    let action = state.withLock { machine in machine.deliver(make(&machine)) }
    switch action {
    case .none: break
    case .resume(let consumer, let element): consumer.resume(returning: element)
    }
  }

  /// Ends the sequence after what is buffered (and `final`, built under the lock) is delivered,
  /// and invalidates the timer or source. Any thread; idempotent.
  ///
  /// The member is invalidated before the sequence is marked ended, here and in `cancel()`: a
  /// consumer that sees the end (waiting, or calling `next()` later) finds the timer or source
  /// invalid, and a firing that comes in between is still delivered. (Invalidating an invalid
  /// member does nothing.)
  func end(final: (inout Machine) -> Element? = { _ in nil }) {
    invalidateMember()
    let action = state.withLock { machine in machine.finish(final: machine.phase == .open ? final(&machine) : nil) }
    switch action {
    case .none: break
    case .resume(let consumer, let element): consumer.resume(returning: element)
    }
  }

  /// The consumer's task was cancelled: the sequence ends now. Any thread.
  func cancel() {
    invalidateMember()
    let waiting = state.withLock { $0.cancel() }.resume
    waiting?.resume(returning: nil)
  }

  /// `makeAsyncIterator()`: traps on a second call.
  func claimIterator(sequenceName: String) {
    let first = state.withLock { $0.makeIterator() }
    precondition(
      first, "AsyncRunLoopFoundation: a \(sequenceName) has one consumer; makeAsyncIterator() was called twice")
  }

  /// The consumer's `next()`: an element, or nil once the sequence ended or the task was
  /// cancelled (which ends the sequence). Runs, and resumes, in the caller's isolation (`actor`,
  /// `#isolation` by default).
  ///
  /// An `isolated` parameter, not `nonisolated(nonsending)`, as the core's `waitForConsumerWake`:
  /// the operation closure handed to `withTaskCancellationHandler` is then isolated to `actor`
  /// too. Formed in a `nonisolated(nonsending)` function it is not (Swift 6.3), and an actor on
  /// one of our loops, driven by a task that prefers that loop, was resumed in three of the loop's
  /// jobs per suspension instead of two.
  func next(isolation actor: isolated (any Actor)? = #isolation) async -> Element? {
    await withTaskCancellationHandler {
      await withUnsafeContinuation(isolation: actor) { (continuation: UnsafeContinuation<Element?, Never>) in
        switch state.withLock({ $0.next(continuation) }) {
        case .return(let element): continuation.resume(returning: element)
        case .suspended: break
        }
      }
    } onCancel: {
      cancel()
    }
  }
}

/// Held by a sequence's iterator (and its copies): when the last one goes away — the consumer
/// left its `for await` loop with `break`, or dropped the iterator — the sequence ends as if the
/// consuming task had been cancelled.
final class ConsumerToken<Element: FoldableFiring>: Sendable {
  let storage: FiringSequenceStorage<Element>

  init(storage: FiringSequenceStorage<Element>) { self.storage = storage }

  deinit { storage.cancel() }
}

/// A weak reference a CF callout reads to reach its sequence's storage. Written once, before the
/// timer or source joins a run loop (CF's lock orders that write before any callout).
final class WeakFiringStorage<Element: FoldableFiring>: @unchecked Sendable {  // Safety: proof below
  // Safety: `value` is written once in the sequence's init, before the CF object is added to a
  // run loop (CFRunLoopAddTimer/AddSource take CF's lock; callouts on the run loop's thread come
  // after), and only read afterwards, by callouts.
  weak var value: FiringSequenceStorage<Element>?
}

/// A CF object captured by a `@Sendable` closure.
struct CFReference<Object>: @unchecked Sendable {  // Safety: proof below
  // Safety: `object` is immutable; the closures that capture it call only CF's thread-safe
  // run-loop functions on it (invalidate, signal, wake up).
  let object: Object
}
