import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

/// The missed-tick policies as plain arithmetic: a deterministic clock (numbers), no sleeping.
@Suite("Sequence: tick schedule (deterministic clock)")
struct SequenceTickScheduleTests {
  /// Takes every ready tick as (scheduled, skipped) pairs.
  static func drain(_ schedule: inout TickSchedule) -> [(Int64, Int)] {
    var ticks: [(Int64, Int)] = []
    while let tick = schedule.take() { ticks.append((tick.scheduled.nanoseconds, tick.skipped)) }
    return ticks
  }

  static func same(_ lhs: [(Int64, Int)], _ rhs: [(Int64, Int)]) -> Bool {
    lhs.count == rhs.count && zip(lhs, rhs).allSatisfy { $0 == $1 }
  }

  @Test(arguments: [MissedTickPolicy.skip, .burst, .delay])
  func onTimeFiresGiveOneTickPerInterval(policy: MissedTickPolicy) {
    var schedule = TickSchedule(firstDue: 10, interval: 10, policy: policy)
    for due in stride(from: Int64(10), through: 50, by: 10) {
      #expect(schedule.fire(now: due) == due + 10)
      #expect(Self.same(Self.drain(&schedule), [(due, 0)]))
    }
  }

  @Test func skipFoldsMissedTicksIntoOneAndStaysOnTheGrid() {
    var schedule = TickSchedule(firstDue: 10, interval: 10, policy: .skip)
    _ = schedule.fire(now: 10)
    _ = Self.drain(&schedule)
    #expect(schedule.fire(now: 45) == 50)  // 20, 30, 40 were due: the next grid point after 45
    #expect(Self.same(Self.drain(&schedule), [(20, 2)]))
    #expect(schedule.fire(now: 50) == 60)
    #expect(Self.same(Self.drain(&schedule), [(50, 0)]))
  }

  @Test func burstDeliversEveryMissedTickThenStaysOnTheGrid() {
    var schedule = TickSchedule(firstDue: 10, interval: 10, policy: .burst)
    _ = schedule.fire(now: 10)
    _ = Self.drain(&schedule)
    #expect(schedule.fire(now: 45) == 50)
    #expect(Self.same(Self.drain(&schedule), [(20, 0), (30, 0), (40, 0)]))
    #expect(schedule.fire(now: 51) == 60)
    #expect(Self.same(Self.drain(&schedule), [(50, 0)]))
  }

  @Test func delayRestartsThePeriodFromTheLateFire() {
    var schedule = TickSchedule(firstDue: 10, interval: 10, policy: .delay)
    _ = schedule.fire(now: 10)
    _ = Self.drain(&schedule)
    #expect(schedule.fire(now: 45) == 55)  // off the grid: one interval after the late fire
    #expect(Self.same(Self.drain(&schedule), [(20, 2)]))
    #expect(schedule.fire(now: 55) == 65)
    #expect(Self.same(Self.drain(&schedule), [(55, 0)]))
  }

  @Test func aSlowConsumerMissesTicksAccordingToThePolicy() {
    // The loop fires on time at 10, 20, 30; the consumer takes nothing until after the third.
    var skip = TickSchedule(firstDue: 10, interval: 10, policy: .skip)
    var burst = TickSchedule(firstDue: 10, interval: 10, policy: .burst)
    var delay = TickSchedule(firstDue: 10, interval: 10, policy: .delay)
    for now in [Int64(10), 20, 30] {
      _ = skip.fire(now: now)
      _ = burst.fire(now: now)
      _ = delay.fire(now: now)
    }
    #expect(Self.same(Self.drain(&skip), [(10, 2)]))  // one tick for three due instants
    #expect(Self.same(Self.drain(&burst), [(10, 0), (20, 0), (30, 0)]))  // each delivered
    #expect(Self.same(Self.drain(&delay), [(10, 2)]))
  }

