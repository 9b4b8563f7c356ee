import AsyncRunLoop
import Dispatch

// stream-rtt and stream-throughput: elements handed from a plain thread to a `for await`
// consumer running on a loop thread (a task whose executor preference is the loop). The same
// shape for every peer: only the sequence differs.

/// stream-rtt / asyncrunloop: the measuring thread posts into a `SourceSequence` (a custom source
/// on the loop: post = buffer + signal + wake); the consumer rings the reply eventfd.
final class SourceSequenceRTT: LatencySession {
  private let reply = ReplyDoorbell()
  private let loop: RunLoopThread
  private let sequence: SourceSequence<UInt32>
  private let consumer: Task<Void, Never>
  private let epollMembers: EpollPathMembers?
  private let settled: Bool

  /// The loop on `path` (see `LoopPath`); `settled` false: back-to-back round trips.
  init(pin: PinPlan, path: LoopPath = .futex, settled: Bool = true) {
    self.settled = settled
    loop = try! RunLoopThread(name: "stream-server", cpu: pin.serverCPU)
    let sequence = loop.sourceSequence(of: UInt32.self)
    self.sequence = sequence
    consumer = Task(executorPreference: loop) { [reply] in
      for await _ in sequence { reply.ring() }
    }
    epollMembers = EpollPathMembers.place(loop, on: path)
  }

  func measure(_ count: Int) -> [Double] {
    sampleRoundTrips(count, settle: settled ? reply.waitUntilRingerSleeps : {}) {
      _ = sequence.post(1)
      reply.wait()
    }
  }

  func close() {
    sequence.invalidate()
    let consumer = self.consumer
    blockingAwait { await consumer.value }
    epollMembers?.remove()
    loop.shutdownAndWait()
    reply.close()
  }
}

/// stream-rtt / asyncstream: the same through `AsyncStream` (unbounded); the measuring thread
/// calls `continuation.yield`. With `onLoop` false (the extra peer
/// `asyncstream-default-executor`) the consumer task runs on the default executor instead.
final class AsyncStreamRTT: LatencySession {
  private let reply = ReplyDoorbell()
  private let loop: RunLoopThread?
  private let continuation: AsyncStream<UInt32>.Continuation
  private let consumer: Task<Void, Never>
  private let settled: Bool

  init(pin: PinPlan, onLoop: Bool = true, settled: Bool = true) {
    self.settled = settled
    let loop = onLoop ? try! RunLoopThread(name: "asyncstream", cpu: pin.serverCPU) : nil
    self.loop = loop
    let (stream, continuation) = AsyncStream.makeStream(of: UInt32.self)
    self.continuation = continuation
    consumer = Task(executorPreference: loop) { [reply] in
      for await _ in stream { reply.ring() }
    }
  }

  func measure(_ count: Int) -> [Double] {
    sampleRoundTrips(count, settle: settled ? reply.waitUntilRingerSleeps : {}) {
      continuation.yield(1)
      reply.wait()
    }
  }

  func close() {
    continuation.finish()
    let consumer = self.consumer
    blockingAwait { await consumer.value }
    loop?.shutdownAndWait()
    reply.close()
  }
}

/// stream-throughput / asyncrunloop: the measuring thread (client CPU) posts `count` elements as
/// fast as it can into a fresh `SourceSequence`; the consumer (on the loop, server CPU) counts
/// them; elements per second from the first post to the last element consumed.
final class SourceSequenceThroughput: FigureSession {
  private let loop: RunLoopThread
  private var budget: ThroughputBudget

  init(pin: PinPlan, budget: ThroughputBudget) {
    self.budget = budget
    loop = try! RunLoopThread(name: "stream-tput", cpu: pin.serverCPU)
  }

  func measure() -> Figure {
    let sequence = loop.sourceSequence(of: Int.self)
    let finished = Handoff<Int64>()
    let count = budget.count
    let consumer = Task(executorPreference: loop) {
      var received = 0
      for await _ in sequence {
        received += 1
        if received == count { break }
      }
      finished.put(monotonicNanoseconds())
    }
    let start = monotonicNanoseconds()
    for index in 0..<count { _ = sequence.post(index) }
    let end = finished.take()
    blockingAwait { await consumer.value }
    let rate = Double(count) / (Double(end - start) / 1e9)
    budget.record(rate: rate)
    return Figure(value: rate, extras: [("elements", Double(count))])
  }

  func close() { loop.shutdownAndWait() }
}

/// stream-throughput / asyncstream: the same through `AsyncStream` (unbounded buffer). With
/// `onLoop` false (`asyncstream-default-executor`) the consumer runs on the default executor.
final class AsyncStreamThroughput: FigureSession {
  private let loop: RunLoopThread?
  private var budget: ThroughputBudget

  init(pin: PinPlan, budget: ThroughputBudget, onLoop: Bool = true) {
    self.budget = budget
    loop = onLoop ? try! RunLoopThread(name: "asyncstream-tp", cpu: pin.serverCPU) : nil
  }

