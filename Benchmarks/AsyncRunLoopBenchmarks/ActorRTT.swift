import AsyncRunLoop
import Dispatch
import Synchronization

// actor-rtt, task-actor-rtt, hop-allocations: calls between actors pinned to executors.

/// The answering side of actor-rtt and task-actor-rtt: an actor whose `pong()` touches its state.
protocol Ponger: Actor {
  func pong() -> Int
}

/// task-actor-rtt: `count` round trips from a task on the default executor to `ponger`, in
/// microseconds (inlined, so each peer's call is to its concrete actor).
@inline(__always)
func sampleTaskRoundTrips(to ponger: some Ponger, count: Int) -> [Double] {
  blockingAwait {
    var total = 0
    let samples = await sampleRoundTrips(count) { total &+= await ponger.pong() }
    return withExtendedLifetime(total) { samples }
  }
}

/// The answering actor of actor-rtt, pinned to a loop.
actor LoopPonger: LoopActor, Ponger {
  nonisolated let loop: RunLoopThread
  private var calls = 0

  init(loop: RunLoopThread) { self.loop = loop }

  func pong() -> Int {
    calls &+= 1
    return calls
  }
}

/// The calling actor of actor-rtt, pinned to another loop. It measures on its own thread.
actor LoopPinger: LoopActor {
  nonisolated let loop: RunLoopThread
  private var total = 0

  init(loop: RunLoopThread) { self.loop = loop }

  /// `count` round trips to `ponger`, in microseconds.
  func ping(_ ponger: LoopPonger, count: Int) async -> [Double] {
    await sampleRoundTrips(count) { total &+= await ponger.pong() }
  }

  /// `count` round trips inside an mtrace window (see `AllocationTrace`).
  func traceAllocations(_ ponger: LoopPonger, count: Int) async {
    AllocationTrace.start()
    for _ in 0..<count { total &+= await ponger.pong() }
    AllocationTrace.stop()
  }
}

/// The `dispatch-queue-executor` peer: a `SerialExecutor` doing
/// `queue.async { job.runSynchronously(on:) }` on a serial dispatch queue.
final class DispatchQueueExecutor: SerialExecutor {
  let queue: DispatchQueue

  init(label: String) { queue = DispatchQueue(label: label) }

  func enqueue(_ job: consuming ExecutorJob) {
    let unowned = UnownedJob(job)
    let executor = asUnownedSerialExecutor()
    queue.async { unowned.runSynchronously(on: executor) }
  }

  func asUnownedSerialExecutor() -> UnownedSerialExecutor { UnownedSerialExecutor(ordinary: self) }
}

/// The same two actors on dispatch-queue executors.
actor QueuePonger: Ponger {
  private nonisolated let executor: DispatchQueueExecutor
  nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }
  private var calls = 0

  init(executor: DispatchQueueExecutor) { self.executor = executor }

  func pong() -> Int {
    calls &+= 1
    return calls
  }
}

actor QueuePinger {
  private nonisolated let executor: DispatchQueueExecutor
  nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }
  private var total = 0

  init(executor: DispatchQueueExecutor) { self.executor = executor }

  func ping(_ ponger: QueuePonger, count: Int) async -> [Double] {
    await sampleRoundTrips(count) { total &+= await ponger.pong() }
  }
}

/// actor-rtt / asyncrunloop: `LoopPinger` on loop A (client CPU) awaits `LoopPonger` on loop B
/// (server CPU).
final class AsyncRunLoopActorRTT: LatencySession {
  let loopA: RunLoopThread
  let loopB: RunLoopThread
  private let pinger: LoopPinger
  private let ponger: LoopPonger
  private let epollMembers: [EpollPathMembers]

  /// Both loops on `path` (see `LoopPath`).
  init(pin: PinPlan, path: LoopPath = .futex) {
    loopA = try! RunLoopThread(name: "actor-a", cpu: pin.clientCPU)
    loopB = try! RunLoopThread(name: "actor-b", cpu: pin.serverCPU)
    pinger = LoopPinger(loop: loopA)
    ponger = LoopPonger(loop: loopB)
    epollMembers = [loopA, loopB].compactMap { EpollPathMembers.place($0, on: path) }
  }

