import AsyncRunLoop

// fill (issue 13): whether a loop gets slower as it fills up: wake-rtt and 1 ms timer lateness
// on loops that also hold 0, 1k, 10k or 100k idle members, and descriptor-rtt on loops that hold
// 0, 1k or as many idle descriptor sources as the process may open, and signal → handler of one
// source picked at random among n; the sizes interleaved in one process (and 0 again at the end,
// to show drift). Public API only.

/// A wake-rtt or timer-lateness peer whose loop also holds `count` idle members: half
/// never-signalled input sources, the rest far-future timers, added (on the loop thread) before
/// the first measurement. The loop's shutdown in `close` invalidates them.
final class FilledLoopSession: LatencySession {
  private let inner: any LatencySession
  private let members: [IdleMembers]

  /// Half idle input sources, half far-future timers.
  convenience init(count: Int, inner: any LatencySession, loop: RunLoopThread) {
    let sourceCount = count / 2
    self.init(
      members: [IdleMembers(.timer, count: count - sourceCount), IdleMembers(.inputSource, count: sourceCount)],
      inner: inner, loop: loop)
  }

  /// `members`, added on the loop thread; their descriptors (if any) are closed after `inner`
  /// closed (its loop's shutdown removed them).
  init(members: [IdleMembers], inner: any LatencySession, loop: RunLoopThread) {
    self.inner = inner
    self.members = members
    _ = timedOnLoop(loop) { for group in members { group.add(to: loop) } }
  }

  func measure(_ count: Int) -> [Double] { inner.measure(count) }
  func close() {
    inner.close()
    for group in members { group.close() }
  }
}

/// descriptor-rtt: as wake-rtt, but the request is a write to an eventfd that a `DescriptorSource`
/// watches (the pipe → handler path of a server); the handler drains it and rings the reply.
final class DescriptorWake: LatencySession {
  private let reply = ReplyDoorbell()
  private let request = EventDoorbell(nonBlocking: true)
  /// The server loop (`fill` adds idle members to it).
  let loop: RunLoopThread
  private let source: DescriptorSource

  init(pin: PinPlan) {
    loop = try! RunLoopThread(name: "fill-descriptor-server", cpu: pin.serverCPU)
    source = DescriptorSource(descriptor: request.descriptor) { [request, reply] _, _ in
      request.drain()
      reply.ring()
    }
    try! loop.add(source)
  }

  func measure(_ count: Int) -> [Double] {
    sampleRoundTrips(count, settle: reply.waitUntilRingerSleeps) {
      request.ring()
      reply.wait()
    }
  }

  func close() {
    source.invalidate()
    loop.shutdownAndWait()
    request.close()
    reply.close()
  }
}

/// signal-random: a loop holding `count` input sources (at least one) whose handlers ring the
/// reply; each round trip signals one of them chosen at random, so on a big loop the source, its
/// record and its handler are cold in the caches (what a server with many connections sees).
final class RandomSourceWake: LatencySession {
  private let reply = ReplyDoorbell()
  let loop: RunLoopThread
  private let sources: [InputSource]
  /// xorshift64 state: the same sequence of picks in every run.
  private var pick: UInt64 = 0x9E37_79B9_7F4A_7C15

  init(pin: PinPlan, count: Int) {
    loop = try! RunLoopThread(name: "fill-random-server", cpu: pin.serverCPU)
    let reply = reply
    let sources = (0..<max(1, count)).map { _ in InputSource { _ in reply.ring() } }
    self.sources = sources
    let loop = loop
    _ = timedOnLoop(loop) { for source in sources { loop.add(source, to: .default) } }
  }

  func measure(_ count: Int) -> [Double] {
    sampleRoundTrips(count, settle: reply.waitUntilRingerSleeps) {
      pick ^= pick << 13
      pick ^= pick >> 7
      pick ^= pick << 17
      sources[Int(pick % UInt64(sources.count))].signal()
      reply.wait()
    }
  }

  func close() {
    for source in sources { source.invalidate() }
    loop.shutdownAndWait()
    reply.close()
  }
}

enum FillScenarios {
  /// Idle member counts, in the order the peers are listed (the harness rotates the start).
  static func sizes(_ mode: RunMode) -> [Int] {
    mode == .smoke ? [0, 100, 1_000, 0] : [0, 1_000, 10_000, 100_000, 0]
  }

  /// Idle descriptor counts: every peer is open at once, so together they must fit in the
  /// descriptors the process may still open (the largest is cut to what is left).
  static func descriptorSizes(_ mode: RunMode, available: Int) -> [Int] {
    let sizes = mode == .smoke ? [0, 100, 1_000, 0] : [0, 1_000, 100_000, 0]
    let largest = sizes.max() ?? 0
    let others = sizes.reduce(0, +) - largest
    return sizes.map { $0 == largest ? max(0, min(largest, available - others)) : $0 }
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
          let session = LoopTimerLateness()  // settled as in timer-1ms-lateness
          return FilledLoopSession(count: count, inner: SettledTimerSession(session), loop: session.loop)
        }
      },
      samples: mode.timerFires, warmUp: max(10, mode.timerFires / 10), repetitions: mode.repetitions)
    let random = runLatencyScenario(
      "fill signal-random", floor: nil, notes: [],
      peers: zip(names, sizes).map { name, count in
        PeerSpec(name: name) { RandomSourceWake(pin: pin, count: count) }
      },
      mode: mode)
    let budget = DescriptorBudget.raise()
    let descriptorSizes = descriptorSizes(mode, available: budget.available)
    let descriptor = runLatencyScenario(
      "fill descriptor-rtt", floor: nil, notes: [],
      peers: zip(peerNames(descriptorSizes), descriptorSizes).map { name, count in
        PeerSpec(name: name) {
          let session = DescriptorWake(pin: pin)
          return FilledLoopSession(
            members: [IdleMembers(.descriptorSource, count: count)], inner: session, loop: session.loop)
        }
      },
      mode: mode)
    func prefixed(_ result: ScenarioResult, _ prefix: String) -> [PeerResult] {
      result.peers.map { PeerResult(name: "\(prefix) \($0.name)", outcome: $0.outcome) }
    }
    return ScenarioResult(
      name: "fill", unit: "us", floor: nil,
      peers: prefixed(wake, "wake-rtt") + prefixed(timer, "timer-lateness")
        + prefixed(random, "signal-random") + prefixed(descriptor, "descriptor-rtt"),
      notes: [
        "wake-rtt (as in wake-rtt, asyncrunloop peer) and 1 ms LoopTimer lateness (as asyncrunloop-looptimer)"
          + " on loops holding n idle members: n/2 idle input sources, the rest far-future timers",
        "signal-random: one of n input sources (n at least 1), picked at random, signalled; its handler"
          + " rings the reply (on a big loop the source and its handler are cold in the caches)",
        "descriptor-rtt: an eventfd write to a DescriptorSource whose handler rings the reply, on loops"
          + " holding n idle descriptor sources (never-written eventfds)",
        "sizes \(sizes.map(ChurnScenarios.label).joined(separator: ", ")) (descriptor-rtt:"
          + " \(descriptorSizes.map(ChurnScenarios.label).joined(separator: ", "))) interleaved in one process;"
          + " medians over \(mode.repetitions) repetitions",
      ])
  }
}
