/// A snapshot of a loop's own metrics: counters and latency histograms that the loop's thread
/// keeps as it runs (see `RunLoopThread.metrics`). A plain value: read it on any thread, subtract
/// an earlier snapshot of the same loop to get what happened in between, print it as a table.
///
/// All durations are `CLOCK_MONOTONIC` nanoseconds (`LoopClock`).
public struct LoopMetrics: Sendable, Equatable, CustomStringConvertible {
  /// Passes of the loop (steps 2–9 of "One pass of the loop"), in every run, nested ones too.
  public var passes: UInt64 { counters[LoopMetricsStorage.Counter.passes.rawValue] }
  /// Sleeps that ended (the loop blocked in `epoll_wait` or on its futex, and woke).
  public var wakeUps: UInt64 { counters[LoopMetricsStorage.Counter.wakeUps.rawValue] }
  /// Executor jobs run (actor and task work).
  public var jobs: UInt64 { counters[LoopMetricsStorage.Counter.jobs.rawValue] }
  /// Blocks run (`perform`, `performAndWait` from other threads).
  public var performedBlocks: UInt64 { counters[LoopMetricsStorage.Counter.performedBlocks.rawValue] }
  /// Custom (signalled) sources fired: `perform` routines called.
  public var sourcesFired: UInt64 { counters[LoopMetricsStorage.Counter.sourcesFired.rawValue] }
  /// Readiness handlers called (`DescriptorSource`).
  public var readinessEvents: UInt64 { counters[LoopMetricsStorage.Counter.readinessEvents.rawValue] }
  /// Timer callouts (`LoopTimer` handlers, timer sequences, sleeps on the loop's clock).
  public var timersFired: UInt64 { counters[LoopMetricsStorage.Counter.timersFired.rawValue] }
  /// Observer callouts.
  public var observerCallouts: UInt64 { counters[LoopMetricsStorage.Counter.observerCallouts.rawValue] }

  /// From `InputSource.signal()` (the first signal since the source last fired; later ones
  /// coalesce into it) to the start of its `perform` routine.
  public var signalLatency: LoopHistogram { histograms[LoopMetricsStorage.Histogram.signalLatency.rawValue] }
  /// From a job's enqueue to its start on the loop thread.
  public var jobQueueDelay: LoopHistogram { histograms[LoopMetricsStorage.Histogram.jobQueueDelay.rawValue] }
  /// From a timer's fire date to the start of its callout (tolerance included: a timer with
  /// tolerance may fire that much late on purpose).
  public var timerLateness: LoopHistogram { histograms[LoopMetricsStorage.Histogram.timerLateness.rawValue] }
  /// The time one pass kept the thread busy: the pass's duration without its sleep.
  public var passDuration: LoopHistogram { histograms[LoopMetricsStorage.Histogram.passDuration.rawValue] }
  /// How long each callout ran (job, block, source, readiness handler, timer, observer). A
  /// callout that runs the loop nested includes the nested run.
  public var calloutDuration: LoopHistogram { histograms[LoopMetricsStorage.Histogram.calloutDuration.rawValue] }

  let counters: [UInt64]
  let histograms: [LoopHistogram]

  /// An empty snapshot (every counter 0): what a loop with metrics switched off reports.
  public init() {
    counters = Array(repeating: 0, count: LoopMetricsStorage.Counter.allCases.count)
    histograms = Array(repeating: LoopHistogram(), count: LoopMetricsStorage.Histogram.allCases.count)
  }

  init(counters: [UInt64], histograms: [LoopHistogram]) {
    self.counters = counters
    self.histograms = histograms
  }

  /// What happened between `earlier` and `later`, two snapshots of the same loop.
  public static func - (later: LoopMetrics, earlier: LoopMetrics) -> LoopMetrics {
    LoopMetrics(
      counters: zip(later.counters, earlier.counters).map { $0 &- $1 },
      histograms: zip(later.histograms, earlier.histograms).map { $0 - $1 })
  }

  /// The counters on one line, then one line per histogram.
  public var description: String {
    let counterLine =
      "passes \(passes)  wake-ups \(wakeUps)  jobs \(jobs)  blocks \(performedBlocks)  sources \(sourcesFired)  "
      + "readiness \(readinessEvents)  timers \(timersFired)  observers \(observerCallouts)"
    let rows: [(String, LoopHistogram)] = [
      ("signal → handler", signalLatency), ("job queue delay", jobQueueDelay), ("timer lateness", timerLateness),
      ("pass duration", passDuration), ("callout duration", calloutDuration),
    ]
    let header =
      pad("", 18) + pad("n", 10) + pad("mean", 10) + pad("p50", 10) + pad("p99", 10) + pad("p99.9", 10) + "max"
    var lines = [counterLine, header]
    for (name, histogram) in rows {
      let cells = [histogram.mean, histogram.quantile(0.5), histogram.quantile(0.99), histogram.quantile(0.999)]
        .map { pad($0.map(LoopHistogram.format) ?? "-", 10) }
      lines.append(
        pad(name, 18) + pad(String(histogram.count), 10) + cells.joined()
          + (histogram.maximum.map(LoopHistogram.format) ?? "-"))
    }
    return lines.joined(separator: "\n")
  }

  private func pad(_ text: String, _ width: Int) -> String {
    text.count >= width ? text + " " : text + String(repeating: " ", count: width - text.count)
  }
}
