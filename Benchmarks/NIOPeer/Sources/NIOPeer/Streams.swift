import AsyncRunLoop
import NIOCore
import NIOPosix
import Synchronization

// stream-rtt / stream-rtt-b2b (AsyncRunLoopBenchmarks' Streams.swift): the measuring thread hands
// an element to a `for await` consumer on a loop thread, which rings the reply eventfd. NIO has no
// source sequence; its peers are `execute {}` per item (the NIO idiom for handing work to a loop)
// and, as an extra, an `AsyncStream` consumed by an actor pinned to the NIO loop.
// stream-throughput: items posted from a thread as fast as it can, consumed on the loop.

/// stream-rtt / asyncrunloop: a `SourceSequence` consumed by `for await` in a task preferring the loop.
final class SourceSequenceRTT: LatencySession {
  private let reply = ReplyDoorbell()
  private let loop: RunLoopThread
  private let sequence: SourceSequence<UInt32>
  private let consumer: Task<Void, Never>
  private let epollMembers: EpollPathMembers?
  private let settled: Bool

  init(pin: PinPlan, path: LoopPath, settled: Bool) {
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

/// The consuming actor of nio-actor-asyncstream, pinned to a NIO event loop.
actor NIOStreamConsumer {
  private nonisolated let executor: any SerialExecutor
  nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }

  init(loop: any EventLoop) { executor = loop.executor }

  func consume(_ stream: AsyncStream<UInt32>, ringing reply: ReplyDoorbell) async {
    for await _ in stream { reply.ring() }
  }
}

/// stream-rtt / nio-actor-asyncstream: the client yields into an `AsyncStream`; an actor on the NIO
/// loop consumes it with `for await` (the continuation resumes the consumer on the loop).
final class NIOActorStreamRTT: LatencySession {
  private let reply = ReplyDoorbell()
  private let server: NIOLoop
  private let continuation: AsyncStream<UInt32>.Continuation
  private let consumer: Task<Void, Never>
  private let settled: Bool

  init(pin: PinPlan, settled: Bool) {
    self.settled = settled
    server = NIOLoop(cpu: pin.serverCPU)
    let (stream, continuation) = AsyncStream.makeStream(of: UInt32.self)
    self.continuation = continuation
    let actor = NIOStreamConsumer(loop: server.loop)
    consumer = Task.detached { [reply] in await actor.consume(stream, ringing: reply) }
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
    server.shutdown()
    reply.close()
  }
}

/// Counts items on the consuming thread and hands the time of the last one to the producer.
final class Countdown: @unchecked Sendable {
  // Safety: `received` is read and written only by the one consuming thread (the loop's).
  private var received = 0
  private let target: Int
  let finished = Handoff<Int64>()

  init(target: Int) { self.target = target }

  @inline(__always)
  func add(_ count: Int = 1) {
    received &+= count
    if received == target { finished.put(monotonicNanoseconds()) }
  }
}

/// How many items a throughput run posts: the warm-up calibrates; later runs post what the
/// measured rate delivers in `targetSeconds` (AsyncRunLoopBenchmarks' `ThroughputBudget`).
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

/// stream-throughput: one session type per peer kind, all timed from the first post to the last
/// item consumed.
final class ThroughputSession: FigureSession {
  enum Route {
    /// AsyncRunLoop `SourceSequence`, `for await` in a task preferring the loop.
    case sequence(LoopPath)
    /// AsyncRunLoop `CommandSource`: the handler counts.
    case command
    /// AsyncRunLoop `RunLoopThread.perform {}` per item.
    case perform
    /// NIO `EventLoop.execute {}` per item.
    case nioExecute
    /// A plain thread draining a mutex-guarded array, woken (on the empty → non-empty transition
    /// only) through a futex word or an eventfd in epoll_wait.
    case floor(LoopPath)
  }

  private let route: Route
  private let pin: PinPlan
  private var budget: ThroughputBudget
  private let loop: RunLoopThread?
  private let epollMembers: EpollPathMembers?
  private let nio: NIOLoop?