  @Test func aLateFirstFireIsHandledLikeAnyOther() {
    var schedule = TickSchedule(firstDue: 100, interval: 25, policy: .skip)
    #expect(schedule.fire(now: 180) == 200)  // 100, 125, 150, 175 due
    #expect(Self.same(Self.drain(&schedule), [(100, 3)]))
  }

  @Test func aFireBeforeTheDueInstantCountsAsOnTime() {
    var schedule = TickSchedule(firstDue: 100, interval: 10, policy: .delay)
    #expect(schedule.fire(now: 90) == 110)
    #expect(Self.same(Self.drain(&schedule), [(100, 0)]))
  }

  @Test func aOneShotTicksOnceAtItsDueInstant() {
    var schedule = TickSchedule(firstDue: 100, interval: nil, policy: .skip)
    #expect(schedule.fire(now: 130) == nil)
    #expect(schedule.fire(now: 140) == nil)  // a stray second fire adds nothing
    #expect(Self.same(Self.drain(&schedule), [(100, 0)]))
  }

  @Test(arguments: [MissedTickPolicy.skip, .burst, .delay])
  func hugeLatenessSaturatesInsteadOfOverflowing(policy: MissedTickPolicy) {
    var schedule = TickSchedule(firstDue: 1, interval: 3, policy: policy)
    let next = schedule.fire(now: Int64.max - 1)
    #expect(next != nil)
    #expect(schedule.take() != nil)
  }
}

/// The timer sequence's state machine as a value (waiters are string tokens).
@Suite("Sequence: timer state machine")
struct SequenceTimerStateMachineTests {
  typealias Machine = TimerSequenceStateMachine<String>

  @Test func aWaitingConsumerIsResumedByTheNextFire() {
    var machine = Machine(schedule: TickSchedule(firstDue: 10, interval: 10, policy: .skip))
    guard case .suspend = machine.takeBatch(), case .suspended = machine.suspendConsumer("c") else {
      Issue.record("a consumer with nothing due did not wait")
      return
    }
    guard case .fired(20, "c") = machine.fire(now: 10) else {
      Issue.record("the fire did not resume the consumer and reschedule")
      return
    }
    guard case .took(let ticks, _) = machine.takeBatch() else {
      Issue.record("no tick after the fire")
      return
    }
    #expect(ticks.count == 1)
    #expect(ticks.first == LoopTick(scheduled: LoopClock.Instant(nanoseconds: 10)))
  }

  @Test func ticksDueBeforeTheTimerEndsAreDeliveredThenTheSequenceEnds() {
    var machine = Machine(schedule: TickSchedule(firstDue: 10, interval: nil, policy: .skip))
    guard case .fired(nil, nil) = machine.fire(now: 10) else {
      Issue.record("a one-shot asked to reschedule")
      return
    }
    guard case .end(nil, _) = machine.memberEnded() else {
      Issue.record("invalidation did not end the machine")
      return
    }
    guard case .took = machine.takeBatch(), case .end = machine.takeBatch() else {
      Issue.record("the last tick was not delivered before the end")
      return
    }
  }

  @Test func invalidationWakesAWaitingConsumerToEnd() {
    var machine = Machine(schedule: TickSchedule(firstDue: 10, interval: 10, policy: .skip))
    _ = machine.suspendConsumer("c")
    guard case .end("c", _) = machine.memberEnded(), case .end = machine.takeBatch() else {
      Issue.record("a waiting consumer was not ended")
      return
    }
    guard case .ignore = machine.fire(now: 10) else {
      Issue.record("a fire after the end produced a tick")
      return
    }
  }

  @Test func stoppingInvalidatesTheTimerOnce() {
    var machine = Machine(schedule: TickSchedule(firstDue: 10, interval: 10, policy: .burst))
    _ = machine.suspendConsumer("c")
    guard case .stop("c", true, _) = machine.stopConsuming(), case .none = machine.stopConsuming() else {
      Issue.record("stop did not resume once and invalidate once")
      return
    }
    guard case .none = machine.memberEnded() else {
      Issue.record("the invalidation that follows a stop resumed again")
      return
    }
  }
}

