/// The targets the library must reach (issue 6), checked against what was measured.
enum TargetReport {
  private enum Bound {
    case atMost(Double)
    case atLeast(Double)
    /// Strictly below: "faster than a peer" is a ratio below 1.
    case below(Double)
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
    ratio(scenario, peer, base, \.p50)
  }

  /// `peer`'s `statistic` over `base`'s, in `scenario`.
  private static func ratio(
    _ scenario: String, _ peer: String, _ base: String, _ statistic: KeyPath<LatencySummary, Double> & Sendable
  ) -> @Sendable ([ScenarioResult]) -> Double? {
    { results in
      guard let top = latency(results, scenario, peer), let bottom = latency(results, scenario, base) else {
        return nil
      }
      return top[keyPath: statistic] / bottom[keyPath: statistic]
    }
  }

  /// "`ours` is faster than `peer`" at p50 (and at p99 when `alsoP99`): ratios below 1.
  private static func fasterThan(
    _ scenario: String, _ peers: [String], ours: String = "asyncrunloop", alsoP99: Bool = false
  ) -> [Target] {
    peers.flatMap { peer in
      let statistics: [(String, KeyPath<LatencySummary, Double> & Sendable)] =
        alsoP99 ? [("p50", \.p50), ("p99", \.p99)] : [("p50", \.p50)]
      return statistics.map { name, statistic in
        Target(
          label: "\(scenario) \(ours) \(name) / \(peer) \(name)", bound: .below(1),
          measure: ratio(scenario, ours, peer, statistic))
      }
    }
  }

  /// Issue 26: our peer on each path over the floor whose two ends wait the same way
  /// (`asyncrunloop` on the futex path over `floor-futex`, `asyncrunloop-epoll` over `floor-epoll`).
  private static func matchedFloorTargets(_ scenario: String, p50: Double, p99: Double? = nil) -> [Target] {
    LoopPath.allCases.flatMap { path in
      let ours = "asyncrunloop\(path.peerSuffix)"
      var targets = [
        Target(
          label: "\(scenario) \(ours) p50 / \(path.matchedFloor) p50 (\(path.rawValue) path)", bound: .atMost(p50),
          measure: p50Ratio(scenario, ours, path.matchedFloor))
      ]
      if let p99 {
        targets.append(
          Target(
            label: "\(scenario) \(ours) p99 / \(path.matchedFloor) p99 (\(path.rawValue) path)", bound: .atMost(p99),
            measure: ratio(scenario, ours, path.matchedFloor, \.p99)))
      }
      return targets
    }
  }