  func measure(_ count: Int) -> [Double] {
    let (pinger, ponger) = (self.pinger, self.ponger)
    return blockingAwait { await pinger.ping(ponger, count: count) }
  }

  /// `count` round trips with allocation tracing on (in the hop-allocations child process).
  func traceAllocations(_ count: Int) {
    let (pinger, ponger) = (self.pinger, self.ponger)
    blockingAwait { await pinger.traceAllocations(ponger, count: count) }
  }

  func close() {
    epollMembers.forEach { $0.remove() }
    loopA.shutdownAndWait()
    loopB.shutdownAndWait()
  }
}

/// actor-rtt / floor-futex: as floor-epoll, but both threads sleep on a futex word (the matched
/// floor of two loops on the futex path).
final class FloorFutexPingPong: LatencySession {
  private let toServer = FutexDoorbell()
  private let toClient = FutexDoorbell()
  private let stop = StopFlag()
  private let server: PlainThread
  /// The client's last seen value of `toClient` (the measuring thread only).
  private var clientSeen: UInt32 = 0

  init(pin: PinPlan) {
    server = PlainThread(name: "floor-futex-b", cpu: pin.serverCPU) { [toServer, toClient, stop] in
      var calls = 0
      var seen: UInt32 = 0
      while true {
        toServer.wait(seen: &seen)
        if stop.isSet { break }
        calls &+= 1
        toClient.ring()
      }
      withExtendedLifetime(calls) {}
    }
  }

  func measure(_ count: Int) -> [Double] {
    var seen = clientSeen
    defer { clientSeen = seen }
    return sampleRoundTrips(count) {
      toServer.ring()
      toClient.wait(seen: &seen)
    }
  }

  func close() {
    stop.set()
    toServer.ring()
    server.join()
  }
}

/// actor-rtt / floor-epoll: two threads that each sleep in epoll_wait on their own eventfd; the
/// measuring thread (client CPU) is A, a server thread (server CPU) is B; B touches a counter.
final class FloorEpollPingPong: LatencySession {
  private let toServer = EventDoorbell(nonBlocking: true)
  private let toClient = EventDoorbell(nonBlocking: true)
  private let clientEpoll: EpollWaiter
  private let stop = StopFlag()
  private let server: PlainThread

  init(pin: PinPlan) {
    clientEpoll = EpollWaiter(watching: toClient.descriptor)
    let serverEpoll = EpollWaiter(watching: toServer.descriptor)
    server = PlainThread(name: "floor-epoll-b", cpu: pin.serverCPU) { [toServer, toClient, stop] in
      var calls = 0
      while true {
        serverEpoll.wait()
        toServer.drain()
        if stop.isSet { break }
        calls &+= 1
        toClient.ring()
      }
      serverEpoll.close()
      withExtendedLifetime(calls) {}
    }
  }

  func measure(_ count: Int) -> [Double] {
    sampleRoundTrips(count) {
      toServer.ring()
      clientEpoll.wait()
      toClient.drain()
    }
  }

  func close() {
    stop.set()
    toServer.ring()
    server.join()
    clientEpoll.close()
    toServer.close()
    toClient.close()
  }
}

/// actor-rtt / dispatch-queue-executor: the same actors on two dispatch-queue executors.
final class DispatchActorRTT: LatencySession {
  private let pinger = QueuePinger(executor: DispatchQueueExecutor(label: "actor-a"))
  private let ponger = QueuePonger(executor: DispatchQueueExecutor(label: "actor-b"))

  func measure(_ count: Int) -> [Double] {
    let (pinger, ponger) = (self.pinger, self.ponger)
    return blockingAwait { await pinger.ping(ponger, count: count) }
  }

  func close() {}
}

