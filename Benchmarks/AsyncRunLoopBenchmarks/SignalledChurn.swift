import AsyncRunLoop

// churn's signalled-elsewhere sizes (issue 13): custom sources signalled while none of their modes
// runs wait for one of them. What they cost the passes of the mode that runs, and their removal,
// as their number grows. Public API only.

/// One count: on a fresh loop (a far-future timer keeps `.default` running), `count` custom sources
/// are added to another mode and signalled, and one pass of `.default` finds them waiting for
/// that mode; then `timedPasses` more passes are timed one by one (`pass_ns`, their median: they
/// still wait) and they are removed. The value is ns per add; extras `remove_ns` per removal,
/// `pass_ns`, `n`. All on the loop thread, in one block. Median of up to `rounds` rounds (a
/// discarded warm-up round for counts up to 1k).
final class SignalledElsewhereSession: FigureSession {
  static let otherMode: RunLoopMode = "churn-signalled-elsewhere"
  /// Passes of `.default` timed per round, after the one that finds the sources waiting.
  static let timedPasses = 9
  private let count: Int
  private let rounds: Int
  private let cpu: Int?

  init(count: Int, rounds: Int, cpu: Int?) {
    self.count = count
    self.rounds = rounds
    self.cpu = cpu
  }

  func measure() -> Figure {
    if count <= 1_000 { _ = measureRound() }  // warm-up
    let measured = (0..<rounds).map { _ in measureRound() }
    let perMember = Double(count)
    return Figure(
      value: median(measured.map { Double($0.add) / perMember }),
      extras: [
        ("remove_ns", median(measured.map { Double($0.remove) / perMember })),
        ("pass_ns", median(measured.map { Double($0.pass) })), ("n", perMember),
      ])
  }

  private func measureRound() -> (add: Int64, pass: Int64, remove: Int64) {
    let loop = try! RunLoopThread(name: "churn-signalled", cpu: cpu)
    defer { loop.shutdownAndWait() }
    let keepAlive = LoopTimer(after: .seconds(3_600)) { _ in }
    defer { keepAlive.invalidate() }
    loop.add(keepAlive)
    let sources = (0..<count).map { _ in InputSource { _ in } }
    let mode = Self.otherMode
    let times = try! loop.performAndWait { () -> (Int64, Int64, Int64) in
      let start = monotonicNanoseconds()
      for source in sources { loop.add(source, to: mode) }
      let added = monotonicNanoseconds()
      for source in sources { source.signal() }
      _ = loop.run(mode: .default, until: .now)  // finds them signalled, in another mode
      // One pass is a few microseconds: the median of several, each timed alone.
      let passes = (0..<Self.timedPasses).map { _ in
        let passStart = monotonicNanoseconds()
        _ = loop.run(mode: .default, until: .now)
        return monotonicNanoseconds() - passStart
      }
      let removeStart = monotonicNanoseconds()
      for source in sources { loop.remove(source, from: mode) }
      let removed = monotonicNanoseconds() - removeStart
      return (added - start, Int64(median(passes.map(Double.init))), removed)
    }
    withExtendedLifetime(sources) {}  // the user's: freed after the timing
    return times
  }

  func close() {}
}

extension ChurnScenarios {
  /// The peer name of one signalled-elsewhere count.
  static func signalledElsewherePeerName(_ count: Int) -> String {
    "signalled-elsewhere input-source loop-thread \(label(count))"
  }

  /// The signalled-elsewhere peers, at the custom sources' sizes.
  static func signalledElsewherePeers(_ mode: RunMode, cpu: Int?) -> [PeerSpec<any FigureSession>] {
    sizes(.inputSource, mode).map { count in
      let rounds = rounds(count, mode)
      return PeerSpec(name: signalledElsewherePeerName(count)) {
        SignalledElsewhereSession(count: count, rounds: rounds, cpu: cpu)
      }
    }
  }

  static let signalledElsewhereNote =
    "signalled-elsewhere: n custom sources added to another mode and signalled while .default runs (one"
    + " pass finds them waiting); value = ns per add, pass_ns = median of the next"
    + " \(SignalledElsewhereSession.timedPasses) passes of .default, remove_ns = ns per removal; loop thread"
}