  // Issue 26: every latency target is against a matched floor, on both paths. Removed: "wake-rtt
  // faster than dispatch-queue" (it sat at a ratio of 0.99–1.01, a coin flip: restated as "at most
  // 1.10×") and "stream-rtt ≤ 0.6× asyncstream" (below physics: both consumers are woken the same
  // way, on the same loop; restated as "no slower than AsyncStream on the same loop", ≤ 1.05×).
  // The bounds were set from the published full run (0dffb5c) and must be confirmed by five full
  // runs on the reference machine, with the spread recorded in Benchmarks/results/.
  private static let targets: [Target] =
    matchedFloorTargets("wake-rtt", p50: 1.15, p99: 1.5)
    + fasterThan("wake-rtt", ["foundation-runloop"])
    + [
      Target(
        label: "wake-rtt asyncrunloop p50 / dispatch-queue p50 (no slower than Dispatch)", bound: .atMost(1.10),
        measure: p50Ratio("wake-rtt", "asyncrunloop", "dispatch-queue"))
    ]
    + matchedFloorTargets("actor-rtt", p50: 1.2)
    + fasterThan("actor-rtt", ["dispatch-queue-executor"])
    + [
      Target(
        label: "thread-actor-rtt asyncrunloop p50 / asyncrunloop-epoll p50 (futex path no slower; issue 26)",
        bound: .atMost(1.05), measure: p50Ratio("thread-actor-rtt", "asyncrunloop", "asyncrunloop-epoll"))
    ]
    + matchedFloorTargets("stream-rtt", p50: 1.3)
    + [
      Target(
        label: "stream-rtt asyncrunloop p50 / asyncstream p50 (same loop, same wake-up)", bound: .atMost(1.05),
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
    ]
    // Like against like: the async sequence (a task resumed per tick) against `Task.sleep`; the
    // `LoopTimer` callback against the callback timers of Dispatch and Foundation. (The sequence
    // against a callback timer also counts a task's resumption that the callback does not make.)
    + fasterThan("timer-1ms-lateness", ["task-sleep"], alsoP99: true)
    + fasterThan(
      "timer-1ms-lateness", ["dispatch-source-timer", "foundation-timer"], ours: "asyncrunloop-looptimer",
      alsoP99: true)
    + [
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
      Target(
        label: "hop-allocations asyncrunloop per round trip", bound: .atMost(0),
        measure: { figure($0, "hop-allocations", "asyncrunloop")?.value }),
    ]
    + churnTargets + fillTargets

  /// Issue 13: a loop does not get slower as it fills up. For each `fill` latency (wake-rtt,
  /// timer-lateness, signal-random, descriptor-rtt), p50 with the most idle members over p50 with 1k, and with 1k
  /// over an empty loop (the step a first thousand members may add).
  private static let fillTargets: [Target] = ["wake-rtt", "timer-lateness", "signal-random", "descriptor-rtt"].flatMap {
    latency in
    [(true, "largest n / 1k"), (false, "1k / 0")].map { (fromThousand: Bool, name: String) in
      Target(
        label: "fill \(latency) p50 \(name) idle members", bound: .atMost(1.2),
        measure: { results in
          // Peers "wake-rtt idle-1k", ..., by their count; "-again" is the drift check.
          guard let fill = results.first(where: { $0.name == "fill" }) else { return nil }
          let counts: [(n: Int, name: String)] = fill.peers.compactMap { peer in
            let prefix = "\(latency) idle-"
            guard peer.name.hasPrefix(prefix), !peer.name.hasSuffix("-again") else { return nil }
            let label = peer.name.dropFirst(prefix.count)
            let n = label.hasSuffix("k") ? Int(label.dropLast()).map { $0 * 1_000 } : Int(label)
            return n.map { ($0, peer.name) }
          }.sorted { $0.n < $1.n }
          guard let thousand = counts.first(where: { $0.n == 1_000 }), let largest = counts.last,
            largest.n > 1_000, let empty = counts.first(where: { $0.n == 0 })
          else { return nil }
          let (top, bottom) = fromThousand ? (largest.name, thousand.name) : (thousand.name, empty.name)
          return ratio("fill", top, bottom, \.p50)(results)
        })
    }
  }

  /// The churn peers whose name starts with `prefix`, as figures, by their member count `n`.
  private static func churnFigures(_ results: [ScenarioResult], prefix: String) -> [(n: Double, figure: Figure)] {
    guard let churn = results.first(where: { $0.name == "churn" }) else { return [] }
    return churn.peers.compactMap { peer in
      guard peer.name.hasPrefix(prefix), case .figure(let figure) = peer.outcome,
        let n = figure.extras.first(where: { $0.0 == "n" })?.1
      else { return nil }
      return (n, figure)
    }.sorted { $0.n < $1.n }
  }

  /// Issue 13: adding and removing costs the same per member whatever the loop holds (ns per
  /// operation at the largest count ≤ 1.2× at the smallest, per kind and side), both while the
  /// loop fills from empty (`fill`) and for one more batch while it holds n (`steady`, timers'
  /// reschedules too), and a mass removal of timers stalls no pass for more than 1 ms.
  private static let churnTargets: [Target] =
    ChurnKind.allCases.flatMap { kind in
      ChurnSide.allCases.flatMap { side in
        churnRatioTargets(
          prefix: "\(kind.rawValue) \(side.rawValue) ", label: "fill \(kind.rawValue)", side: side,
          netOfFirstTouches: true)
          + churnRatioTargets(
            prefix: "steady \(kind.rawValue) \(side.rawValue) ", label: "steady \(kind.rawValue)", side: side,
            reschedules: kind == .timer)
      }
    }
    + churnRatioTargets(
      prefix: ChurnScenarios.fillFloorPrefix, label: "fill-floor", side: .loopThread, netOfFirstTouches: true)
    + [ChurnKind.inputSource, .timer, .observer].flatMap { kind in
      aboveFloorTargets(
        ours: "\(kind.rawValue) \(ChurnSide.loopThread.rawValue) ", floor: ChurnScenarios.fillFloorPrefix,
        label: "fill \(kind.rawValue)", floorLabel: "fill-floor")
    }
    + churnRatioTargets(prefix: ChurnScenarios.epollFloorPrefix, label: "fill epoll-floor", side: .loopThread)
    + churnRatioTargets(prefix: ChurnScenarios.steadyEpollFloorPrefix, label: "steady epoll-floor", side: .loopThread)
    + aboveFloorTargets(
      ours: "\(ChurnKind.descriptorSource.rawValue) \(ChurnSide.loopThread.rawValue) ",
      floor: ChurnScenarios.epollFloorPrefix, label: "fill descriptor-source", floorLabel: "epoll-floor")
    + aboveFloorTargets(
      ours: "steady \(ChurnKind.descriptorSource.rawValue) \(ChurnSide.loopThread.rawValue) ",
      floor: ChurnScenarios.steadyEpollFloorPrefix, label: "steady descriptor-source", floorLabel: "epoll-floor")
    + churnRatioTargets(
      prefix: "signalled-elsewhere input-source loop-thread ", label: "signalled-elsewhere input-source",
      side: .loopThread, passes: true)
    + ChurnSide.allCases.map { side in
      Target(
        label: "churn timer mass-removal \(side.rawValue): longest pass ns", bound: .atMost(1_000_000),
        measure: { churnFigures($0, prefix: "timer mass-removal \(side.rawValue) ").last?.figure.value })
    }

  /// The ratio targets of one group of churn peers (named `prefix` and a count): ns per add,
  /// remove (and reschedule, or the pass with n sources waiting) at the largest count over the
  /// smallest.
  ///
  /// `netOfFirstTouches` (a fill) adds the add's ratio without the kernel's part: the adds' first
  /// touches of fresh pages, priced by the page-fault floor of the same round
  /// (`add_minus_first_touch_ns`). Diagnostic: the plain add ratio stays the target.
  private static func churnRatioTargets(
    prefix: String, label: String, side: ChurnSide, reschedules: Bool = false, netOfFirstTouches: Bool = false,
    passes: Bool = false
  ) -> [Target] {
    let operations: [(name: String, extra: String?)] =
      [("add", nil)] + (netOfFirstTouches ? [("add net of faults", "add_minus_first_touch_ns")] : [])
      + [("remove", "remove_ns")] + (reschedules ? [("reschedule", "reschedule_ns")] : [])
      + (passes ? [("pass", "pass_ns")] : [])
    return operations.map { operation in
      Target(
        label: "churn \(label) \(operation.name) \(side.rawValue): ns/op big n / small n",
        bound: .atMost(1.2),
        measure: { results in
          let figures = churnFigures(results, prefix: prefix)
          guard let smallest = figures.first?.figure, let largest = figures.last?.figure, figures.count > 1 else {
            return nil
          }
          func cost(_ figure: Figure) -> Double? {
            guard let extra = operation.extra else { return figure.value }
            return figure.extras.first { $0.0 == extra }?.1
          }
          guard let top = cost(largest), let bottom = cost(smallest) else { return nil }
          return top / bottom
        })
    }
  }

  /// What a loop-thread add (and remove) of the peers named `ours` costs beyond the floor peers
  /// named `floor` at the same n, at the largest n over the smallest (`ChurnScenarios.fillFloorNote`,
  /// `epollFloorNote`): the part of the growth that is the loop's own. Nil when the floor did not
  /// run at both counts.
  private static func aboveFloorTargets(ours: String, floor: String, label: String, floorLabel: String) -> [Target] {
    [("add", nil), ("remove", "remove_ns")].map { (name: String, extra: String?) in
      Target(
        label: "churn \(label) \(name) above \(floorLabel) loop-thread: big n / small n",
        bound: .atMost(1.2),
        measure: { results in
          let ours = churnFigures(results, prefix: ours)
          let floor = churnFigures(results, prefix: floor)
          func cost(_ figure: Figure) -> Double? {
            guard let extra else { return figure.value }
            return figure.extras.first { $0.0 == extra }?.1
          }
          func above(_ entry: (n: Double, figure: Figure)?) -> Double? {
            guard let entry, let base = floor.first(where: { $0.n == entry.n }), let top = cost(entry.figure),
              let bottom = cost(base.figure)
            else { return nil }
            return top - bottom
          }
          guard ours.count > 1, let big = above(ours.last), let small = above(ours.first), small > 0 else {
            return nil
          }
          return big / small
        })
    }
  }

  /// One target checked against a run.
  struct Verdict {
    let label: String
    /// "≤ 1.15", "≥ 10", "< 1".
    let bound: String
    /// The measured value and whether it meets the bound; nil when a peer did not run.
    let outcome: (value: Double, met: Bool)?
  }

  /// Every target, checked against `results`.
  static func evaluate(_ results: [ScenarioResult]) -> [Verdict] {
    targets.map { target in
      let value = target.measure(results)
      switch target.bound {
      case .atMost(let limit):
        return Verdict(label: target.label, bound: "≤ \(formatFigure(limit))", outcome: value.map { ($0, $0 <= limit) })
      case .atLeast(let limit):
        return Verdict(label: target.label, bound: "≥ \(formatFigure(limit))", outcome: value.map { ($0, $0 >= limit) })
      case .below(let limit):
        return Verdict(label: target.label, bound: "< \(formatFigure(limit))", outcome: value.map { ($0, $0 < limit) })
      }
    }
  }

  /// The targets table: measured value, bound, met or missed (n/a when a peer did not run).
  static func render(_ verdicts: [Verdict]) -> String {
    var lines = ["", "== targets"]
    for verdict in verdicts {
      let label = padRight(verdict.label, 66)
      guard let (value, met) = verdict.outcome, !value.isNaN else {
        lines.append("   \(label) n/a (not measured)")
        continue
      }
      lines.append(
        "   \(label) \(padLeft(formatFigure(value), 12))  \(padRight(verdict.bound, 12)) \(met ? "met" : "MISSED")")
    }
    return lines.joined(separator: "\n")
  }

  /// How many targets were measured and missed.
  static func missedCount(_ verdicts: [Verdict]) -> Int {
    verdicts.filter { $0.outcome.map { !$0.value.isNaN && !$0.met } ?? false }.count
  }

  /// How many missed targets the summary names (the rest are counted).
  private static let summaryMissedLimit = 10

  /// The headline rows: a scenario, our peer in it (which path), and its matched floor (main-rtt
  /// has none).
  private static let headline: [(scenario: String, peer: String, floor: String?)] = [
    ("wake-rtt", "asyncrunloop", "floor-futex"), ("wake-rtt", "asyncrunloop-epoll", "floor-epoll"),
    ("wake-rtt-b2b", "asyncrunloop", "floor-futex"), ("wake-rtt-b2b", "asyncrunloop-epoll", "floor-epoll"),
    ("actor-rtt", "asyncrunloop", "floor-futex"), ("actor-rtt", "asyncrunloop-epoll", "floor-epoll"),
    ("thread-actor-rtt", "asyncrunloop", "floor-futex"), ("thread-actor-rtt", "asyncrunloop-epoll", "floor-epoll"),
    ("stream-rtt", "asyncrunloop", "floor-futex"), ("stream-rtt", "asyncrunloop-epoll", "floor-epoll"),
    ("stream-rtt-b2b", "asyncrunloop", "floor-futex"), ("stream-rtt-b2b", "asyncrunloop-epoll", "floor-epoll"),
    ("timer-1ms-lateness", "asyncrunloop", "floor-timerfd"), ("main-rtt", "asyncrunloop", nil),
  ]

  /// The default output: each headline scenario's p50 (ours, its floor, the best other peer, and
  /// the ratios), then how many targets were met and missed, naming the missed ones.
  static func summary(_ results: [ScenarioResult], _ verdicts: [Verdict]) -> String {
    var lines = [
      "", "== headline (p50 µs; ratios: ours over the floor and over the best peer)",
      "   \(padRight("scenario (path)", 30))\(padLeft("ours", 8))\(padLeft("floor", 9))  \(padRight("best peer", 40))"
        + "\(padLeft("÷ floor", 8))\(padLeft("÷ peer", 8))",
    ]
    for (scenario, peer, floorName) in headline {
      guard let ours = latency(results, scenario, peer) else { continue }
      let path = peer.hasSuffix(LoopPath.epoll.peerSuffix) ? "epoll" : floorName == "floor-futex" ? "futex" : ""
      let label = path.isEmpty ? scenario : "\(scenario) (\(path))"
      let floor = floorName.flatMap { latency(results, scenario, $0) }
      let peers = results.first { $0.name == scenario }?.peers ?? []
      let best = peers.compactMap { peer -> (name: String, p50: Double)? in
        guard !peer.name.hasPrefix("asyncrunloop"), !peer.name.hasPrefix("floor-"),
          case .latency(let summary, _) = peer.outcome
        else { return nil }
        return (peer.name, summary.p50)
      }.min { $0.p50 < $1.p50 }
      let floorText = floor.map { formatFixed($0.p50, decimals: 2) } ?? "-"
      let bestText = best.map { "\(formatFixed($0.p50, decimals: 2)) \($0.name)" } ?? "-"
      let floorRatio = floor.map { formatFixed(ours.p50 / $0.p50, decimals: 2) + "×" } ?? ""
      let peerRatio = best.map { formatFixed(ours.p50 / $0.p50, decimals: 2) + "×" } ?? ""
      lines.append(
        "   \(padRight(label, 30))\(padLeft(formatFixed(ours.p50, decimals: 2), 8))\(padLeft(floorText, 9))  "
          + "\(padRight(bestText, 40))\(padLeft(floorRatio, 8))\(padLeft(peerRatio, 8))")
    }
    let measured = verdicts.filter { $0.outcome.map { !$0.value.isNaN } ?? false }
    let missed = measured.filter { !($0.outcome?.met ?? true) }
    lines.append("")
    lines.append(
      "targets: \(measured.count - missed.count) met, \(missed.count) missed"
        + (verdicts.count > measured.count ? ", \(verdicts.count - measured.count) not measured" : "")
        + " (--details for every table and target)")
    for verdict in missed.prefix(summaryMissedLimit) {
      lines.append("   missed: \(verdict.label) (\(verdict.bound))")
    }
    if missed.count > summaryMissedLimit {
      lines.append("   … and \(missed.count - summaryMissedLimit) more missed (--details lists every target)")
    }
    return lines.joined(separator: "\n")
  }
}
