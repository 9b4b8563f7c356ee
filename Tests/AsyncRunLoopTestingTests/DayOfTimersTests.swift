import AsyncRunLoop
import AsyncRunLoopTesting
import Testing

/// A day of virtual time with 10,000 timers (one-shot and repeating, many sharing a date) runs in
/// one `advance`, every fire at its date and in the order a model of the timer heap gives:
/// (date, scheduling sequence), where a repeating timer is scheduled again as it fires.
@Suite("A day of virtual timers", .timeLimit(.minutes(5)))
struct DayOfTimersTests {
  /// One timer of the plan: first date (ms from the origin) and repeat interval (ms), if any.
  struct PlannedTimer {
    var id: Int
    var firstMilliseconds: Int64
    var intervalMilliseconds: Int64?
  }

  /// A deterministic plan: a fixed-seed generator, dates on a coarse grid (so many coincide), one
  /// timer in twenty repeating.
  static func plan(count: Int, horizonMilliseconds: Int64) -> [PlannedTimer] {
    var state: UInt64 = 0x9E37_79B9_7F4A_7C15
    func next() -> UInt64 {
      state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
      return state >> 33
    }
    let grid: Int64 = 60_000  // one minute: ~1,440 distinct dates for 9,500 one-shot timers
    return (0..<count).map { id in
      let first = Int64(next() % UInt64(horizonMilliseconds / grid)) * grid + grid
      let repeats = next() % 20 == 0
      let interval = repeats ? Int64(next() % 60 + 1) * grid : nil
      return PlannedTimer(id: id, firstMilliseconds: first, intervalMilliseconds: interval)
    }
  }

  /// The fires the plan must produce up to `horizon`, in order: a discrete-event model of the
  /// loop's heap ordered by (date, sequence); each fire of a repeating timer schedules it again
  /// with the next sequence.
  static func expectedFires(_ plan: [PlannedTimer], horizonMilliseconds: Int64) -> [String] {
    var pending = plan.enumerated().map { (date: $0.element.firstMilliseconds, sequence: $0.offset, timer: $0.element) }
    var sequence = plan.count
    var fires: [String] = []
    // A sorted array popped from the front is plenty for this size (the model is not under test).
    pending.sort { ($0.date, $0.sequence) < ($1.date, $1.sequence) }
    var index = 0
    while index < pending.count {
      let (date, _, timer) = pending[index]
      index += 1
      guard date <= horizonMilliseconds else { break }
      fires.append("\(timer.id)@\(date)")
      guard let interval = timer.intervalMilliseconds else { continue }
      let entry = (date: date + interval, sequence: sequence, timer: timer)
      sequence += 1
      let slot = pending[index...].firstIndex { ($0.date, $0.sequence) > (entry.date, entry.sequence) }
      pending.insert(entry, at: slot ?? pending.endIndex)
    }
    return fires
  }

  @Test func tenThousandTimersOverADayFireInExactOrderAtTheirDates() async throws {
    let virtual = try VirtualTimeLoop(name: "vt-day")
    defer { virtual.shutdownAndWait() }
    let loop = virtual.loop
    let day: Int64 = 86_400_000
    let plan = Self.plan(count: 10_000, horizonMilliseconds: day)
    let origin = virtual.now
    let log = EventLog()
    let late = EventLog()
    let timers = plan.map { planned in
      LoopTimer(
        fireAt: origin.advanced(by: .milliseconds(planned.firstMilliseconds)),
        repeatingEvery: planned.intervalMilliseconds.map { .milliseconds($0) }
      ) { timer in
        let now = loop.clock.now
        if now != timer.fireDate { late("\(planned.id): due \(timer.fireDate), ran \(now)") }
        log("\(planned.id)@\(timer.fireDate.virtualMilliseconds)")
      }
    }
    // Added on the loop thread in plan order: their scheduling sequences follow the plan.
    try loop.performAndWait { for timer in timers { loop.add(timer, to: .default) } }
    await virtual.advance(by: .milliseconds(day))
    let expected = Self.expectedFires(plan, horizonMilliseconds: day)
    let fires = log.entries
    #expect(fires.count == expected.count)
    #expect(fires == expected)
    #expect(late.entries.isEmpty)
    #expect(virtual.elapsedMilliseconds == day)
    #expect(plan.contains { $0.intervalMilliseconds != nil } && plan.contains { $0.intervalMilliseconds == nil })
    for timer in timers { timer.invalidate() }
  }
}
