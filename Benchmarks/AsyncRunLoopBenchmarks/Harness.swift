import Glibc

// The measuring harness: warm-up, interleaved repetitions (A B A B …, the starting peer rotating
// each repetition), per-repetition percentiles, medians over repetitions.

/// One peer of a latency scenario, opened once per scenario.
protocol LatencySession: AnyObject {
  /// Called before each batch (the warm-up and every repetition), e.g. to give the main thread to
  /// the peer's run loop.
  func activate()
  /// Called after each batch.
  func deactivate()
  /// Takes `count` samples (microseconds), blocking the calling thread.
  func measure(_ count: Int) -> [Double]
  /// Stops the peer's threads and releases its resources.
  func close()
}

extension LatencySession {
  func activate() {}
  func deactivate() {}
}

/// One peer of a single-figure scenario (throughput, CPU time, cost per item).
protocol FigureSession: AnyObject {
  /// Takes one measurement.
  func measure() -> Figure
  func close()
}

/// A single figure, with optional extras reported next to it: over repetitions, the median is
/// kept for timings (keys ending in `_ns`, like the figure itself) and the maximum for counts.
struct Figure {
  var value: Double
  var extras: [(String, Double)] = []
}

/// A peer as a scenario lists it: its name, and how to open it (nil: not available in this
/// build of the library).
struct PeerSpec<Session> {
  let name: String
  let open: (() -> Session)?
  /// Why `open` is nil.
  var unavailableReason = "not available yet"
}

/// p50/p90/p99/max of samples, and how many.
struct LatencySummary: Sendable {
  var p50: Double
  var p90: Double
  var p99: Double
  var max: Double
  var n: Int

  /// Nearest-rank percentiles of one repetition.
  init(samples: [Double]) {
    let sorted = samples.sorted()
    func rank(_ fraction: Double) -> Double {
      guard !sorted.isEmpty else { return .nan }
      let index = Int((fraction * Double(sorted.count)).rounded(.up)) - 1
      return sorted[Swift.max(0, Swift.min(sorted.count - 1, index))]
    }
    p50 = rank(0.50)
    p90 = rank(0.90)
    p99 = rank(0.99)
    max = sorted.last ?? .nan
    n = sorted.count
  }

  /// The median of each percentile over repetitions; `n` is the total sample count.
  init(medianOf repetitions: [LatencySummary]) {
    p50 = median(repetitions.map(\.p50))
    p90 = median(repetitions.map(\.p90))
    p99 = median(repetitions.map(\.p99))
    max = median(repetitions.map(\.max))
    n = repetitions.reduce(0) { $0 + $1.n }
  }
}

/// The median of `values` (the mean of the middle two for an even count).
func median(_ values: [Double]) -> Double {
  guard !values.isEmpty else { return .nan }
  let sorted = values.sorted()
  let middle = sorted.count / 2
  return sorted.count % 2 == 1 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2
}

/// What one peer produced.
enum PeerOutcome {
  case latency(LatencySummary, samples: [Double])
  case figure(Figure)
  case unavailable(String)
}

struct PeerResult {
  let name: String
  let outcome: PeerOutcome
}

/// A scenario's results, in peer order.
struct ScenarioResult {
  let name: String
  /// "us" for latency scenarios, else the figure's unit ("ops/s", "ns", "ms", "count").
  let unit: String
  /// The peer other peers' p50 (or value) is divided by in the table, when there is one.
  let floor: String?
  let peers: [PeerResult]
  /// What the scenario measures, for the table.
  let notes: [String]

  func peer(_ name: String) -> PeerOutcome? { peers.first { $0.name == name }?.outcome }
}