/// Timer sequences on real loops.
@Suite("Sequence: timer sequences on a loop")
struct SequenceTimerTests {
  @Test func aRepeatingTimerTicksOnItsGridAndNeverEarly() async throws {
    let loop = try RunLoopThread(name: "seq-timer")
    defer { loop.shutdownAndWait() }
    let interval = Duration.milliseconds(5)
    let ticks = loop.timer(every: interval, missedTicks: .skip)
    let received = try await withWatchdog(timeout: .seconds(20), "5 ticks") {
      await consumeOnLoop(loop) { () async -> [(LoopTick, LoopClock.Instant)] in
        var received: [(LoopTick, LoopClock.Instant)] = []
        for await tick in ticks {
          received.append((tick, .now))
          if received.count == 5 { break }
        }
        return received
      }
    }
    let values = try #require(received)
    let step = interval.saturatedNanoseconds
    let first = values[0].0.scheduled.nanoseconds
    for (tick, handled) in values {
      #expect((tick.scheduled.nanoseconds - first) % step == 0, "off the grid: \(tick)")
      #expect(handled >= tick.scheduled, "handled before it was due: \(tick)")
    }
    #expect(!ticks.timer.isValid)  // breaking out released the timer
  }

  @Test func aOneShotTimerTicksOnceThenEnds() async throws {
    let loop = try RunLoopThread(name: "seq-oneshot")
    defer { loop.shutdownAndWait() }
    let deadline = LoopClock.Instant.now.advanced(by: .milliseconds(5))
    for sequence in [loop.timer(at: deadline), loop.timer(after: .milliseconds(5))] {
      let ticks = try await withWatchdog(timeout: .seconds(10), "one-shot") { () async -> [LoopTick] in
        var ticks: [LoopTick] = []
        for await tick in sequence { ticks.append(tick) }
        return ticks
      }
      #expect(ticks?.count == 1)
      #expect(ticks?.first.map { $0.scheduled <= .now } == true)
    }
    let ticks = loop.timer(at: deadline)
    _ = try await withWatchdog(timeout: .seconds(10), "one-shot at") { () async -> Bool in
      for await _ in ticks {}
      return true
    }
    #expect(deadline <= .now)
  }

  /// The interval of the busy-loop tests' timers.
  private static let busyInterval = Duration.milliseconds(5)

  /// The first `count` ticks of a `busyInterval` timer with `policy`, taken by a consumer on a new
  /// loop that, after the first tick, keeps the loop busy for 12 intervals.
  private static func ticksAfterABusySpell(
    loopName: String, policy: MissedTickPolicy, count: Int, _ what: String,
    sourceLocation: SourceLocation = #_sourceLocation
  ) async throws -> [LoopTick]? {
    let loop = try RunLoopThread(name: loopName)
    defer { loop.shutdownAndWait() }
    let ticks = loop.timer(every: busyInterval, missedTicks: policy)
    return try await withWatchdog(timeout: .seconds(20), what, sourceLocation: sourceLocation) {
      await consumeOnLoop(loop) { () async -> [LoopTick] in
        var values: [LoopTick] = []
        for await tick in ticks {
          values.append(tick)
          if values.count == 1 { usleep(60_000) }  // keep the loop busy for 12 intervals
          if values.count == count { break }
        }
        return values
      }
    }
  }

  @Test func aLoopThatWasBusySkipsTicksAndStaysOnTheGrid() async throws {
    let values = try await Self.ticksAfterABusySpell(
      loopName: "seq-skip", policy: .skip, count: 2, "skip on a busy loop")
    let pair = try #require(values)
    #expect(pair[1].skipped >= 5, "\(pair)")
    let step = Self.busyInterval.saturatedNanoseconds
    #expect((pair[1].scheduled.nanoseconds - pair[0].scheduled.nanoseconds) % step == 0)
  }

