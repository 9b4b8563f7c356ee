/// A loop's own view of itself: metrics and the stall watchdog (see "Diagnostics" in the DocC
/// catalog).
extension RunLoopThread {
  /// A snapshot of the loop's metrics: counters and latency histograms its thread keeps as it
  /// runs while metrics are on (`setMetricsEnabled(_:)`; on from the start). Any thread; never
  /// waits for the loop (a stuck loop's metrics can be read). Empty if metrics were never on.
  ///
  /// Subtract an earlier snapshot (`now - before`) to see what happened in between; print one
  /// (`description`) for a table.
  public var metrics: LoopMetrics {
    shared.observation.metrics.snapshot()
  }

  /// Switches the loop's metrics on or off (new loops start with them on: the benchmark holds
  /// them within 3% of a wake-up's and an actor hop's round trip). Counts kept while off
  /// stay, and counting resumes from them when switched on again. Any thread: on the loop's thread
  /// at once, from another thread on the loop's next pass (send a `performAndWait` after it to
  /// wait for that).
  public func setMetricsEnabled(_ enabled: Bool) {
    shared.onLoopThread { core in core.monitor.setMetrics(enabled: enabled) }
  }

  /// Starts watching the loop for stalls: a unit of work on its thread (a job, a performed block,
  /// a source or readiness handler, a timer or observer callout) that runs longer than
  /// `threshold` is reported while it is still running, by a watcher thread that needs no help
  /// from the loop's thread, and again when it ends, with its duration (see `StallReport`).
  ///
  /// One watch per loop: a new one replaces the previous one (whose `reports` end). Any thread: on
  /// the loop's thread it applies at once, from another thread on the loop's next pass (send a
  /// `performAndWait` after it to wait for that).
  ///
  /// The watch ends with its loop: when the loop terminates (after `shutdown()`, or when its
  /// owner drops it, once its drain has made its last callout; a current loop also when its jobs
  /// leave its thread at shutdown), `reports` ends after every report already made, and the
  /// handler is not called again. A watch made on a loop that has ended comes back finished.
  ///
  /// Cost: while no watch is on, none beyond the one flag test per callout that metrics share.
  /// While one is on, each callout takes two clock reads and two short critical sections, and one
  /// process-wide watcher thread wakes at most once per `threshold` per watched loop.
  /// - Parameters:
  ///   - threshold: How long one callout may run before it is reported (at least 1 ns).
  ///   - bufferSize: How many reports `StallWatch.reports` buffers for a slow consumer; the rest
  ///     are counted in `StallWatch.droppedReports`.
  ///   - handler: Called with every report, synchronously: `.stillRunning` reports on the watcher
  ///     thread, `.ended` ones on the loop's thread (or the watcher's, right after its
  ///     `.stillRunning` report). It must return quickly and never wait for the loop.
  /// - Returns: The watch: its reports as an `AsyncSequence`, its drop count, and `cancel()`.
  @discardableResult
  public func watchStalls(
    threshold: Duration, bufferSize: Int = 64, handler: (@Sendable (StallReport) -> Void)? = nil
  ) -> StallWatch {
    let observation = shared.observation
    let watch = StallWatch(loopName: name, threshold: threshold, bufferSize: bufferSize, handler: handler) {
      [weak observation, weak shared] watch in
      // (The watcher stops looking at the loop on its next look, which finds no watch.)
      guard let observation, observation.removeWatch(watch) else { return }
      StallWatcher.shared.lookAgain()
      shared?.onLoopThread { core in core.monitor.removeWatch(watch) }
    }
    let (installed, replaced) = observation.replaceWatch(with: watch)
    replaced?.finish()
    guard installed else {  // the loop has ended: the watch comes back finished
      watch.finish()
      return watch
    }
    // After the install: the watcher drops a loop only when it finds no watch on it.
    StallWatcher.shared.add(observation)
    if !shared.onLoopThread({ core in core.monitor.setWatch(watch) }) { watch.cancel() }  // terminated
    return watch
  }
}
