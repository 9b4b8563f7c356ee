import AsyncRunLoop

// churn's steady peers (issue 13, "a loop holding a server's 100k connections and timers must
// open, close and reschedule them at a steady cost per operation"): a loop already holds `fill`
// idle members of one kind, and a batch of fresh members of that kind is added, rescheduled
// (timers) and removed again. Unlike the fill peers (`ChurnSession`, which time the loop growing
// from empty to n, first-touch memory included), this is the cost of one more open or close
// while the loop holds n.

/// One (kind, side, fill) of steady churn: on a fresh loop holding `fill` idle members (added from
/// the loop thread, not timed), rounds of: create `batch` fresh members (not timed), add them all,
/// reschedule them all (timers: `setFireDate` to later than every timer held, as an idle timeout
/// that is reset), remove them all. The value is ns per add; extras `remove_ns`,
/// `reschedule_ns` (timers), `n` (the fill) and `rounds`. The median of `rounds` rounds, after a
/// discarded warm-up round (at every fill alike).
final class SteadyChurnSession: FigureSession {
  static let batch = 1_000

  private let kind: ChurnKind
  private let side: ChurnSide
  private let fill: Int
  private let rounds: Int
  private let cpu: Int?

  init(kind: ChurnKind, side: ChurnSide, fill: Int, rounds: Int, cpu: Int?) {
    self.kind = kind
    self.side = side
    self.fill = fill
    self.rounds = rounds
    self.cpu = cpu
  }

  func measure() -> Figure {
    let loop = try! RunLoopThread(name: "churn-steady", cpu: cpu)
    defer { loop.shutdownAndWait() }
    let held = IdleMembers(kind, count: fill)
    defer { held.close() }
    _ = timedOnLoop(loop) { held.add(to: loop) }
    _ = measureRound(on: loop, round: 0)  // warm-up
    var adds: [Double] = []
    var removes: [Double] = []
    var reschedules: [Double] = []
    for round in 1...rounds {
      let (add, reschedule, remove) = measureRound(on: loop, round: round)
      adds.append(add)
      reschedules.append(reschedule)
      removes.append(remove)
    }
    withExtendedLifetime(held) {}
    var extras = [("remove_ns", median(removes))]
    if kind == .timer { extras.append(("reschedule_ns", median(reschedules))) }
    extras += [("n", Double(fill)), ("rounds", Double(rounds))]
    return Figure(value: median(adds), extras: extras)
  }

  /// One batch added, rescheduled (timers only; NaN otherwise) and removed: ns per member each.
  private func measureRound(on loop: RunLoopThread, round: Int) -> (Double, Double, Double) {
    let members = IdleMembers(kind, count: Self.batch)
    defer { members.close() }
    // Later than every timer the loop holds (they are due within an hour and a second): the
    // rescheduled entry moves to the far end of the heap.
    let laterBase = monotonicNanoseconds() + 7_200_000_000_000 + Int64(round) * 1_000_000_000
    let reschedule: @Sendable () -> Void = {
      guard case .timers(let timers) = members else { return }
      for (index, timer) in timers.enumerated() {
        timer.setFireDate(LoopClock.Instant(nanoseconds: laterBase + Int64(index)))
      }
    }
    let perMember = Double(Self.batch)
    switch side {
    case .loopThread:
      let add = timedOnLoop(loop) { members.add(to: loop) }
      let moved = kind == .timer ? Double(timedOnLoop(loop, reschedule)) / perMember : .nan
      let remove = timedOnLoop(loop) { members.remove(from: loop) }
      return (Double(add) / perMember, moved, Double(remove) / perMember)
    case .crossThread:
      let add = timedAcross(loop) { members.add(to: loop) }
      let moved = kind == .timer ? Double(timedAcross(loop, reschedule)) / perMember : .nan
      let remove = timedAcross(loop) { members.remove(from: loop) }
      return (Double(add) / perMember, moved, Double(remove) / perMember)
    case .crossThreadBatched:
      func total(_ parts: (send: Int64, apply: Int64)) -> Double { Double(parts.send + parts.apply) / perMember }
      let add = total(timedBatchAcross(loop) { members.add(to: loop) })
      let moved = kind == .timer ? total(timedBatchAcross(loop, reschedule)) : .nan
      let remove = total(timedBatchAcross(loop) { members.remove(from: loop) })
      return (add, moved, remove)
    }
  }

  func close() {}
}
