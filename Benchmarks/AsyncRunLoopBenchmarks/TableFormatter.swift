/// Number formatting without Foundation, and the per-scenario table printed on stdout.
extension String {
  /// `value` with one decimal.
  init(format1 value: Double) { self = formatFixed(value, decimals: 1) }
}

/// `value` rounded to `decimals` places ("nan" for NaN).
func formatFixed(_ value: Double, decimals: Int) -> String {
  guard value.isFinite else { return value.isNaN ? "nan" : (value > 0 ? "inf" : "-inf") }
  var scale = 1.0
  for _ in 0..<decimals { scale *= 10 }
  let scaled = (abs(value) * scale).rounded()
  guard scaled < 9e18 else { return "\(value)" }
  let whole = Int(scaled) / Int(scale)
  let fraction = Int(scaled) % Int(scale)
  var text = (value < 0 && scaled != 0 ? "-" : "") + String(whole)
  if decimals > 0 {
    let digits = String(fraction)
    text += "." + String(repeating: "0", count: decimals - digits.count) + digits
  }
  return text
}

/// A figure with thousands separators for big values, 2 decimals for small ones.
func formatFigure(_ value: Double) -> String {
  guard value.isFinite else { return formatFixed(value, decimals: 0) }
  if abs(value) >= 1000 {
    let digits = String(Int(value.rounded()).magnitude)
    var grouped = ""
    for (index, character) in digits.enumerated() {
      if index > 0 && (digits.count - index) % 3 == 0 { grouped += "," }
      grouped.append(character)
    }
    return (value < 0 ? "-" : "") + grouped
  }
  return formatFixed(value, decimals: abs(value) >= 100 ? 1 : 2)
}

/// A latency with a precision that suits its size.
func formatMicroseconds(_ value: Double) -> String {
  formatFixed(value, decimals: abs(value) >= 1000 ? 0 : (abs(value) >= 100 ? 1 : 2))
}

func padLeft(_ text: String, _ width: Int) -> String {
  text.count >= width ? text : String(repeating: " ", count: width - text.count) + text
}

func padRight(_ text: String, _ width: Int) -> String {
  text.count >= width ? text : text + String(repeating: " ", count: width - text.count)
}

enum TableFormatter {
  /// One scenario as a text table: latency percentiles (or the figure) per peer, and each peer's
  /// p50 (or value) divided by the floor's.
  static func render(_ result: ScenarioResult) -> String {
    var lines = ["", "== \(result.name)" + (result.unit == "us" ? " (µs)" : " (\(result.unit))")]
    for note in result.notes { lines.append("   \(note)") }
    let floorValue = result.floor.flatMap { result.peer($0) }.flatMap(headline)
    let ratioTitle = result.floor.map { "p50/\($0)" } ?? ""
    if result.unit == "us" {
      lines.append(
        "   " + padRight("peer", 40) + ["p50", "p90", "p99", "max", "n"].map { padLeft($0, 10) }.joined()
          + "  " + ratioTitle)
    } else {
      lines.append("   " + padRight("peer", 40) + padLeft("value", 16) + "  " + ratioTitle)
    }
    for peer in result.peers {
      var line = "   " + padRight(peer.name, 40)
      switch peer.outcome {
      case .unavailable(let reason):
        line += reason
      case .latency(let summary, _):
        line += [summary.p50, summary.p90, summary.p99, summary.max].map { padLeft(formatMicroseconds($0), 10) }
          .joined()
        line += padLeft(String(summary.n), 10)
        if let floorValue, result.floor != peer.name {
          line += "  " + formatFixed(summary.p50 / floorValue, decimals: 2) + "×"
        }
      case .figure(let figure):
        line += padLeft(formatFigure(figure.value), 16)
        if let floorValue, result.floor != peer.name {
          line += "  " + formatFixed(figure.value / floorValue, decimals: 2) + "×"
        }
        for (key, value) in figure.extras { line += "  \(key)=\(formatFigure(value))" }
      }
      lines.append(line)
    }
    return lines.joined(separator: "\n")
  }

  /// The number ratios are taken of: p50 for latency, the value for figures.
  static func headline(_ outcome: PeerOutcome) -> Double? {
    switch outcome {
    case .latency(let summary, _): return summary.p50
    case .figure(let figure): return figure.value
    case .unavailable: return nil
    }
  }
}
