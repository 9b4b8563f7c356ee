import Glibc

// The measuring harness of AsyncRunLoopBenchmarks (Harness.swift), repeated: warm-up, then
// interleaved repetitions (A B C …, the starting peer rotating each repetition), percentiles per
// repetition, medians over repetitions.

/// One peer of a latency scenario, opened once per scenario.
protocol LatencySession: AnyObject {
  /// Takes `count` samples (microseconds), blocking the calling thread.
  func measure(_ count: Int) -> [Double]
  func close()
}

/// One peer of a single-figure scenario (throughput).
protocol FigureSession: AnyObject {
  func measure() -> Double
  func close()
}

/// What a peer is, for the ratios of the table.
enum PeerKind: String, Sendable {
  case asyncRunLoop = "AsyncRunLoop"
  case nio = "NIO"
  case floor = "floor"
}

struct PeerSpec<Session> {
  let name: String
  let kind: PeerKind
  /// The floor whose two ends wait the way this peer's server does (nil for floors).
  let matchedFloor: String?
  /// The NIO peer this one is compared with (nil for NIO peers and floors).
  let nioPeer: String?
  let open: () -> Session
}

/// Takes `count` round trips of `roundTrip`, in microseconds; `settle` runs before each one,
/// outside the timed part.
@inline(__always)
func sampleRoundTrips(_ count: Int, settle: () -> Void = {}, _ roundTrip: () -> Void) -> [Double] {
  var samples: [Double] = []
  samples.reserveCapacity(count)
  for _ in 0..<count {
    settle()
    let start = monotonicNanoseconds()
    roundTrip()
    samples.append(microseconds(from: start, to: monotonicNanoseconds()))
  }
  return samples
}

/// The same for an awaited round trip, in the caller's isolation.
@inline(__always)
func sampleRoundTrips(
  _ count: Int, isolation: isolated (any Actor)? = #isolation, _ roundTrip: () async -> Void
) async -> [Double] {
  var samples: [Double] = []
  samples.reserveCapacity(count)
  for _ in 0..<count {
    let start = monotonicNanoseconds()
    await roundTrip()
    samples.append(microseconds(from: start, to: monotonicNanoseconds()))
  }
  return samples
}

struct LatencySummary: Sendable {
  var p50: Double
  var p90: Double
  var p99: Double

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
  }

  /// The median of each percentile over repetitions.
  init(medianOf repetitions: [LatencySummary]) {
    p50 = median(repetitions.map(\.p50))
    p90 = median(repetitions.map(\.p90))
    p99 = median(repetitions.map(\.p99))
  }
}

func median(_ values: [Double]) -> Double {
  guard !values.isEmpty else { return .nan }
  let sorted = values.sorted()
  let middle = sorted.count / 2
  return sorted.count % 2 == 1 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2
}

/// One peer's result: p50/p90/p99 (latency, µs) or the value in p50 (throughput, items/s).
struct PeerResult {
  let name: String
  let kind: PeerKind
  let matchedFloor: String?
  let nioPeer: String?
  let summary: LatencySummary
}

struct ScenarioResult {
  let name: String
  /// "us" or "items/s".
  let unit: String
  let notes: [String]
  let peers: [PeerResult]

  func p50(_ peer: String?) -> Double? {
    guard let peer else { return nil }
    return peers.first { $0.name == peer }?.summary.p50
  }
}

/// Runs a latency scenario: opens every peer, warms each up, then `repetitions` interleaved
/// batches of `samples` from each (the first peer of a repetition rotating).
func runLatencyScenario(
  _ name: String, notes: [String], peers: [PeerSpec<any LatencySession>], mode: RunMode
) -> ScenarioResult {
  progress("\(name): opening \(peers.count) peers")
  let sessions = peers.map { $0.open() }
  for (index, session) in sessions.enumerated() {
    progress("\(name): warm-up \(peers[index].name)")
    _ = session.measure(mode.latencyWarmUp)
  }
  var perRepetition = [[LatencySummary]](repeating: [], count: peers.count)
  for repetition in 0..<mode.repetitions {
    for offset in 0..<sessions.count {
      let index = (offset + repetition) % sessions.count
      perRepetition[index].append(LatencySummary(samples: sessions[index].measure(mode.latencySamples)))
    }
    progress("\(name): repetition \(repetition + 1)/\(mode.repetitions) done")
  }
  for session in sessions { session.close() }
  let results = peers.enumerated().map { index, spec in
    PeerResult(
      name: spec.name, kind: spec.kind, matchedFloor: spec.matchedFloor, nioPeer: spec.nioPeer,
      summary: LatencySummary(medianOf: perRepetition[index]))
  }
  return ScenarioResult(name: name, unit: "us", notes: notes, peers: results)
}

/// Runs a single-figure scenario: one warm-up run per peer, then `repetitions` interleaved runs;
/// the value is the median (reported in p50; p90/p99 hold the lowest and highest run).
func runFigureScenario(
  _ name: String, unit: String, notes: [String], peers: [PeerSpec<any FigureSession>], mode: RunMode
) -> ScenarioResult {
  progress("\(name): opening \(peers.count) peers")
  let sessions = peers.map { $0.open() }
  for (index, session) in sessions.enumerated() {
    progress("\(name): warm-up \(peers[index].name)")
    _ = session.measure()
  }
  var values = [[Double]](repeating: [], count: peers.count)
  for repetition in 0..<mode.repetitions {
    for offset in 0..<sessions.count {
      let index = (offset + repetition) % sessions.count
      values[index].append(sessions[index].measure())
    }
    progress("\(name): repetition \(repetition + 1)/\(mode.repetitions) done")
  }
  for session in sessions { session.close() }
  let results = peers.enumerated().map { index, spec in
    var summary = LatencySummary(samples: [])
    summary.p50 = median(values[index])
    summary.p90 = values[index].min() ?? .nan
    summary.p99 = values[index].max() ?? .nan
    return PeerResult(
      name: spec.name, kind: spec.kind, matchedFloor: spec.matchedFloor, nioPeer: spec.nioPeer, summary: summary)
  }
  return ScenarioResult(name: name, unit: unit, notes: notes, peers: results)
}

func progress(_ message: String) {
  writeStandardError("  [\(elapsedSeconds())] \(message)\n")
}

private let processStart = monotonicNanoseconds()

func elapsedSeconds() -> String {
  let tenths = (monotonicNanoseconds() - processStart) / 100_000_000
  return "\(tenths / 10).\(tenths % 10)s"
}
