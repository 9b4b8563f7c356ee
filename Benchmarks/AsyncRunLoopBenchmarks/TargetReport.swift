/// The targets the library must reach (issue 6), checked against what was measured.
enum TargetReport {
  private enum Bound {
    case atMost(Double)
    case atLeast(Double)
  }

  private struct Target: Sendable {
    let label: String
    let bound: Bound
    /// The measured number (a ratio or an absolute value), nil when a peer did not run.
    let measure: @Sendable ([ScenarioResult]) -> Double?
  }

  private static func latency(_ results: [ScenarioResult], _ scenario: String, _ peer: String) -> LatencySummary? {
    guard case .latency(let summary, _) = results.first(where: { $0.name == scenario })?.peer(peer) else {
      return nil
    }
    return summary
  }

  private static func figure(_ results: [ScenarioResult], _ scenario: String, _ peer: String) -> Figure? {
    guard case .figure(let figure) = results.first(where: { $0.name == scenario })?.peer(peer) else { return nil }
    return figure
  }

  private static func p50Ratio(_ scenario: String, _ peer: String, _ base: String)
    -> @Sendable ([ScenarioResult]) -> Double?
  {
    { results in
      guard let top = latency(results, scenario, peer), let bottom = latency(results, scenario, base) else {
        return nil
      }
      return top.p50 / bottom.p50
    }
  }

  private static let targets: [Target] = [
    Target(
      label: "wake-rtt asyncrunloop p50 / floor-epoll p50", bound: .atMost(1.15),
      measure: p50Ratio("wake-rtt", "asyncrunloop", "floor-epoll")),
    Target(
      label: "wake-rtt asyncrunloop p99 / floor-epoll p99", bound: .atMost(1.5),
      measure: { results in
        guard let top = latency(results, "wake-rtt", "asyncrunloop"),
          let bottom = latency(results, "wake-rtt", "floor-epoll")
        else { return nil }
        return top.p99 / bottom.p99
      }),
    Target(
      label: "actor-rtt asyncrunloop p50 / floor-epoll p50", bound: .atMost(1.2),
      measure: p50Ratio("actor-rtt", "asyncrunloop", "floor-epoll")),
    Target(
      label: "stream-rtt asyncrunloop p50 / floor-epoll p50", bound: .atMost(1.3),
      measure: p50Ratio("stream-rtt", "asyncrunloop", "floor-epoll")),
    Target(
      label: "stream-rtt asyncrunloop p50 / asyncstream p50", bound: .atMost(0.6),
      measure: p50Ratio("stream-rtt", "asyncrunloop", "asyncstream")),
    Target(
      label: "stream-throughput asyncrunloop elements/s", bound: .atLeast(5_000_000),
      measure: { figure($0, "stream-throughput", "asyncrunloop")?.value }),
    Target(
      label: "stream-throughput asyncrunloop / asyncstream", bound: .atLeast(10),
      measure: { results in
        guard let top = figure(results, "stream-throughput", "asyncrunloop"),
          let bottom = figure(results, "stream-throughput", "asyncstream")
        else { return nil }
        return top.value / bottom.value
      }),
    Target(
      label: "timer-1ms-lateness asyncrunloop p50 / floor-timerfd p50", bound: .atMost(1.3),
      measure: p50Ratio("timer-1ms-lateness", "asyncrunloop", "floor-timerfd")),
    Target(
      label: "main-rtt asyncrunloop p50 / mainactor-foundation-runloop p50", bound: .atMost(0.7),
      measure: p50Ratio("main-rtt", "asyncrunloop", "mainactor-foundation-runloop")),
    Target(
      label: "idle-cpu asyncrunloop ns (2 s window)", bound: .atMost(1_000_000),
      measure: { figure($0, "idle-cpu", "asyncrunloop")?.value }),
    Target(
      label: "timers-100k asyncrunloop ns/timer", bound: .atMost(1_000),
      measure: { figure($0, "timers-100k", "asyncrunloop")?.value }),
    Target(
      label: "loops-1000 asyncrunloop total ms", bound: .atMost(1_000),
      measure: { figure($0, "loops-1000", "asyncrunloop")?.value }),
    Target(
      label: "loops-1000 leaked descriptors + threads", bound: .atMost(0),
      measure: { results in
        guard let figure = figure(results, "loops-1000", "asyncrunloop") else { return nil }
        return figure.extras.filter { $0.0.hasPrefix("leaked") }.reduce(0) { $0 + $1.1 }
      }),
  ]

  /// The targets table: measured value, bound, met or missed (n/a when a peer did not run).
  static func render(_ results: [ScenarioResult]) -> String {
    var lines = ["", "== targets"]
    for target in targets {
      let label = padRight(target.label, 62)
      guard let value = target.measure(results), !value.isNaN else {
        lines.append("   \(label) n/a (not measured)")
        continue
      }
      let met: Bool
      let bound: String
      switch target.bound {
      case .atMost(let limit):
        met = value <= limit
        bound = "≤ \(formatFigure(limit))"
      case .atLeast(let limit):
        met = value >= limit
        bound = "≥ \(formatFigure(limit))"
      }
      lines.append("   \(label) \(padLeft(formatFigure(value), 12))  \(padRight(bound, 12)) \(met ? "met" : "MISSED")")
    }
    return lines.joined(separator: "\n")
  }
}