  @Test func aLoopThatWasBusyBurstsThroughEveryMissedTick() async throws {
    let values = try await Self.ticksAfterABusySpell(
      loopName: "seq-burst", policy: .burst, count: 8, "burst on a busy loop")
    let burst = try #require(values)
    let step = Self.busyInterval.saturatedNanoseconds
    for (earlier, later) in zip(burst, burst.dropFirst()) {
      #expect(later.scheduled.nanoseconds - earlier.scheduled.nanoseconds == step, "\(burst)")
    }
    #expect(burst.allSatisfy { $0.skipped == 0 })
  }

  @Test func cancellingTheConsumerEndsItPromptlyAndReleasesTheTimer() async throws {
    let loop = try RunLoopThread(name: "seq-timer-cancel")
    defer { loop.shutdownAndWait() }
    let ticks = loop.timer(every: .seconds(3600))
    let consumer = Task(executorPreference: loop) { () async -> Int in
      var count = 0
      for await _ in ticks { count += 1 }
      return count
    }
    try await Task.sleep(for: .milliseconds(10))
    consumer.cancel()
    let count = try await withWatchdog(timeout: .seconds(10), "cancelled timer consumer") { await consumer.value }
    #expect(count == 0)
    #expect(!ticks.timer.isValid)
  }

  @Test func invalidatingOrShuttingDownEndsAWaitingConsumer() async throws {
    for shutDown in [false, true] {
      let loop = try RunLoopThread(name: "seq-timer-end")
      let ticks = loop.timer(every: .seconds(3600))
      let consumer = Task { () async -> Int in
        var count = 0
        for await _ in ticks { count += 1 }
        return count
      }
      try await Task.sleep(for: .milliseconds(10))
      if shutDown { loop.shutdown() } else { ticks.invalidate() }
      let count = try await withWatchdog(timeout: .seconds(10), "timer consumer, shutdown \(shutDown)") {
        await consumer.value
      }
      #expect(count == 0)
      loop.shutdownAndWait()
    }
  }

  @Test func aTimerRestrictedToAModeTicksOnlyWhileTheLoopRunsIt() async throws {
    let loop = try RunLoopThread(name: "seq-timer-mode")
    defer { loop.shutdownAndWait() }
    let tracking = RunLoopMode("tracking")
    let ticks = loop.timer(every: .milliseconds(2), modes: [tracking])
    let count = Atomic<Int>(0)
    let consumer = Task(executorPreference: loop) {
      for await _ in ticks { count.wrappingAdd(1, ordering: .relaxed) }
    }
    try await Task.sleep(for: .milliseconds(30))
    #expect(count.load(ordering: .relaxed) == 0)  // the loop runs .default
    loop.perform(inModes: [.default]) { loop.run(mode: tracking, for: .milliseconds(40)) }
    await eventually("ticks in the tracking mode") { count.load(ordering: .relaxed) > 0 }
    ticks.invalidate()
    _ = try await withWatchdog(timeout: .seconds(10), "consumer end") { await consumer.value }
  }

  @Test func aTimerSequenceOnAShutDownLoopEndsAtOnce() async throws {
    let loop = try RunLoopThread(name: "seq-timer-dead")
    loop.shutdownAndWait()
    let ticks = loop.timer(every: .milliseconds(1))
    let ended = try await withWatchdog(timeout: .seconds(10), "timer on a dead loop") { () async -> Bool in
      for await _ in ticks { return false }
      return true
    }
    #expect(ended == true)
  }

  @Test func aSecondIteratorTraps() async {
    await #expect(processExitsWith: .failure) {
      let loop = try RunLoopThread(name: "seq-timer-trap")
      let ticks = loop.timer(every: .seconds(1))
      _ = ticks.makeAsyncIterator()
      _ = ticks.makeAsyncIterator()
    }
  }
}