/// task-actor-rtt / asyncrunloop: a task on the default (global) executor awaits a method of an
/// actor pinned to a loop; each sample is the hop there and back.
final class AsyncRunLoopTaskActorRTT: LatencySession {
  private let loop: RunLoopThread
  private let ponger: LoopPonger

  init(pin: PinPlan) {
    loop = try! RunLoopThread(name: "task-actor", cpu: pin.serverCPU)
    ponger = LoopPonger(loop: loop)
  }

  func measure(_ count: Int) -> [Double] { sampleTaskRoundTrips(to: ponger, count: count) }

  func close() { loop.shutdownAndWait() }
}

/// task-actor-rtt / dispatch-queue-executor.
final class DispatchTaskActorRTT: LatencySession {
  private let ponger = QueuePonger(executor: DispatchQueueExecutor(label: "task-actor"))

  func measure(_ count: Int) -> [Double] { sampleTaskRoundTrips(to: ponger, count: count) }

  func close() {}
}

/// hop-allocations: heap allocations per actor-rtt round trip, counted by glibc's mtrace in a
/// child process (see `AllocationTrace`). NaN (reported as a failure) if tracing is impossible.
final class HopAllocations: FigureSession {
  private let pin: String
  private let count: Int

  init(pin: String, count: Int) {
    self.pin = pin
    self.count = count
  }

  func measure() -> Figure {
    switch AllocationTrace.allocationsPerRoundTrip(count: count, pin: pin) {
    case .success(let perRoundTrip):
      return Figure(value: perRoundTrip)
    case .failure(let error):
      progress("hop-allocations: \(error.reason)")
      return Figure(value: .nan)
    }
  }

  func close() {}
}

enum ActorScenarios {
  static func actorRTT(_ context: BenchmarkContext) -> ScenarioResult {
    let pin = context.pin
    return runLatencyScenario(
      "actor-rtt", floor: "floor-futex",
      notes: [
        "an actor on executor A awaits a method of an actor on executor B (both touch state); µs per round trip",
        "asyncrunloop: both loops on the futex path — matched floor floor-futex (two threads on futex words);"
          + " asyncrunloop-epoll: both on the epoll path (a timer and a descriptor each) — matched floor floor-epoll"
          + " (two threads in epoll_wait)",
        "dispatch-queue-executor runs on libdispatch worker threads (not pinnable)",
      ],
      peers: [
        PeerSpec(name: "asyncrunloop", open: { AsyncRunLoopActorRTT(pin: pin, path: .futex) }),
        PeerSpec(name: "asyncrunloop-epoll", open: { AsyncRunLoopActorRTT(pin: pin, path: .epoll) }),
        PeerSpec(name: "floor-futex", open: { FloorFutexPingPong(pin: pin) }),
        PeerSpec(name: "floor-epoll", open: { FloorEpollPingPong(pin: pin) }),
        PeerSpec(name: "dispatch-queue-executor", open: { DispatchActorRTT() }),
      ],
      mode: context.mode)
  }

  static func taskActorRTT(_ context: BenchmarkContext) -> ScenarioResult {
    let pin = context.pin
    return runLatencyScenario(
      "task-actor-rtt", floor: nil,
      notes: ["a task on the default executor awaits a method of a pinned actor; µs per round trip"],
      peers: [
        PeerSpec(name: "asyncrunloop", open: { AsyncRunLoopTaskActorRTT(pin: pin) }),
        PeerSpec(name: "dispatch-queue-executor", open: { DispatchTaskActorRTT() }),
      ],
      mode: context.mode)
  }

  static func hopAllocations(_ context: BenchmarkContext) -> ScenarioResult {
    let pin = context.pin.name
    let count = context.mode == .smoke ? 1_000 : 10_000
    return runFigureScenario(
      "hop-allocations", unit: "count",
      notes: [
        "heap allocations (malloc/calloc/realloc/memalign, every thread; glibc mtrace in a child process)"
          + " per actor-rtt round trip"
      ],
      peers: [PeerSpec(name: "asyncrunloop", open: { HopAllocations(pin: pin, count: count) })],
      warmUp: false, repetitions: context.mode.repetitions)
  }
}
