/// What a repeating timer sequence does about ticks it missed: the loop fired it late (it was
/// busy, or ran in a mode the timer is not in), or the consumer had not taken the previous tick
/// when the next one came due.
public enum MissedTickPolicy: Sendable, Hashable, CustomStringConvertible {
  /// CF's rule: one tick stands for every missed due instant (its `skipped` counts the others)
  /// and the timer stays on its grid (the next due instant is the first grid point after now).
  case skip
  /// Catch up: one tick per missed due instant, delivered back to back, then the grid continues.
  case burst
  /// One tick stands for the missed ones (as `skip`), and the period restarts from the late fire:
  /// the next tick is due one interval after it.
  case delay

  public var description: String {
    switch self {
    case .skip: return "skip"
    case .burst: return "burst"
    case .delay: return "delay"
    }
  }
}

/// One element of a timer sequence.
public struct LoopTick: Sendable, Hashable, CustomStringConvertible {
  /// The instant this tick was due. The lateness of a tick is the time it is handled minus this.
  public var scheduled: LoopClock.Instant
  /// How many later due instants were folded into this tick (`.skip` and `.delay`; always 0 with
  /// `.burst`, which delivers each of them).
  public var skipped: Int

  public init(scheduled: LoopClock.Instant, skipped: Int = 0) {
    self.scheduled = scheduled
    self.skipped = skipped
  }

  public var description: String {
    skipped == 0 ? "tick(\(scheduled.nanoseconds))" : "tick(\(scheduled.nanoseconds), skipped \(skipped))"
  }
}

/// The tick arithmetic of a timer sequence: a pure value driven with plain nanosecond numbers
/// (no clock, no loop), so every missed-tick policy is tested without sleeping.
///
/// The loop's timer calls `fire(now:)` when it fires; the result is the next date to fire at.
/// The consumer calls `take()` for the next tick. Ticks that were due but not yet taken are kept
/// compactly: `.skip`/`.delay` fold them into one pending tick, `.burst` keeps a run of grid
/// points (first, count) and hands them out one by one.
struct TickSchedule {
  /// Nanoseconds between ticks; nil for a one-shot timer.
  let interval: Int64?
  let policy: MissedTickPolicy
  /// The next due instant not yet turned into a tick; nil once a one-shot timer has fired.
  private(set) var nextDue: Int64?
  private var ready = Ready.none

  private enum Ready: Equatable {
    /// No tick waits for the consumer.
    case none
    /// One tick (`.skip`, `.delay`, one-shot): the first due instant it stands for, and how many
    /// later ones were folded in.
    case one(scheduled: Int64, skipped: Int)
    /// `.burst`: `count` ticks on the grid from `first`, one interval apart.
    case run(first: Int64, count: Int)
  }

  /// - Parameters:
  ///   - firstDue: The first due instant (nanoseconds on `LoopClock`).
  ///   - interval: Nanoseconds between ticks (greater than 0), or nil for one tick.
  ///   - policy: What to do about missed ticks.
  init(firstDue: Int64, interval: Int64?, policy: MissedTickPolicy) {
    precondition(interval.map { $0 > 0 } ?? true, "AsyncRunLoop: a timer interval must be positive")
    self.nextDue = firstDue
    self.interval = interval
    self.policy = policy
  }

  /// True when a tick waits for the consumer.
  var hasReadyTick: Bool { ready != .none }

  /// The timer fired at `now` (never before `nextDue`; an earlier `now` counts as on time):
  /// turns every due instant up to `now` into ready ticks according to the policy.
  /// - Returns: the next fire date, or nil when no tick follows (one-shot).
  mutating func fire(now rawNow: Int64) -> Int64? {
    guard let due = nextDue else { return nil }  // one-shot already fired
    let now = max(rawNow, due)
    guard let interval else {
      addOne(scheduled: due, skipped: 0)
      nextDue = nil
      return nil
    }
    // The due instants at or before now: due, due + interval, …, due + missed·interval.
    let missed = Int(now.subtractingSaturating(due) / interval)
    let count = missed == Int.max ? missed : missed + 1
    let gridNext = due.addingSaturating(Int64(count).multipliedSaturating(by: interval))
    switch policy {
    case .skip:
      addOne(scheduled: due, skipped: missed)
      nextDue = gridNext  // stay on the grid
    case .burst:
      addRun(first: due, count: count)
      nextDue = gridNext  // catch up, then stay on the grid
    case .delay:
      addOne(scheduled: due, skipped: missed)
      nextDue = now.addingSaturating(interval)  // restart the period from this fire
    }
    return nextDue
  }

  /// Takes the next ready tick, or nil when none waits.
  mutating func take() -> LoopTick? {
    switch ready {
    case .none:
      return nil
    case .one(let scheduled, let skipped):
      ready = .none
      return LoopTick(scheduled: LoopClock.Instant(nanoseconds: scheduled), skipped: skipped)
    case .run(let first, let count):
      ready = count > 1 ? .run(first: first.addingSaturating(interval ?? 0), count: count - 1) : .none
      return LoopTick(scheduled: LoopClock.Instant(nanoseconds: first))
    }
  }

  /// A tick for `scheduled` (standing for `skipped` more): folded into a waiting tick, whose
  /// earlier instant it keeps.
  private mutating func addOne(scheduled: Int64, skipped: Int) {
    switch ready {
    case .none:
      ready = .one(scheduled: scheduled, skipped: skipped)
    case .one(let earlier, let earlierSkipped):
      ready = .one(scheduled: earlier, skipped: earlierSkipped.addingSaturating(1).addingSaturating(skipped))
    case .run(let first, let count):
      ready = .one(scheduled: first, skipped: count.addingSaturating(skipped))  // not reached: fixed policy
    }
  }

  /// `count` grid ticks from `first`, appended to a waiting run (they are contiguous).
  private mutating func addRun(first: Int64, count: Int) {
    switch ready {
    case .none:
      ready = .run(first: first, count: count)
    case .run(let earlier, let earlierCount):
      ready = .run(first: earlier, count: earlierCount.addingSaturating(count))
    case .one(let scheduled, let skipped):
      ready = .run(first: scheduled, count: skipped.addingSaturating(1).addingSaturating(count))  // not reached
    }
  }
}

extension Int {
  fileprivate func addingSaturating(_ other: Int) -> Int {
    let (sum, overflow) = addingReportingOverflow(other)
    return overflow ? (other > 0 ? .max : .min) : sum
  }
}

extension Int64 {
  fileprivate func multipliedSaturating(by other: Int64) -> Int64 {
    let (product, overflow) = multipliedReportingOverflow(by: other)
    return overflow ? ((self < 0) != (other < 0) ? .min : .max) : product
  }
}
