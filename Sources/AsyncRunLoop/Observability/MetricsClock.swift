import CAsyncRunLoop
import Glibc

/// The clock the metrics time with: the CPU's cycle counter where the kernel itself keeps time
/// with it, otherwise `CLOCK_MONOTONIC`. Any thread.
///
/// Metrics take several readings per wake-up, and on the development VM a `clock_gettime` costs
/// about 28 ns against 11 ns for `rdtsc`; the metrics are meant to stay on, so the cheaper reading
/// is worth a conversion. Readings are *ticks*: only differences of two readings mean anything,
/// and `nanoseconds(_:)` converts a difference. Ticks are never mixed with `LoopClock` times (a
/// timer's fire date, a stall report's start): `CLOCK_MONOTONIC` is slewed by NTP, the counter is
/// not, so the two drift apart over hours. Two threads' readings compare because the kernel only
/// keeps its clock on the counter when the counter is constant-rate and synchronized across CPUs
/// (it checks, and falls back to another clock source when it is not; we check which source it
/// uses once, when the process first needs the clock, and do not follow a later switch).
struct MetricsClock: Sendable {
  /// Whether readings come from the cycle counter (else they are `CLOCK_MONOTONIC` nanoseconds).
  let usesCycleCounter: Bool
  /// Nanoseconds per tick, as a 32.32 fixed-point number (1 << 32 when ticks are nanoseconds).
  let nanosecondsPerTick: UInt64

  /// The process's clock, calibrated once on first use (about 200 µs of spinning, against
  /// `CLOCK_MONOTONIC`).
  static let shared = MetricsClock.calibrated()

  /// A reading. Any thread.
  @inline(__always)
  func now() -> Int64 {
    usesCycleCounter ? Int64(bitPattern: carl_cycle_counter()) : LoopClock.monotonicNanoseconds()
  }

  /// The nanoseconds between two readings, `ticks` apart (negative counts as 0).
  @inline(__always)
  func nanoseconds(_ ticks: Int64) -> Int64 {
    guard ticks > 0 else { return 0 }
    guard usesCycleCounter else { return ticks }
    let product = UInt64(ticks).multipliedFullWidth(by: nanosecondsPerTick)
    // (high << 32) | (low >> 32), saturated: the product shifted right by 32.
    guard product.high >> 31 == 0 else { return Int64.max }
    return Int64(product.high << 32 | product.low >> 32)
  }

  /// The clock this machine supports: the cycle counter when the kernel's clock source is it and
  /// a calibration against `CLOCK_MONOTONIC` gives a plausible rate, else `CLOCK_MONOTONIC`.
  static func calibrated() -> MetricsClock {
    let monotonic = MetricsClock(usesCycleCounter: false, nanosecondsPerTick: 1 << 32)
    guard carl_cycle_counter() != 0, kernelKeepsTimeWithCycleCounter() else { return monotonic }
    guard let start = pairedReading(), let end = pairedReading(after: start.nanoseconds + 200_000),
      end.ticks > start.ticks,
      // A process stopped in between (a debugger, SIGSTOP, a paused VM) took a long reading:
      // not trusted (and `<< 32` below would wrap past 4.29 s).
      end.nanoseconds - start.nanoseconds < 1_000_000_000
    else { return monotonic }
    let elapsedNanoseconds = UInt64(end.nanoseconds - start.nanoseconds)
    let elapsedTicks = end.ticks - start.ticks
    // Plausible counters run between 1 MHz and 10 GHz (1,000 to 0.1 ns a tick).
    let perTick = (elapsedNanoseconds << 32) / elapsedTicks
    guard perTick >= (1 << 32) / 10, perTick <= 1_000 << 32 else { return monotonic }
    return MetricsClock(usesCycleCounter: true, nanosecondsPerTick: perTick)
  }

  /// A counter reading and a `CLOCK_MONOTONIC` reading taken together (the counter read on both
  /// sides of the clock, retried until the two sides are close: not preempted in between), once
  /// the clock reaches `after`. Nil when no close pair came in a thousand tries.
  private static func pairedReading(after: Int64 = 0) -> (ticks: UInt64, nanoseconds: Int64)? {
    while LoopClock.monotonicNanoseconds() < after {}
    var best: (ticks: UInt64, nanoseconds: Int64, width: UInt64)?
    for _ in 0..<1_000 {
      let opening = carl_cycle_counter()
      let nanoseconds = LoopClock.monotonicNanoseconds()
      let closing = carl_cycle_counter()
      guard closing > opening else { continue }
      let width = closing - opening
      if width < best?.width ?? UInt64.max { best = (opening + width / 2, nanoseconds, width) }
      // A pair taken within a few hundred cycles is as good as it gets.
      if width < 500 { break }
    }
    return best.map { ($0.ticks, $0.nanoseconds) }
  }

  /// Whether the kernel's current clock source is the cycle counter (`tsc` on x86-64,
  /// `arch_sys_counter` on arm64).
  private static func kernelKeepsTimeWithCycleCounter() -> Bool {
    let descriptor = open("/sys/devices/system/clocksource/clocksource0/current_clocksource", O_RDONLY | O_CLOEXEC)
    guard descriptor >= 0 else { return false }
    defer { close(descriptor) }
    var buffer = [UInt8](repeating: 0, count: 64)
    let count = buffer.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
    guard count > 0 else { return false }
    let name = String(decoding: buffer[0..<count], as: UTF8.self).trimmingSuffix(while: \.isWhitespace)
    return name == "tsc" || name == "arch_sys_counter"
  }
}

extension String {
  /// The string without its trailing characters that match `predicate`.
  fileprivate func trimmingSuffix(while predicate: (Character) -> Bool) -> String {
    var end = endIndex
    while end > startIndex, predicate(self[index(before: end)]) { end = index(before: end) }
    return String(self[..<end])
  }
}