  init(pin: PinPlan, mode: RunMode, route: Route) {
    self.route = route
    self.pin = pin
    budget = ThroughputBudget(mode: mode)
    switch route {
    case .sequence(let path):
      let loop = try! RunLoopThread(name: "tput-server", cpu: pin.serverCPU)
      self.loop = loop
      epollMembers = EpollPathMembers.place(loop, on: path)
      nio = nil
    case .command, .perform:
      loop = try! RunLoopThread(name: "tput-server", cpu: pin.serverCPU)
      epollMembers = nil
      nio = nil
    case .nioExecute:
      loop = nil
      epollMembers = nil
      nio = NIOLoop(cpu: pin.serverCPU)
    case .floor:
      loop = nil
      epollMembers = nil
      nio = nil
    }
  }

  func measure() -> Double {
    let count = budget.count
    let (start, end): (Int64, Int64)
    switch route {
    case .sequence:
      (start, end) = runSequence(count)
    case .command:
      let countdown = Countdown(target: count)
      let source = CommandSource<Int> { _ in countdown.add() }
      loop!.add(source.source, to: .default)
      start = monotonicNanoseconds()
      for index in 0..<count { source.post(index) }
      end = countdown.finished.take()
      source.source.invalidate()
    case .perform:
      let loop = self.loop!
      let countdown = Countdown(target: count)
      start = monotonicNanoseconds()
      for _ in 0..<count { loop.perform { countdown.add() } }
      end = countdown.finished.take()
    case .nioExecute:
      let loop = nio!.loop
      let countdown = Countdown(target: count)
      start = monotonicNanoseconds()
      for _ in 0..<count { loop.execute { countdown.add() } }
      end = countdown.finished.take()
    case .floor(let path):
      (start, end) = runFloor(count, path: path)
    }
    let rate = Double(count) / (Double(end - start) / 1e9)
    budget.record(rate: rate)
    return rate
  }

  private func runSequence(_ count: Int) -> (Int64, Int64) {
    let sequence = loop!.sourceSequence(of: Int.self)
    let finished = Handoff<Int64>()
    let consumer = Task(executorPreference: loop!) {
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
    return (start, end)
  }

  private func runFloor(_ count: Int, path: LoopPath) -> (Int64, Int64) {
    let queue = Mutex<[Int]>([])
    let countdown = Countdown(target: count)
    let stop = StopFlag()
    let ring: @Sendable () -> Void
    let server: PlainThread
    let cleanup: () -> Void
    switch path {
    case .futex:
      let doorbell = FutexDoorbell()
      ring = { doorbell.ring() }
      cleanup = {}
      server = PlainThread(name: "floor-tput", cpu: pin.serverCPU) {
        var spare: [Int] = []
        var seen: UInt32 = 0
        while true {
          doorbell.wait(seen: &seen)
          if stop.isSet { return }
          queue.withLock { swap(&$0, &spare) }
          countdown.add(spare.count)
          spare.removeAll(keepingCapacity: true)
        }
      }
    case .epoll:
      let doorbell = EventDoorbell(nonBlocking: true)
      let epoll = EpollWaiter(watching: doorbell.descriptor)
      ring = { doorbell.ring() }
      cleanup = {
        epoll.close()
        doorbell.close()
      }
      server = PlainThread(name: "floor-tput", cpu: pin.serverCPU) {
        var spare: [Int] = []
        while true {
          epoll.wait()
          doorbell.drain()
          if stop.isSet { return }
          queue.withLock { swap(&$0, &spare) }
          countdown.add(spare.count)
          spare.removeAll(keepingCapacity: true)
        }
      }
    }
    let start = monotonicNanoseconds()
    for index in 0..<count {
      let first = queue.withLock { queue in
        queue.append(index)
        return queue.count == 1
      }
      if first { ring() }
    }
    let end = countdown.finished.take()
    stop.set()
    ring()
    server.join()
    cleanup()
    return (start, end)
  }

  func close() {
    epollMembers?.remove()
    loop?.shutdownAndWait()
    nio?.shutdown()
  }
}

enum StreamScenarios {
  static func streamRTT(_ pin: PinPlan, mode: RunMode, settled: Bool) -> ScenarioResult {
    runLatencyScenario(
      settled ? "stream-rtt" : "stream-rtt-b2b",
      notes: [
        "the client thread hands an element to a consumer on a loop thread, which rings the client's reply"
          + " eventfd; µs per round trip",
        settled
          ? "settled: the consumer's thread sleeps before each round trip"
          : "back-to-back: no wait between round trips; the consumer's loop may still be awake",
        "asyncrunloop: SourceSequence.post, `for await` in Task(executorPreference: loop);"
          + " nio-execute: EventLoop.execute {} per item (the reference);"
          + " nio-actor-asyncstream (extra): AsyncStream.yield, `for await` inside an actor on the NIO loop",
      ],
      peers: [
        PeerSpec(
          name: "asyncrunloop", kind: .asyncRunLoop, matchedFloor: "floor-futex", nioPeer: "nio-execute",
          open: { SourceSequenceRTT(pin: pin, path: .futex, settled: settled) }),
        PeerSpec(
          name: "asyncrunloop-epoll", kind: .asyncRunLoop, matchedFloor: "floor-epoll", nioPeer: "nio-execute",
          open: { SourceSequenceRTT(pin: pin, path: .epoll, settled: settled) }),
        PeerSpec(
          name: "nio-execute", kind: .nio, matchedFloor: "floor-epoll", nioPeer: nil,
          open: { NIOExecuteWake(pin: pin, settled: settled) }),
        PeerSpec(
          name: "nio-actor-asyncstream", kind: .nio, matchedFloor: "floor-epoll", nioPeer: nil,
          open: { NIOActorStreamRTT(pin: pin, settled: settled) }),
        PeerSpec(
          name: "floor-futex", kind: .floor, matchedFloor: nil, nioPeer: nil,
          open: { FloorWake(pin: pin, sleepingIn: .futex, settled: settled) }),
        PeerSpec(
          name: "floor-epoll", kind: .floor, matchedFloor: nil, nioPeer: nil,
          open: { FloorWake(pin: pin, sleepingIn: .epoll, settled: settled) }),
      ],
      mode: mode)
  }

