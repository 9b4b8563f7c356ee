import Synchronization

/// A running stall watch on one loop (see `RunLoopThread.watchStalls(threshold:bufferSize:handler:)`):
/// its reports, as an `AsyncSequence` and through the handler it was made with, and how many
/// reports the sequence's buffer had to drop. Any thread.
public final class StallWatch: Sendable {
  /// The reports, in the order they were made (see `StallReport`). Buffered up to the watch's
  /// `bufferSize`; a report that arrives while the buffer is full is dropped and counted in
  /// `droppedReports` (the handler saw it all the same). Ends when the watch is cancelled, when
  /// it is replaced by another watch on the same loop, or when the loop ends (see
  /// `RunLoopThread.watchStalls(threshold:bufferSize:handler:)`): then after every report made
  /// before, the `.ended` report of a callout that was reported still running included. One
  /// consumer.
  public let reports: AsyncStream<StallReport>
  /// How long one callout may run before it is reported.
  public let threshold: Duration

  let thresholdNanoseconds: Int64
  let loopName: String
  private let continuation: AsyncStream<StallReport>.Continuation
  private let handler: (@Sendable (StallReport) -> Void)?
  /// Reports `reports` could not buffer. Relaxed: a count, read on its own.
  private let dropped = Atomic<Int>(0)
  /// Takes the watch off its loop (holds the loop's half weakly).
  private let detach: @Sendable (StallWatch) -> Void

  init(
    loopName: String, threshold: Duration, bufferSize: Int, handler: (@Sendable (StallReport) -> Void)?,
    detach: @escaping @Sendable (StallWatch) -> Void
  ) {
    self.detach = detach
    self.loopName = loopName
    self.threshold = threshold
    thresholdNanoseconds = max(1, threshold.saturatedNanoseconds)
    self.handler = handler
    (reports, continuation) = AsyncStream.makeStream(
      of: StallReport.self, bufferingPolicy: .bufferingOldest(max(1, bufferSize)))
  }

  /// How many reports the `reports` buffer dropped because it was full (the oldest are kept; gaps
  /// in `StallReport.calloutNumber` show where). Any thread; still readable after the watch ended.
  public var droppedReports: Int { dropped.load(ordering: .relaxed) }

  /// Stops the watch: no report is made after the loop's thread has seen this (a callout running
  /// on it then may still end with a report), and `reports` ends. Any thread; idempotent.
  public func cancel() {
    detach(self)
    finish()
  }

  /// Delivers a report: to the sequence first (so a handler that sees it knows the sequence holds
  /// it, or counted it as dropped), then to the handler, on the calling thread.
  func deliver(_ report: StallReport) {
    if case .dropped = continuation.yield(report) { dropped.add(1, ordering: .relaxed) }
    handler?(report)
  }

  /// Ends `reports` (the watch was cancelled or replaced, or its loop ended). Any thread;
  /// idempotent.
  func finish() {
    continuation.finish()
  }
}