/// Runs a latency scenario: opens every available peer, warms each up, then takes
/// `repetitions` interleaved batches of `samples` from each.
func runLatencyScenario(
  _ name: String, floor: String?, notes: [String], peers: [PeerSpec<any LatencySession>],
  samples: Int, warmUp: Int, repetitions: Int
) -> ScenarioResult {
  progress("\(name): opening \(peers.count) peers")
  var sessions: [(index: Int, session: any LatencySession)] = []
  for (index, spec) in peers.enumerated() {
    if let open = spec.open { sessions.append((index, open())) }
  }
  var perRepetition = [[LatencySummary]](repeating: [], count: peers.count)
  var allSamples = [[Double]](repeating: [], count: peers.count)
  for (index, session) in sessions {
    progress("\(name): warm-up \(peers[index].name)")
    session.activate()
    _ = session.measure(warmUp)
    session.deactivate()
  }
  for repetition in 0..<repetitions {
    for offset in 0..<sessions.count {
      let (index, session) = sessions[(offset + repetition) % sessions.count]
      session.activate()
      let batch = session.measure(samples)
      session.deactivate()
      perRepetition[index].append(LatencySummary(samples: batch))
      allSamples[index].append(contentsOf: batch)
    }
    progress("\(name): repetition \(repetition + 1)/\(repetitions) done")
  }
  for (_, session) in sessions { session.close() }
  let results = peers.enumerated().map { index, spec in
    guard spec.open != nil else { return PeerResult(name: spec.name, outcome: .unavailable(spec.unavailableReason)) }
    return PeerResult(
      name: spec.name,
      outcome: .latency(LatencySummary(medianOf: perRepetition[index]), samples: allSamples[index]))
  }
  return ScenarioResult(name: name, unit: "us", floor: floor, peers: results, notes: notes)
}

/// Runs a round-trip latency scenario with the mode's round-trip counts: `latencyWarmUp` round
/// trips of warm-up, then `repetitions` batches of `latencySamples`.
func runLatencyScenario(
  _ name: String, floor: String?, notes: [String], peers: [PeerSpec<any LatencySession>], mode: RunMode
) -> ScenarioResult {
  runLatencyScenario(
    name, floor: floor, notes: notes, peers: peers,
    samples: mode.latencySamples, warmUp: mode.latencyWarmUp, repetitions: mode.repetitions)
}

/// Runs a single-figure scenario: `repetitions` interleaved measurements of every available
/// peer; the value is the median, extras as `Figure` says (timings the median, counts the maximum).
func runFigureScenario(
  _ name: String, unit: String, floor: String? = nil, notes: [String], peers: [PeerSpec<any FigureSession>],
  warmUp: Bool, repetitions: Int
) -> ScenarioResult {
  progress("\(name): opening \(peers.count) peers")
  var sessions: [(index: Int, session: any FigureSession)] = []
  for (index, spec) in peers.enumerated() {
    if let open = spec.open { sessions.append((index, open())) }
  }
  if warmUp {
    for (index, session) in sessions {
      progress("\(name): warm-up \(peers[index].name)")
      _ = session.measure()
    }
  }
  var figures = [[Figure]](repeating: [], count: peers.count)
  for repetition in 0..<repetitions {
    for offset in 0..<sessions.count {
      let (index, session) = sessions[(offset + repetition) % sessions.count]
      figures[index].append(session.measure())
    }
    progress("\(name): repetition \(repetition + 1)/\(repetitions) done")
  }
  for (_, session) in sessions { session.close() }
  let results = peers.enumerated().map { index, spec in
    guard spec.open != nil else { return PeerResult(name: spec.name, outcome: .unavailable(spec.unavailableReason)) }
    if figures[index].allSatisfy({ $0.value.isNaN }) {
      return PeerResult(name: spec.name, outcome: .unavailable("not measured (the reason is on stderr)"))
    }
    var combined = Figure(value: median(figures[index].map(\.value).filter { !$0.isNaN }))
    for (key, _) in figures[index].first?.extras ?? [] {
      let values = figures[index].compactMap { $0.extras.first { $0.0 == key }?.1 }
      combined.extras.append((key, key.hasSuffix("_ns") ? median(values.filter { !$0.isNaN }) : values.max() ?? .nan))
    }
    return PeerResult(name: spec.name, outcome: .figure(combined))
  }
  return ScenarioResult(name: name, unit: unit, floor: floor, peers: results, notes: notes)
}

/// Progress lines go to stderr, so stdout stays the table.
func progress(_ message: String) {
  writeStandardError("  [\(elapsedSeconds())] \(message)\n")
}

private let processStart = monotonicNanoseconds()

func elapsedSeconds() -> String {
  let tenths = (monotonicNanoseconds() - processStart) / 100_000_000
  return "\(tenths / 10).\(tenths % 10)s"
}
