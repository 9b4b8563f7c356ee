/// A sequence fed by a custom input source (`SourceSequence`, `SignalSequence`), whose end passes
/// through the loop: `invalidate()` closes the machine (producers are refused) and invalidates
/// the source; the source's cancel routine, on the loop thread once the loop has let go of it,
/// ends the machine, and the consumer drains what was accepted. Made and ended here, once.
@usableFromInline
protocol InputSourceSequence: SingleConsumerStorage where Machine: ClosableStateMachine {
  /// The loop the source is scheduled on.
  var loop: RunLoopThread { get }
  /// The custom source (made by `makeSource`).
  var source: InputSource { get }
  /// The source's perform routine (loop thread): what producers handed in becomes available to
  /// the consumer.
  func release()
}

/// The state machine of an `InputSourceSequence`: it can be closed before its member ends.
@usableFromInline
protocol ClosableStateMachine: SingleConsumerStateMachine {
  /// `close()` took effect: producers are refused from now on; returns those still waiting.
  mutating func stopAccepting() -> Leftovers
}

extension ClosableStateMachine {
  /// `invalidate()`: refuse producers; what was accepted is still delivered after the loop's
  /// detach. Returns what to release (waiting producers), or nil when ending already.
  mutating func close() -> Leftovers? {
    guard lifecycle.close() else { return nil }  // ending already
    return stopAccepting()  // the loop's detach hands over the rest
  }
}

extension InputSourceSequence {
  /// The custom source that feeds the sequence `owner` will point to: its perform routine
  /// releases what was produced, its cancel routine ends the sequence, then calls `onCancel`.
  /// `@inlinable`: for a generic sequence the routines are made (and specialized) in the client.
  @inlinable
  static func makeSource(
    owner: WeakOwner<Self>, order: Int, onSchedule: (@Sendable (RunLoopThread, RunLoopMode) -> Void)?,
    onCancel: (@Sendable (RunLoopThread) -> Void)?
  ) -> InputSource {
    var schedule: (@Sendable (InputSource, RunLoopThread, RunLoopMode) -> Void)?
    if let onSchedule { schedule = { _, loop, mode in onSchedule(loop, mode) } }
    return InputSource(
      order: order, schedule: schedule,
      cancel: { _, loop in
        owner.value?.memberEnded()  // release what was accepted; the consumer drains and ends
        onCancel?(loop)
      },
      perform: { _ in owner.value?.release() })
  }

  /// Ends the sequence after what was accepted is delivered (`invalidate()`). Any thread;
  /// idempotent.
  func closeThroughLoop() {
    lock.lock()
    let leftovers = machine.close()
    lock.unlock()
    guard let leftovers else { return }  // ending already
    dispose(leftovers)  // producers still waiting learn that their element was not taken
    source.invalidate()
    // A source that never reached its loop (its add is still queued, or the loop is gone) gets no
    // cancel routine: end the consumer after whatever is queued for the loop.
    if !loop.onLoopThread({ [self] in memberEnded() }) { memberEnded() }
  }

  @usableFromInline
  func detachMember() { source.invalidate() }
}
