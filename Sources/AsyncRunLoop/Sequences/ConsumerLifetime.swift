/// A sequence whose single consumer can stop: the task was cancelled, or the iterator was dropped
/// (`break` out of `for await`).
@usableFromInline
protocol StoppableConsumption: AnyObject, Sendable {
  /// The consumer is gone: end the sequence and release what it holds. Any thread; idempotent.
  func stopConsuming()
}

/// Held by an iterator: when the iterator is dropped (the `for await` loop ended by `break`,
/// `return`, a throw, or the iterator went out of scope) its deinit stops the consumption, as
/// `AsyncStream`'s iterator does. Not shared between tasks: an iterator is not `Sendable`.
@usableFromInline
final class ConsumerLifetime {
  @usableFromInline let storage: any StoppableConsumption

  @usableFromInline
  init(_ storage: any StoppableConsumption) { self.storage = storage }

  deinit { storage.stopConsuming() }
}

/// The message every sequence traps with when a second iterator is made.
@usableFromInline
func singleConsumerViolation(_ sequence: String) -> String {
  "AsyncRunLoop: a \(sequence) has a single consumer; makeAsyncIterator() was called a second time. "
    + "Iterate it from one task only (fan out from that task if several need the elements)."
}

/// The message every sequence traps with when `next()` is called while a previous call is waiting.
@usableFromInline
func concurrentNextViolation(_ sequence: String) -> String {
  "AsyncRunLoop: \(sequence).next() was called while another call was still waiting; "
    + "a sequence has a single consumer."
}

/// Suspends the consumer until something resumes it: `register` runs synchronously with the
/// continuation and stores it (under the sequence's lock) or answers false to be resumed at once
/// (the state changed since the consumer looked). `onCancel` runs if the task is cancelled (at once
/// if it already is) and must end the wait. Runs in `actor`'s isolation, so it never leaves the
/// caller's executor (the call still costs the runtime one executor switch check). Neither
/// closure escapes, so a wait allocates nothing on the heap.
///
/// An `isolated` parameter, not `nonisolated(nonsending)`: the operation closure handed to
/// `withTaskCancellationHandler` is then isolated to `actor` too. Formed in a
/// `nonisolated(nonsending)` function, it is not (Swift 6.3), and an actor's consumer resumed in
/// three of its loop's jobs per suspension instead of two.
@usableFromInline
func waitForConsumerWake(
  isolation actor: isolated (any Actor)?,
  register: (UnsafeContinuation<Void, Never>) -> Bool,
  onCancel: @Sendable () -> Void
) async {
  await withTaskCancellationHandler {
    await withUnsafeContinuation(isolation: actor) { (continuation: UnsafeContinuation<Void, Never>) in
      if !register(continuation) { continuation.resume() }
    }
  } onCancel: {
    onCancel()
  }
}