  func measure() -> Figure {
    let (stream, continuation) = AsyncStream.makeStream(of: Int.self)
    let finished = Handoff<Int64>()
    let count = budget.count
    let consumer = Task(executorPreference: loop) {
      var received = 0
      for await _ in stream {
        received += 1
        if received == count { break }
      }
      finished.put(monotonicNanoseconds())
    }
    let start = monotonicNanoseconds()
    for index in 0..<count { continuation.yield(index) }
    let end = finished.take()
    continuation.finish()
    blockingAwait { await consumer.value }
    let rate = Double(count) / (Double(end - start) / 1e9)
    budget.record(rate: rate)
    return Figure(value: rate, extras: [("elements", Double(count))])
  }

  func close() { loop?.shutdownAndWait() }
}

/// How many elements a throughput run posts: the first run (the warm-up) uses a calibration
/// count; later runs post as many as the measured rate delivers in the mode's target duration
/// (capped), so a slow peer does not take minutes and a fast one is not measured over too few.
struct ThroughputBudget {
  private(set) var count: Int
  private let targetSeconds: Double
  private let maximum: Int

  init(mode: RunMode) {
    count = mode.streamCalibrationElements
    targetSeconds = mode.streamTargetSeconds
    maximum = mode.streamMaximumElements
  }

  mutating func record(rate: Double) {
    count = max(10_000, min(maximum, Int(rate * targetSeconds)))
  }
}

enum StreamScenarios {
  static func streamRTT(_ context: BenchmarkContext) -> ScenarioResult {
    stream("stream-rtt", context, settled: true)
  }

  /// stream-rtt back-to-back: the next element goes out as soon as the reply arrived.
  static func streamRTTBackToBack(_ context: BenchmarkContext) -> ScenarioResult {
    stream("stream-rtt-b2b", context, settled: false)
  }

  private static func stream(_ name: String, _ context: BenchmarkContext, settled: Bool) -> ScenarioResult {
    let pin = context.pin
    return runLatencyScenario(
      name, floor: "floor-futex",
      notes: [
        "client thread hands an element to a `for await` consumer in a task on a loop thread; the consumer "
          + "rings the client's reply eventfd; µs per round trip (floors: the wake-rtt floors)",
        settled
          ? "before each round trip the client waits until the consumer's thread sleeps, as in wake-rtt"
          : "back-to-back: no wait between round trips; the consumer's loop may still be awake",
        "asyncrunloop: futex path (the loop holds only the sequence's source) — matched floor floor-futex;"
          + " asyncrunloop-epoll: epoll path (a timer and a descriptor registered) — matched floor floor-epoll;"
          + " asyncstream: its consumer on a futex-path loop, woken the same way as asyncrunloop's",
        "asyncstream-default-executor (extra): the AsyncStream consumer task on the default executor",
      ],
      peers: [
        PeerSpec(name: "asyncrunloop", open: { SourceSequenceRTT(pin: pin, path: .futex, settled: settled) }),
        PeerSpec(name: "asyncrunloop-epoll", open: { SourceSequenceRTT(pin: pin, path: .epoll, settled: settled) }),
        PeerSpec(name: "asyncstream", open: { AsyncStreamRTT(pin: pin, settled: settled) }),
        PeerSpec(name: "floor-eventfd", open: { FloorWake(pin: pin, sleepingIn: .read, settled: settled) }),
        PeerSpec(name: "floor-futex", open: { FloorWake(pin: pin, sleepingIn: .futex, settled: settled) }),
        PeerSpec(name: "floor-epoll", open: { FloorWake(pin: pin, sleepingIn: .epoll, settled: settled) }),
        PeerSpec(
          name: "asyncstream-default-executor", open: { AsyncStreamRTT(pin: pin, onLoop: false, settled: settled) }),
      ],
      mode: context.mode)
  }

  static func streamThroughput(_ context: BenchmarkContext) -> ScenarioResult {
    let pin = context.pin
    let budget = ThroughputBudget(mode: context.mode)
    return runFigureScenario(
      "stream-throughput", unit: "ops/s", floor: nil,
      notes: [
        "one producer thread posts Ints as fast as it can; one `for await` consumer in a task on a loop;"
          + " elements/s from the first post to the last element consumed",
        "each run posts what the peer's warm-up rate delivers in \(context.mode.streamTargetSeconds) s"
          + " (at most \(context.mode.streamMaximumElements)); elements = the largest run",
        "asyncstream-default-executor (extra): the AsyncStream consumer task on the default executor",
        "asyncrunloop-actor-preferring / -detached: an actor pinned to the loop consumes, driven by"
          + " Task(executorPreference: loop) / Task.detached",
      ],
      peers: [
        PeerSpec(name: "asyncrunloop", open: { SourceSequenceThroughput(pin: pin, budget: budget) }),
        PeerSpec(name: "asyncstream", open: { AsyncStreamThroughput(pin: pin, budget: budget) }),
        PeerSpec(
          name: "asyncstream-default-executor",
          open: { AsyncStreamThroughput(pin: pin, budget: budget, onLoop: false) }),
        PeerSpec(
          name: "asyncrunloop-actor-preferring",
          open: { ActorConsumerThroughput(pin: pin, driver: .actorPreferringLoop, budget: budget) }),
        PeerSpec(
          name: "asyncrunloop-actor-detached",
          open: { ActorConsumerThroughput(pin: pin, driver: .actorDetached, budget: budget) }),
      ],
      warmUp: true, repetitions: context.mode.repetitions)
  }
}
