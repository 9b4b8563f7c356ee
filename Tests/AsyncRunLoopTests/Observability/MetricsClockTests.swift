import Glibc
import Testing

@testable import AsyncRunLoop

/// The metrics clock's readings convert to the nanoseconds `LoopClock` measures: the histograms
/// are in nanoseconds whichever counter backs them.
@Suite("Metrics clock")
struct MetricsClockTests {
  @Test func anIntervalConvertsToTheNanosecondsLoopClockMeasures() throws {
    let clock = MetricsClock.shared
    let start = try #require(pairedReading(clock))
    usleep(50_000)
    let end = try #require(pairedReading(clock))
    let measured = Double(clock.nanoseconds(end.ticks - start.ticks))
    let reference = Double(end.nanoseconds - start.nanoseconds)
    // The same interval, read on two clocks: within 1% (the pairs are taken within microseconds).
    #expect(abs(measured - reference) < reference / 100, "\(measured) ns against \(reference) ns")
  }

  @Test func conversionScalesSaturatesAndNeverGoesNegative() {
    let halfNanosecondTicks = MetricsClock(usesCycleCounter: true, nanosecondsPerTick: 1 << 31)
    #expect(halfNanosecondTicks.nanoseconds(1_000) == 500)
    #expect(halfNanosecondTicks.nanoseconds(-5) == 0)
    #expect(halfNanosecondTicks.nanoseconds(0) == 0)
    let slowTicks = MetricsClock(usesCycleCounter: true, nanosecondsPerTick: 1_000 << 32)
    #expect(slowTicks.nanoseconds(Int64.max) == Int64.max)
    let nanosecondTicks = MetricsClock(usesCycleCounter: false, nanosecondsPerTick: 1 << 32)
    #expect(nanosecondTicks.nanoseconds(123_456_789) == 123_456_789)
  }

  @Test func theCycleCounterIsUsedOnlyWhereTheKernelKeepsTimeWithIt() throws {
    let source = try currentClockSource()
    let expected = source == "tsc" || source == "arch_sys_counter"
    #expect(MetricsClock.shared.usesCycleCounter == expected, "kernel clock source \(source)")
  }

  /// A metrics reading and a `LoopClock` reading taken together (not preempted in between).
  private func pairedReading(_ clock: MetricsClock) -> (ticks: Int64, nanoseconds: Int64)? {
    var best: (ticks: Int64, nanoseconds: Int64, width: Int64)?
    for _ in 0..<10_000 {
      let opening = clock.now()
      let nanoseconds = LoopClock.monotonicNanoseconds()
      let closing = clock.now()
      let width = clock.nanoseconds(closing - opening)
      if width < best?.width ?? Int64.max { best = (opening + (closing - opening) / 2, nanoseconds, width) }
      if width < 2_000 { break }
    }
    return best.map { ($0.ticks, $0.nanoseconds) }
  }

  private func currentClockSource() throws -> String {
    let descriptor = open("/sys/devices/system/clocksource/clocksource0/current_clocksource", O_RDONLY)
    try #require(descriptor >= 0)
    defer { close(descriptor) }
    var buffer = [UInt8](repeating: 0, count: 64)
    let count = buffer.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
    try #require(count > 0)
    return String(decoding: buffer[0..<count], as: UTF8.self).split(separator: "\n").first.map(String.init) ?? ""
  }
}
