import Glibc

/// `--plot`: one latency CDF per latency scenario, every peer on the same chart, as hand-written
/// SVG. The x axis is logarithmic (µs), the y axis the fraction of samples at or below x.
enum CDFPlot {
  private static let panelWidth = 560.0
  private static let panelHeight = 330.0
  private static let margin = (left: 56.0, right: 16.0, top: 34.0, bottom: 44.0)
  private static let columns = 2
  private static let palette = [
    "#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
  ]
  /// At most this many points per curve (quantiles of the samples).
  private static let pointsPerCurve = 400

  static func render(_ results: [ScenarioResult], mode: RunMode, pin: String) -> String {
    let panels = results.filter { result in
      result.peers.contains { if case .latency = $0.outcome { return true } else { return false } }
    }
    let rows = max(1, (panels.count + columns - 1) / columns)
    let width = panelWidth * Double(columns)
    let height = panelHeight * Double(rows) + 30
    var svg = [
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"\(Int(width))\" height=\"\(Int(height))\" "
        + "font-family=\"sans-serif\" font-size=\"11\">",
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>",
      "<text x=\"10\" y=\"20\" font-size=\"14\">AsyncRunLoop benchmarks — latency CDFs "
        + "(mode \(mode.rawValue), pin \(pin))</text>",
    ]
    for (index, result) in panels.enumerated() {
      let x = Double(index % columns) * panelWidth
      let y = 30 + Double(index / columns) * panelHeight
      svg.append(panel(result, x: x, y: y))
    }
    svg.append("</svg>")
    return svg.joined(separator: "\n") + "\n"
  }

  private static func panel(_ result: ScenarioResult, x: Double, y: Double) -> String {
    let curves: [(name: String, samples: [Double])] = result.peers.compactMap { peer in
      guard case .latency(_, let samples) = peer.outcome, !samples.isEmpty else { return nil }
      return (peer.name, samples.sorted())
    }
    let plotLeft = x + margin.left
    let plotTop = y + margin.top
    let plotWidth = panelWidth - margin.left - margin.right
    let plotHeight = panelHeight - margin.top - margin.bottom
    // Log-scale x range from the lowest 0.1th to the highest 99.9th percentile of the curves
    // (at least 0.1 µs), widened to decades; rarer outliers are drawn at the edges.
    func quantile(_ sorted: [Double], _ fraction: Double) -> Double {
      sorted[min(sorted.count - 1, Int(Double(sorted.count) * fraction))]
    }
    let lows = curves.map { max(quantile($0.samples, 0.001), 0.1) }
    let highs = curves.map { max(quantile($0.samples, 0.999), 0.1) }
    let low = floor(log10(lows.min() ?? 1))
    let high = max(low + 1, ceil(log10(highs.max() ?? 10)))
    func px(_ value: Double) -> Double {
      let position = (log10(max(value, 0.1)) - low) / (high - low)
      return plotLeft + min(1, max(0, position)) * plotWidth
    }
    func py(_ fraction: Double) -> Double { plotTop + (1 - fraction) * plotHeight }
    var parts = [
      "<g>",
      "<text x=\"\(fmt(plotLeft))\" y=\"\(fmt(y + 20))\" font-size=\"13\" font-weight=\"bold\">"
        + "\(escape(result.name))</text>",
      "<rect x=\"\(fmt(plotLeft))\" y=\"\(fmt(plotTop))\" width=\"\(fmt(plotWidth))\" "
        + "height=\"\(fmt(plotHeight))\" fill=\"none\" stroke=\"#999\"/>",
    ]
    // Grid: decades on x (with 2× and 5× ticks), tenths on y.
    var decade = low
    while decade <= high {
      let value = pow(10, decade)
      for multiple in [1.0, 2.0, 5.0] where decade + log10(multiple) <= high {
        let gx = px(value * multiple)
        let major = multiple == 1
        parts.append(
          "<line x1=\"\(fmt(gx))\" y1=\"\(fmt(plotTop))\" x2=\"\(fmt(gx))\" y2=\"\(fmt(plotTop + plotHeight))\" "
            + "stroke=\"\(major ? "#ccc" : "#eee")\"/>")
        parts.append(
          "<text x=\"\(fmt(gx))\" y=\"\(fmt(plotTop + plotHeight + 14))\" text-anchor=\"middle\" "
            + "fill=\"\(major ? "#333" : "#888")\">\(axisLabel(value * multiple))</text>")
      }
      decade += 1
    }
    for tenth in 0...10 {
      let gy = py(Double(tenth) / 10)
      parts.append(
        "<line x1=\"\(fmt(plotLeft))\" y1=\"\(fmt(gy))\" x2=\"\(fmt(plotLeft + plotWidth))\" y2=\"\(fmt(gy))\" "
          + "stroke=\"#eee\"/>")
      if tenth % 2 == 0 {
        parts.append(
          "<text x=\"\(fmt(plotLeft - 6))\" y=\"\(fmt(gy + 4))\" text-anchor=\"end\">"
            + "\(formatFixed(Double(tenth) / 10, decimals: 1))</text>")
      }
    }
    parts.append(
      "<text x=\"\(fmt(plotLeft + plotWidth / 2))\" y=\"\(fmt(plotTop + plotHeight + 32))\" "
        + "text-anchor=\"middle\">µs (log scale; p0.1–p99.9 shown, outliers at the edges)</text>")
    for (index, curve) in curves.enumerated() {
      let color = palette[index % palette.count]
      var points: [String] = []
      let count = curve.samples.count
      let step = max(1, count / pointsPerCurve)
      var rank = 0
      while rank < count {
        points.append("\(fmt(px(curve.samples[rank]))),\(fmt(py(Double(rank + 1) / Double(count))))")
        rank += step
      }
      points.append("\(fmt(px(curve.samples[count - 1]))),\(fmt(py(1)))")
      parts.append(
        "<polyline fill=\"none\" stroke=\"\(color)\" stroke-width=\"1.6\" points=\"\(points.joined(separator: " "))\"/>"
      )
      let legendY = plotTop + 14 + Double(index) * 14
      parts.append(
        "<line x1=\"\(fmt(plotLeft + plotWidth - 170))\" y1=\"\(fmt(legendY - 4))\" "
          + "x2=\"\(fmt(plotLeft + plotWidth - 150))\" y2=\"\(fmt(legendY - 4))\" stroke=\"\(color)\" "
          + "stroke-width=\"2\"/>")
      parts.append(
        "<text x=\"\(fmt(plotLeft + plotWidth - 145))\" y=\"\(fmt(legendY))\">\(escape(curve.name))</text>")
    }
    parts.append("</g>")
    return parts.joined(separator: "\n")
  }

  private static func axisLabel(_ value: Double) -> String {
    value >= 1 ? formatFigure(value.rounded()) : formatFixed(value, decimals: 1)
  }

  private static func fmt(_ value: Double) -> String { formatFixed(value, decimals: 1) }

  private static func escape(_ text: String) -> String {
    text.replacingAll("&", "&amp;").replacingAll("<", "&lt;").replacingAll(">", "&gt;")
  }
}

extension String {
  /// Replaces every occurrence of `target` (without Foundation).
  func replacingAll(_ target: String, _ replacement: String) -> String {
    split(separator: target, omittingEmptySubsequences: false).joined(separator: replacement)
  }
}