  static func throughput(_ pin: PinPlan, mode: RunMode) -> ScenarioResult {
    func peer(_ name: String, _ kind: PeerKind, floor: String?, nio: String?, _ route: ThroughputSession.Route)
      -> PeerSpec<any FigureSession>
    {
      PeerSpec(
        name: name, kind: kind, matchedFloor: floor, nioPeer: nio,
        open: { ThroughputSession(pin: pin, mode: mode, route: route) })
    }
    return runFigureScenario(
      "stream-throughput", unit: "items/s",
      notes: [
        "one producer thread (the measuring thread) posts Ints as fast as it can; the loop consumes them;"
          + " items/s from the first post to the last item consumed; median of the runs (min and max shown)",
        "asyncrunloop / -epoll: SourceSequence + `for await` in Task(executorPreference: loop);"
          + " asyncrunloop-command: CommandSource (handler per item); asyncrunloop-perform: perform {} per item;"
          + " nio-execute: EventLoop.execute {} per item",
        "floor-futex / floor-epoll: a thread draining a mutex-guarded array, woken on empty → non-empty only",
      ],
      peers: [
        peer("asyncrunloop", .asyncRunLoop, floor: "floor-futex", nio: "nio-execute", .sequence(.futex)),
        peer("asyncrunloop-epoll", .asyncRunLoop, floor: "floor-epoll", nio: "nio-execute", .sequence(.epoll)),
        peer("asyncrunloop-command", .asyncRunLoop, floor: "floor-futex", nio: "nio-execute", .command),
        peer("asyncrunloop-perform", .asyncRunLoop, floor: "floor-futex", nio: "nio-execute", .perform),
        peer("nio-execute", .nio, floor: "floor-epoll", nio: nil, .nioExecute),
        peer("floor-futex", .floor, floor: nil, nio: nil, .floor(.futex)),
        peer("floor-epoll", .floor, floor: nil, nio: nil, .floor(.epoll)),
      ],
      mode: mode)
  }
}
