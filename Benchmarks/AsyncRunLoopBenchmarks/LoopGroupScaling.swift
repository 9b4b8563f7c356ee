import AsyncRunLoop
import Synchronization

// loop-group-scaling (issue 26): a `LoopGroup` of N loops (pinned to the allowed CPUs) with M
// actors pinned to each loop; every actor is driven by a task of its own on the default executor
// that calls it in a loop (one message = one call into the actor and back). Throughput (messages
// per second, all actors together) and the p99 of one message as N goes from 1 to the number of
// CPUs, and the scaling efficiency throughput(N) / (N × throughput(1)).
//
// The drivers run on Swift's global pool, which shares the CPUs with the loops: on a machine with
// few cores the pool's threads compete with the loops, and the efficiency says so.

/// An actor of the group: `pong()` touches its state.
actor GroupMember: LoopActor {
  nonisolated let loop: RunLoopThread
  private var calls = 0

  init(loop: RunLoopThread) { self.loop = loop }

  func pong() -> Int {
    calls &+= 1
    return calls
  }
}

/// One N of loop-group-scaling: a fresh group of `loops` loops per measurement.
final class LoopGroupScalingSession: FigureSession {
  /// Actors per loop.
  static let actorsPerLoop = 4
  private let loops: Int
  private let messagesPerActor: Int

  init(loops: Int, messagesPerActor: Int) {
    self.loops = loops
    self.messagesPerActor = messagesPerActor
  }

  func measure() -> Figure {
    let group = try! LoopGroup(count: loops, name: "group", pinToCPUs: true)
    defer { group.shutdownAndWait() }
    let members = (0..<(loops * Self.actorsPerLoop)).map { _ in GroupMember(loop: group.next()) }
    let count = messagesPerActor
    let start = monotonicNanoseconds()
    let latencies: [[Double]] = blockingAwait {
      await withTaskGroup(of: [Double].self) { tasks in
        for member in members {
          tasks.addTask {
            var samples: [Double] = []
            samples.reserveCapacity(count)
            var total = 0
            for _ in 0..<count {
              let sent = monotonicNanoseconds()
              total &+= await member.pong()
              samples.append(Double(monotonicNanoseconds() - sent))
            }
            return withExtendedLifetime(total) { samples }
          }
        }
        var all: [[Double]] = []
        for await samples in tasks { all.append(samples) }
        return all
      }
    }
    let seconds = Double(monotonicNanoseconds() - start) / 1e9
    let samples = latencies.flatMap { $0 }.sorted()
    let p99 = samples.isEmpty ? Double.nan : samples[min(samples.count - 1, Int(Double(samples.count) * 0.99))]
    let p50 = samples.isEmpty ? Double.nan : samples[samples.count / 2]
    return Figure(
      value: Double(samples.count) / seconds,
      extras: [
        ("p50_ns", p50), ("p99_ns", p99), ("loops", Double(loops)), ("actors", Double(members.count)),
      ])
  }

  func close() {}
}

enum LoopGroupScenarios {
  /// The loop counts measured: 1, 2, 4, … up to the CPUs, and the CPU count itself.
  static func loopCounts(cpus: Int) -> [Int] {
    var counts: [Int] = []
    var count = 1
    while count < cpus {
      counts.append(count)
      count *= 2
    }
    counts.append(max(1, cpus))
    return counts
  }

  static func scaling(_ context: BenchmarkContext) -> ScenarioResult {
    let messages: Int
    switch context.mode {
    case .smoke: messages = 500
    case .quick: messages = 5_000
    case .full: messages = 20_000
    }
    let counts = loopCounts(cpus: onlineCPUs)
    let result = runFigureScenario(
      "loop-group-scaling", unit: "ops/s",
      notes: [
        "N loops (LoopGroup, pinned to the allowed CPUs) × \(LoopGroupScalingSession.actorsPerLoop) pinned actors;"
          + " each actor driven by its own task on the default executor, \(messages) calls each;"
          + " messages/s over all actors, p50_ns/p99_ns of one call",
        "efficiency = throughput(N) / (N × throughput(1)); the drivers (global pool) share the CPUs with the loops",
      ],
      peers: counts.map { loops in
        PeerSpec(
          name: "loops-\(loops)",
          open: { LoopGroupScalingSession(loops: loops, messagesPerActor: messages) })
      },
      warmUp: context.mode != .smoke, repetitions: context.mode.figureRepetitions)
    return withEfficiency(result)
  }

  /// Adds each peer's scaling efficiency (an extra) and a note listing them.
  static func withEfficiency(_ result: ScenarioResult) -> ScenarioResult {
    func figure(_ peer: PeerResult) -> Figure? {
      if case .figure(let figure) = peer.outcome { return figure }
      return nil
    }
    func loops(_ figure: Figure) -> Double? { figure.extras.first { $0.0 == "loops" }?.1 }
    guard let base = result.peers.compactMap(figure).first(where: { loops($0) == 1 }) else { return result }
    var lines: [String] = []
    let peers = result.peers.map { peer -> PeerResult in
      guard var figure = figure(peer), let n = loops(figure) else { return peer }
      let efficiency = figure.value / (n * base.value)
      figure.extras.append(("efficiency", efficiency))
      lines.append("N=\(Int(n)): \(formatFixed(efficiency, decimals: 2))")
      return PeerResult(name: peer.name, outcome: .figure(figure))
    }
    let note = "scaling efficiency: " + lines.joined(separator: ", ")
    print("loop-group-scaling \(note)")
    return ScenarioResult(
      name: result.name, unit: result.unit, floor: result.floor, peers: peers, notes: result.notes + [note])
  }
}
