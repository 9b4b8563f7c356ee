import AsyncRunLoop

// metrics-overhead-wake / metrics-overhead-actor: the wake-rtt and actor-rtt AsyncRunLoop peers
// measured with the loops' own metrics on and off (and, for wake-rtt, with a stall watch on too),
// interleaved in the same run like any other peers, so the difference is the cost of the metrics
// (issue 27: within 3% of off). The notes print each loop's own view (its metrics over the warm-up
// and every repetition) next to the external timing of the table.

/// What the loops saw, collected as the sessions close, for the scenario's notes.
final class LoopViews {
  var lines: [String] = []
}

/// An AsyncRunLoop latency session with its loops' metrics switched on or off, and optionally a
/// stall watch on each loop.
final class MetricsVariant: LatencySession {
  private let name: String
  private let inner: any LatencySession
  private let loops: [RunLoopThread]
  private let watches: [StallWatch]
  private let views: LoopViews
  private let before: [LoopMetrics]

  init(name: String, inner: any LatencySession, loops: [RunLoopThread], metrics: Bool, watchdog: Bool, views: LoopViews)
  {
    self.name = name
    self.inner = inner
    self.loops = loops
    self.views = views
    for loop in loops {
      loop.setMetricsEnabled(metrics)
      try? loop.performAndWait {}  // switched before the first sample
    }
    watches = watchdog ? loops.map { $0.watchStalls(threshold: .milliseconds(100)) } : []
    before = loops.map(\.metrics)
  }

  func measure(_ count: Int) -> [Double] { inner.measure(count) }

  func close() {
    for (loop, earlier) in zip(loops, before) {
      let delta = loop.metrics - earlier
      guard delta.passes > 0 else {
        views.lines.append("\(name), loop '\(loop.name)': metrics off")
        continue
      }
      var line = "\(name), loop '\(loop.name)' (its own view): passes \(delta.passes), wake-ups \(delta.wakeUps)"
      if delta.signalLatency.count > 0 { line += "; signal→handler \(summary(delta.signalLatency))" }
      if delta.jobQueueDelay.count > 0 { line += "; job queue delay \(summary(delta.jobQueueDelay))" }
      line += "; pass busy \(summary(delta.passDuration))"
      views.lines.append(line)
    }
    for watch in watches {
      if watch.droppedReports > 0 { views.lines.append("\(name): \(watch.droppedReports) stall reports dropped") }
      watch.cancel()
    }
    inner.close()
  }

  private func summary(_ histogram: LoopHistogram) -> String {
    let p50 = histogram.quantile(0.5).map { "\($0.microseconds)" } ?? "-"
    let p99 = histogram.quantile(0.99).map { "\($0.microseconds)" } ?? "-"
    return "p50 \(p50) µs, p99 \(p99) µs"
  }
}

extension Duration {
  /// Microseconds with one decimal, for the notes.
  fileprivate var microseconds: String {
    let tenths = (components.seconds * 10_000_000 + components.attoseconds / 100_000_000_000)
    return "\(tenths / 10).\(tenths % 10)"
  }
}

enum MetricsScenarios {
  static func wake(_ context: BenchmarkContext) -> ScenarioResult {
    let pin = context.pin
    let views = LoopViews()
    func variant(_ name: String, metrics: Bool, watchdog: Bool) -> PeerSpec<any LatencySession> {
      PeerSpec(
        name: name,
        open: {
          let session = AsyncRunLoopWake(pin: pin)
          return MetricsVariant(
            name: name, inner: session, loops: [session.loop], metrics: metrics, watchdog: watchdog, views: views)
        })
    }
    let result = runLatencyScenario(
      "metrics-overhead-wake", floor: "metrics-off",
      notes: ["wake-rtt's asyncrunloop peer with the loop's metrics off, on, and on with a stall watch (100 ms)"],
      peers: [
        variant("metrics-off", metrics: false, watchdog: false),
        variant("metrics-on", metrics: true, watchdog: false),
        variant("metrics+watchdog", metrics: true, watchdog: true),
      ],
      mode: context.mode)
    return ScenarioResult(
      name: result.name, unit: result.unit, floor: result.floor, peers: result.peers, notes: result.notes + views.lines)
  }

  static func actor(_ context: BenchmarkContext) -> ScenarioResult {
    let pin = context.pin
    let views = LoopViews()
    func variant(_ name: String, metrics: Bool) -> PeerSpec<any LatencySession> {
      PeerSpec(
        name: name,
        open: {
          let session = AsyncRunLoopActorRTT(pin: pin)
          return MetricsVariant(
            name: name, inner: session, loops: [session.loopA, session.loopB], metrics: metrics, watchdog: false,
            views: views)
        })
    }
    let result = runLatencyScenario(
      "metrics-overhead-actor", floor: "metrics-off",
      notes: ["actor-rtt's asyncrunloop peer with both loops' metrics off and on"],
      peers: [variant("metrics-off", metrics: false), variant("metrics-on", metrics: true)],
      mode: context.mode)
    return ScenarioResult(
      name: result.name, unit: result.unit, floor: result.floor, peers: result.peers, notes: result.notes + views.lines)
  }
}
