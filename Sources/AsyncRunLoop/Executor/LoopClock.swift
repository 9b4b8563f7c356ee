import Glibc

/// The clock the loops measure time with: `CLOCK_MONOTONIC`, in nanoseconds.
///
/// It is the clock behind every loop's timers and the `timerfd` they sleep on, so a deadline
/// expressed in `LoopClock.Instant` is exactly the one the kernel wakes the loop for.
/// `LoopClock` is a value and may be used from any thread. `sleep(until:tolerance:)` suspends the
/// calling task on a loop timer (see `RunLoopThread.clock`).
public struct LoopClock: Clock, Sendable {
  /// A point on the monotonic clock, in nanoseconds since an arbitrary origin (boot).
  public struct Instant: InstantProtocol, Sendable, Hashable, Comparable, CustomStringConvertible {
    /// Nanoseconds since the clock's origin.
    public var nanoseconds: Int64

    public init(nanoseconds: Int64) { self.nanoseconds = nanoseconds }

    /// The current time.
    public static var now: Instant { Instant(nanoseconds: LoopClock.monotonicNanoseconds()) }

    public func advanced(by duration: Duration) -> Instant {
      Instant(nanoseconds: nanoseconds.addingSaturating(duration.saturatedNanoseconds))
    }

    public func duration(to other: Instant) -> Duration {
      .nanoseconds(other.nanoseconds.subtractingSaturating(nanoseconds))
    }

    public static func < (lhs: Instant, rhs: Instant) -> Bool { lhs.nanoseconds < rhs.nanoseconds }

    public var description: String { "LoopClock.Instant(\(nanoseconds) ns)" }

    /// The latest instant the clock can represent: "never".
    public static let distantFuture = Instant(nanoseconds: Int64.max)
  }

  /// The loop whose timers `sleep` uses; `nil` uses the calling thread's loop if it is a loop
  /// thread created with `RunLoopThread(name:)` that has not shut down, otherwise a process-wide
  /// timer loop.
  let loop: RunLoopThread?

  /// A clock whose `sleep` is served by the shared timer loop (or the caller's own loop).
  public init() { loop = nil }

  init(loop: RunLoopThread) { self.loop = loop }

  /// The current time: the loop's for the clock of a loop (a virtual-time loop's is virtual),
  /// otherwise the monotonic clock's.
  public var now: Instant { loop?.clockNow ?? .now }

  /// The clock's resolution: one nanosecond (the kernel's `timerfd` resolution).
  public var minimumResolution: Duration { .nanoseconds(1) }

  /// Suspends the calling task until `deadline`, on a loop timer; never wakes early.
  ///
  /// The clock of a loop (`RunLoopThread.clock`) sleeps on that loop's timers, so that loop
  /// shutting down before the deadline ends the sleep with `CancellationError` (its timers are
  /// invalidated). `LoopClock()` uses the caller's loop only while it is running: one that shuts
  /// down before the deadline (or already has) does not end the sleep, which then goes on on the
  /// shared timer loop until the deadline.
  /// - Throws: `CancellationError` if the task is cancelled while sleeping, or (the clock of a
  ///   loop) that loop shuts down first.
  ///
  /// Runs on the caller's executor up to the point it waits (`nonisolated(nonsending)`), so from
  /// an actor pinned to a loop (or any code running on a loop's thread) `LoopClock()` sleeps on
  /// that loop's timers.
  nonisolated(nonsending) public func sleep(until deadline: Instant, tolerance: Duration? = nil) async throws {
    if let loop { return try await loop.sleep(until: deadline, tolerance: tolerance) }
    if let current = RunLoopThread.currentIfExists, current.ownsThread, !current.isShutDown {
      do {
        return try await current.sleep(until: deadline, tolerance: tolerance)
      } catch is CancellationError where !Task.isCancelled && current.isShutDown {
        // The caller's loop shut down under the sleep, not the task: sleep the rest elsewhere.
      }
    }
    try await RunLoopThread.sharedTimerLoop.sleep(until: deadline, tolerance: tolerance)
  }

  /// Suspends the calling task for `duration`, on a loop timer: `sleep(until:tolerance:)` from
  /// now. On the caller's executor, as that one (the `Clock` protocol's own `sleep(for:)` runs on
  /// the global executor, where `LoopClock()` cannot see the caller's loop).
  nonisolated(nonsending) public func sleep(for duration: Duration, tolerance: Duration? = nil) async throws {
    // From the time of the loop that will serve the sleep (a virtual-time loop's is its own).
    let base = (loop ?? RunLoopThread.currentIfExists)?.clockNow ?? .now
    try await sleep(until: base.advanced(by: duration), tolerance: tolerance)
  }

  @inline(__always)
  static func monotonicNanoseconds() -> Int64 {
    var spec = timespec()
    clock_gettime(CLOCK_MONOTONIC, &spec)
    return Int64(spec.tv_sec) &* 1_000_000_000 &+ Int64(spec.tv_nsec)
  }
}

extension Duration {
  /// The duration in whole nanoseconds, clamped to `Int64`'s range (never traps).
  var saturatedNanoseconds: Int64 {
    // `components` divides a 128-bit count of attoseconds (about 180 instructions): a timer's
    // zero tolerance, the common case, skips it.
    if self == .zero { return 0 }
    let (seconds, attoseconds) = components
    if seconds >= Int64.max / 1_000_000_000 { return Int64.max }
    if seconds <= Int64.min / 1_000_000_000 { return Int64.min }
    return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
  }
}

extension Int64 {
  @inline(__always)
  func addingSaturating(_ other: Int64) -> Int64 {
    let (sum, overflow) = addingReportingOverflow(other)
    return overflow ? (other > 0 ? .max : .min) : sum
  }

  @inline(__always)
  func subtractingSaturating(_ other: Int64) -> Int64 {
    let (difference, overflow) = subtractingReportingOverflow(other)
    return overflow ? (other < 0 ? .max : .min) : difference
  }
}
