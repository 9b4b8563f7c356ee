import AsyncRunLoop
import Synchronization

// Issue 26: an actor pinned to a loop consuming a `SourceSequence` of the same loop, driven by a
// task that prefers the loop (the README's advice) or by a detached task. The stream-throughput
// peers `asyncrunloop-actor-preferring` and `asyncrunloop-actor-detached` time it; the extra
// scenario `sequence-consumer-counts` counts what the loop does per element (passes, sleeps),
// which is how the difference was explained (Benchmarks/results/analysis-preference-and-futex.md).

/// The consuming actor: counts `count` elements of `sequence`, then stops.
actor SequenceConsumer: LoopActor {
  nonisolated let loop: RunLoopThread

  init(loop: RunLoopThread) { self.loop = loop }

  func consume(_ sequence: SourceSequence<Int>, count: Int) async -> Int {
    var received = 0
    for await _ in sequence {
      received += 1
      if received == count { break }
    }
    return received
  }
}

/// Who drives the consuming actor (or, for `.taskPreferringLoop`, consumes without one).
enum ConsumerDriver: String, CaseIterable {
  /// `Task(executorPreference: loop) { await actor.consume(…) }`.
  case actorPreferringLoop = "actor-preferring"
  /// `Task.detached { await actor.consume(…) }`.
  case actorDetached = "actor-detached"
  /// `Task(executorPreference: loop) { for await … }`, no actor (stream-throughput's asyncrunloop).
  case taskPreferringLoop = "task-preferring"
}

/// Counts a loop's passes (beforeTimers) and the sleeps it woke from (afterWaiting) with an
/// observer in the common modes. The observer's callouts cost a little: only for counting.
final class PassCounter: Sendable {
  private final class Counts: Sendable {
    let passes = Atomic<Int>(0)
    let wakeUps = Atomic<Int>(0)
  }

  private let counts = Counts()
  private let observer: LoopObserver

  init(on loop: RunLoopThread) {
    let counts = self.counts
    observer = LoopObserver(activities: [.beforeTimers, .afterWaiting]) { _, activity in
      if activity == .beforeTimers {
        counts.passes.add(1, ordering: .relaxed)
      } else {
        counts.wakeUps.add(1, ordering: .relaxed)
      }
    }
    loop.add(observer, to: .common)
  }

  /// Passes and wake-ups so far. Read after the counted work finished (a `performAndWait` on the
  /// loop orders it).
  var passes: Int { counts.passes.load(ordering: .relaxed) }
  var wakeUps: Int { counts.wakeUps.load(ordering: .relaxed) }

  func remove() { observer.invalidate() }
}

/// stream-throughput's actor peers, and sequence-consumer-counts: the measuring thread posts
/// `count` elements as fast as it can into a fresh sequence, consumed as `driver` says; elements
/// per second from the first post to the last element consumed. With `counting`, also passes and
/// wake-ups of the loop per element (extras `passes_per_element`, `wakeups_per_element`).
final class ActorConsumerThroughput: FigureSession {
  private let loop: RunLoopThread
  private let driver: ConsumerDriver
  private let counting: Bool
  private var budget: ThroughputBudget

  init(pin: PinPlan, driver: ConsumerDriver, budget: ThroughputBudget, counting: Bool = false) {
    self.driver = driver
    self.budget = budget
    self.counting = counting
    loop = try! RunLoopThread(name: "actor-consumer", cpu: pin.serverCPU)
  }

  func measure() -> Figure {
    let sequence = loop.sourceSequence(of: Int.self)
    let consumer = SequenceConsumer(loop: loop)
    let counter = counting ? PassCounter(on: loop) : nil
    if counting { loop.setMetricsEnabled(true) }
    _ = try? loop.performAndWait {}  // the observer is in before the first element
    let (passesBefore, wakeUpsBefore) = (counter?.passes ?? 0, counter?.wakeUps ?? 0)
    let metricsBefore = counting ? loop.metrics : LoopMetrics()
    let finished = Handoff<Int64>()
    let count = budget.count
    let task: Task<Void, Never>
    switch driver {
    case .actorPreferringLoop:
      task = Task(executorPreference: loop) {
        _ = await consumer.consume(sequence, count: count)
        finished.put(monotonicNanoseconds())
      }
    case .actorDetached:
      task = Task.detached {
        _ = await consumer.consume(sequence, count: count)
        finished.put(monotonicNanoseconds())
      }
    case .taskPreferringLoop:
      task = Task(executorPreference: loop) {
        var received = 0
        for await _ in sequence {
          received += 1
          if received == count { break }
        }
        finished.put(monotonicNanoseconds())
      }
    }
    let start = monotonicNanoseconds()
    for index in 0..<count { _ = sequence.post(index) }
    let end = finished.take()
    blockingAwait { await task.value }
    let rate = Double(count) / (Double(end - start) / 1e9)
    budget.record(rate: rate)
    var extras: [(String, Double)] = [("elements", Double(count))]
    if let counter {
      _ = try? loop.performAndWait {}
      extras.append(("passes_per_element", Double(counter.passes - passesBefore) / Double(count)))
      extras.append(("wakeups_per_element", Double(counter.wakeUps - wakeUpsBefore) / Double(count)))
      let metrics = loop.metrics - metricsBefore
      extras.append(("jobs_per_element", Double(metrics.jobs) / Double(count)))
      extras.append(("source_firings_per_element", Double(metrics.sourcesFired) / Double(count)))
      loop.setMetricsEnabled(false)
      counter.remove()
    }
    return Figure(value: rate, extras: extras)
  }

  func close() { loop.shutdownAndWait() }
}

enum ConsumerScenarios {
  /// Extra (`--only sequence-consumer-counts`): elements/s and the loop's passes and wake-ups per
  /// element for each way of consuming, with a counting observer on the loop.
  static func counts(_ context: BenchmarkContext) -> ScenarioResult {
    let pin = context.pin
    let budget = ThroughputBudget(mode: context.mode)
    return runFigureScenario(
      "sequence-consumer-counts", unit: "ops/s",
      notes: [
        "a thread posts Ints into a SourceSequence as fast as it can; consumed by an actor pinned to the loop"
          + " (driven by a task preferring the loop, or a detached task) or by a task preferring the loop",
        "passes_per_element / wakeups_per_element: the loop's passes (beforeTimers) and sleeps ended"
          + " (afterWaiting) per element, counted by an observer (which costs a little)",
        "jobs_per_element / source_firings_per_element: executor jobs the loop ran and firings of the"
          + " sequence's source, from the loop's metrics (on while counting: each job and firing is timed)",
      ],
      peers: ConsumerDriver.allCases.map { driver in
        PeerSpec(
          name: driver.rawValue,
          open: { ActorConsumerThroughput(pin: pin, driver: driver, budget: budget, counting: true) })
      },
      warmUp: true, repetitions: context.mode.repetitions)
  }
}
