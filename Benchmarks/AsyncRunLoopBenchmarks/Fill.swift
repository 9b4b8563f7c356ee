import AsyncRunLoop

// fill (issue 13): whether a loop gets slower as it fills up: wake-rtt and 1 ms timer lateness
// on loops that also hold 0, 1k, 10k or 100k idle members, the sizes interleaved in one process
// (and 0 again at the end, to show drift). Public API only.

/// A wake-rtt or timer-lateness peer whose loop also holds `count` idle members: half
/// never-signalled input sources, the rest far-future timers, added (on the loop thread) before
/// the first measurement. The loop's shutdown in `close` invalidates them.
final class FilledLoopSession: LatencySession {
  private let inner: any LatencySession

  init(count: Int, inner: any LatencySession, loop: RunLoopThread) {
    self.inner = inner
    let sourceCount = count / 2
    let timers = IdleMembers(.timer, count: count - sourceCount)
    let sources = IdleMembers(.inputSource, count: sourceCount)
    _ = timedOnLoop(loop) {
      timers.add(to: loop)
      sources.add(to: loop)
    }
  }

  func measure(_ count: Int) -> [Double] { inner.measure(count) }
  func close() { inner.close() }
}

enum FillScenarios {
  /// Idle member counts, in the order the peers are listed (the harness rotates the start).
  static func sizes(_ mode: RunMode) -> [Int] {
    mode == .smoke ? [0, 100, 1_000, 0] : [0, 1_000, 10_000, 100_000, 0]
  }

  /// "idle-1k", and "idle-0-again" for the second empty loop.
  static func peerNames(_ sizes: [Int]) -> [String] {
    sizes.enumerated().map { index, count in
      "idle-\(ChurnScenarios.label(count))" + (sizes[..<index].contains(count) ? "-again" : "")
    }
  }

  static func fill(_ context: BenchmarkContext) -> ScenarioResult {
    let mode = context.mode
    let pin = context.pin
    let sizes = sizes(mode)
    let names = peerNames(sizes)
    let wake = runLatencyScenario(
      "fill wake-rtt", floor: nil, notes: [],
      peers: zip(names, sizes).map { name, count in
        PeerSpec(name: name) {
          let session = AsyncRunLoopWake(pin: pin)
          return FilledLoopSession(count: count, inner: session, loop: session.loop)
        }
      },
      mode: mode)
    let timer = runLatencyScenario(
      "fill timer-lateness", floor: nil, notes: [],
      peers: zip(names, sizes).map { name, count in
        PeerSpec(name: name) {
          let session = LoopTimerLateness()
          return FilledLoopSession(count: count, inner: session, loop: session.loop)
        }
      },
      samples: mode.timerFires, warmUp: max(10, mode.timerFires / 10), repetitions: mode.repetitions)
    func prefixed(_ result: ScenarioResult, _ prefix: String) -> [PeerResult] {
      result.peers.map { PeerResult(name: "\(prefix) \($0.name)", outcome: $0.outcome) }
    }
    return ScenarioResult(
      name: "fill", unit: "us", floor: nil,
      peers: prefixed(wake, "wake-rtt") + prefixed(timer, "timer-lateness"),
      notes: [
        "wake-rtt (as in wake-rtt, asyncrunloop peer) and 1 ms LoopTimer lateness (as asyncrunloop-looptimer)"
          + " on loops holding n idle members: n/2 idle input sources, the rest far-future timers",
        "sizes \(sizes.map(ChurnScenarios.label).joined(separator: ", ")) interleaved in one process;"
          + " medians over \(mode.repetitions) repetitions",
      ])
  }
}
