import Glibc

// Markdown tables: one per scenario, then the issue's targets checked against this run.

func format(_ value: Double, decimals: Int = 2) -> String {
  guard value.isFinite else { return "n/a" }
  var buffer = [CChar](repeating: 0, count: 64)
  _ = withVaList([value]) { vsnprintf(&buffer, buffer.count, "%.\(decimals)f", $0) }
  return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

func formatRate(_ value: Double) -> String {
  guard value.isFinite else { return "n/a" }
  return format(value / 1e6, decimals: 2) + " M"
}

enum Report {
  static func render(_ result: ScenarioResult) -> String {
    var lines = ["### \(result.name)", ""]
    lines += result.notes.map { "- \($0)" }
    lines.append("")
    if result.unit == "us" {
      lines.append("| peer | p50 µs | p90 µs | p99 µs | p50 ÷ NIO | matched floor | p50 ÷ floor |")
      lines.append("|---|---:|---:|---:|---:|---|---:|")
      for peer in result.peers {
        let nio = result.p50(peer.nioPeer).map { format(peer.summary.p50 / $0) + "× `\(peer.nioPeer!)`" } ?? ""
        let floor = result.p50(peer.matchedFloor).map { format(peer.summary.p50 / $0) + "×" } ?? ""
        lines.append(
          "| \(peer.name) | \(format(peer.summary.p50)) | \(format(peer.summary.p90)) | \(format(peer.summary.p99))"
            + " | \(nio) | \(peer.matchedFloor ?? "") | \(floor) |")
      }
    } else {
      lines.append("| peer | items/s (median) | min | max | ÷ NIO | matched floor | ÷ floor |")
      lines.append("|---|---:|---:|---:|---:|---|---:|")
      for peer in result.peers {
        let nio = result.p50(peer.nioPeer).map { format(peer.summary.p50 / $0) + "× `\(peer.nioPeer!)`" } ?? ""
        let floor = result.p50(peer.matchedFloor).map { format(peer.summary.p50 / $0) + "×" } ?? ""
        lines.append(
          "| \(peer.name) | \(formatRate(peer.summary.p50)) | \(formatRate(peer.summary.p90))"
            + " | \(formatRate(peer.summary.p99)) | \(nio) | \(peer.matchedFloor ?? "") | \(floor) |")
      }
    }
    lines.append("")
    return lines.joined(separator: "\n")
  }

  /// The issue's targets: (scenario, AsyncRunLoop peer, NIO peer, bound on the ratio, whether the
  /// ratio must be at most (latency) or at least (throughput) the bound).
  static let targets: [(String, String, String, Double, Bool)] = [
    ("wake-rtt-b2b", "asyncrunloop", "nio", 1.0, true),
    ("wake-rtt-b2b", "asyncrunloop-epoll", "nio", 1.0, true),
    ("stream-rtt-b2b", "asyncrunloop", "nio-execute", 1.0, true),
    ("stream-rtt-b2b", "asyncrunloop-epoll", "nio-execute", 1.0, true),
    ("thread-actor-rtt", "asyncrunloop", "nio-immediate", 1.0, true),
    ("thread-actor-rtt", "asyncrunloop-epoll", "nio-immediate", 1.0, true),
    ("thread-actor-rtt-b2b", "asyncrunloop", "nio-immediate", 1.0, true),
    ("thread-actor-rtt-b2b", "asyncrunloop-epoll", "nio-immediate", 1.0, true),
    ("actor-rtt", "asyncrunloop", "nio", 0.9, true),
    ("actor-rtt", "asyncrunloop-epoll", "nio", 0.9, true),
    ("stream-throughput", "asyncrunloop", "nio-execute", 4.0, false),
    ("stream-throughput", "asyncrunloop-epoll", "nio-execute", 4.0, false),
    ("stream-throughput", "asyncrunloop-command", "nio-execute", 4.0, false),
  ]

  static func renderTargets(_ results: [ScenarioResult]) -> String {
    var lines = [
      "### targets (p50 ratios of this run)", "",
      "| scenario | AsyncRunLoop peer | ÷ NIO peer | ratio | target | met |", "|---|---|---|---:|---:|---|",
    ]
    for (scenario, peer, nio, bound, atMost) in targets {
      guard let result = results.first(where: { $0.name == scenario }),
        let value = result.p50(peer), let reference = result.p50(nio)
      else { continue }
      let ratio = value / reference
      let met = atMost ? ratio <= bound : ratio >= bound
      lines.append(
        "| \(scenario) | \(peer) | \(nio) | \(format(ratio))× | \(atMost ? "≤" : "≥") \(format(bound, decimals: 1))×"
          + " | \(met ? "yes" : "**no**") |")
    }
    lines.append("")
    return lines.joined(separator: "\n")
  }
}
