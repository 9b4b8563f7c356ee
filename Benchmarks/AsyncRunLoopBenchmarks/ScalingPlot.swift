/// `--plot`: loop-group-scaling as two line charts side by side (throughput and p99 against the
/// number of loops, with the ideal linear throughput dashed), hand-written SVG like `CDFPlot`.
/// Written next to the CDFs (`<plot>-loop-group.svg`) when the scenario ran.
enum ScalingPlot {
  private static let panelWidth = 480.0
  private static let panelHeight = 320.0
  private static let margin = (left: 70.0, right: 16.0, top: 34.0, bottom: 44.0)

  /// The path of the scaling plot for the CDF plot at `cdfPath`.
  static func path(nextTo cdfPath: String) -> String {
    let stem = cdfPath.hasSuffix(".svg") ? String(cdfPath.dropLast(4)) : cdfPath
    return stem + "-loop-group.svg"
  }

  /// nil when loop-group-scaling did not run.
  static func render(_ results: [ScenarioResult], mode: RunMode, pin: String) -> String? {
    guard let result = results.first(where: { $0.name == "loop-group-scaling" }) else { return nil }
    let points: [(n: Double, rate: Double, p99: Double)] = result.peers.compactMap { peer in
      guard case .figure(let figure) = peer.outcome, let n = figure.extras.first(where: { $0.0 == "loops" })?.1,
        let p99 = figure.extras.first(where: { $0.0 == "p99_ns" })?.1
      else { return nil }
      return (n, figure.value, p99 / 1000)
    }.sorted { $0.n < $1.n }
    guard let first = points.first else { return nil }
    let ideal = points.map { (x: $0.n, y: first.rate * $0.n) }
    var svg = [
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"\(Int(2 * panelWidth))\" height=\"\(Int(panelHeight + 30))\" "
        + "font-family=\"sans-serif\" font-size=\"11\">",
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>",
      "<text x=\"10\" y=\"20\" font-size=\"14\">loop-group-scaling — N loops × "
        + "\(LoopGroupScalingSession.actorsPerLoop) actors each (mode \(mode.rawValue), pin \(pin))</text>",
    ]
    svg.append(
      panel(
        title: "messages/s (dashed: N × throughput(1))", x: 0, y: 30,
        series: [("measured", "#d62728", false, points.map { ($0.n, $0.rate) }), ("ideal", "#999", true, ideal)]))
    svg.append(
      panel(
        title: "p99 of one message (µs)", x: panelWidth, y: 30,
        series: [("p99", "#1f77b4", false, points.map { ($0.n, $0.p99) })]))
    svg.append("</svg>")
    return svg.joined(separator: "\n") + "\n"
  }

  private static func panel(
    title: String, x: Double, y: Double,
    series: [(name: String, color: String, dashed: Bool, points: [(x: Double, y: Double)])]
  ) -> String {
    let all = series.flatMap(\.points)
    let maxX = max(1, all.map(\.x).max() ?? 1)
    let maxY = max(1e-9, all.map(\.y).filter { $0.isFinite }.max() ?? 1) * 1.1
    let left = x + margin.left
    let top = y + margin.top
    let width = panelWidth - margin.left - margin.right
    let height = panelHeight - margin.top - margin.bottom
    func px(_ value: Double) -> Double { left + (maxX == 1 ? 0.5 : (value - 1) / (maxX - 1)) * width }
    func py(_ value: Double) -> Double { top + (1 - value / maxY) * height }
    var parts = [
      "<g>",
      "<text x=\"\(fmt(left))\" y=\"\(fmt(y + 20))\" font-size=\"13\" font-weight=\"bold\">\(title)</text>",
      "<rect x=\"\(fmt(left))\" y=\"\(fmt(top))\" width=\"\(fmt(width))\" height=\"\(fmt(height))\" "
        + "fill=\"none\" stroke=\"#999\"/>",
    ]
    for tick in 0...5 {
      let value = maxY * Double(tick) / 5
      parts.append(
        "<line x1=\"\(fmt(left))\" y1=\"\(fmt(py(value)))\" x2=\"\(fmt(left + width))\" y2=\"\(fmt(py(value)))\" "
          + "stroke=\"#eee\"/>")
      parts.append(
        "<text x=\"\(fmt(left - 6))\" y=\"\(fmt(py(value) + 4))\" text-anchor=\"end\">\(formatFigure(value))</text>")
    }
    for n in Set(all.map(\.x)).sorted() {
      parts.append(
        "<text x=\"\(fmt(px(n)))\" y=\"\(fmt(top + height + 14))\" text-anchor=\"middle\">\(Int(n))</text>")
    }
    parts.append(
      "<text x=\"\(fmt(left + width / 2))\" y=\"\(fmt(top + height + 32))\" text-anchor=\"middle\">loops (N)</text>")
    for (index, line) in series.enumerated() {
      let coordinates = line.points.filter { $0.y.isFinite }.map { "\(fmt(px($0.x))),\(fmt(py($0.y)))" }
      parts.append(
        "<polyline fill=\"none\" stroke=\"\(line.color)\" stroke-width=\"1.8\""
          + (line.dashed ? " stroke-dasharray=\"5,4\"" : "") + " points=\"\(coordinates.joined(separator: " "))\"/>")
      for point in line.points where point.y.isFinite && !line.dashed {
        parts.append(
          "<circle cx=\"\(fmt(px(point.x)))\" cy=\"\(fmt(py(point.y)))\" r=\"3\" fill=\"\(line.color)\"/>")
      }
      parts.append(
        "<text x=\"\(fmt(left + 8))\" y=\"\(fmt(top + 14 + Double(index) * 14))\" fill=\"\(line.color)\">"
          + "\(line.name)</text>")
    }
    parts.append("</g>")
    return parts.joined(separator: "\n")
  }

  private static func fmt(_ value: Double) -> String { formatFixed(value, decimals: 1) }
}
