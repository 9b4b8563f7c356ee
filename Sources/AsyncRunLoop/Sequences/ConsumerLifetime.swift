/// A sequence whose single consumer can stop: the task was cancelled, or the iterator was dropped
/// (`break` out of `for await`).
protocol StoppableConsumption: AnyObject, Sendable {
  /// The consumer is gone: end the sequence and release what it holds. Any thread; idempotent.
  func stopConsuming()
}

/// Held by an iterator: when the iterator is dropped (the `for await` loop ended by `break`,
/// `return`, a throw, or the iterator went out of scope) its deinit stops the consumption, as
/// `AsyncStream`'s iterator does. Not shared between tasks: an iterator is not `Sendable`.
final class ConsumerLifetime<Storage: StoppableConsumption> {
  let storage: Storage

  init(_ storage: Storage) { self.storage = storage }

  deinit { storage.stopConsuming() }
}

/// The message every sequence traps with when a second iterator is made.
func singleConsumerViolation(_ sequence: String) -> String {
  "AsyncRunLoop: a \(sequence) has a single consumer; makeAsyncIterator() was called a second time. "
    + "Iterate it from one task only (fan out from that task if several need the elements)."
}

/// The message every sequence traps with when `next()` is called while a previous call is waiting.
func concurrentNextViolation(_ sequence: String) -> String {
  "AsyncRunLoop: \(sequence).next() was called while another call was still waiting; "
    + "a sequence has a single consumer."
}
