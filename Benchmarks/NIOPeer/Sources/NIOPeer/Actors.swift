import AsyncRunLoop
import NIOCore
import NIOPosix

// thread-actor-rtt (AsyncRunLoopBenchmarks' ThreadActorRTT.swift) and actor-rtt (ActorRTT.swift),
// with NIO peers: actors whose `unownedExecutor` is a NIO event loop (`SelectableEventLoop`
// conforms to `NIOSerialEventLoopExecutor`; `eventLoop.executor` is the loop itself, and its
// `enqueue(_: ExecutorJob)` schedules the job without wrapping it in a closure).

/// The answering actor pinned to an AsyncRunLoop loop.
actor LoopPonger: LoopActor {
  nonisolated let loop: RunLoopThread
  private var calls = 0

  init(loop: RunLoopThread) { self.loop = loop }

  func pong() -> Int {
    calls &+= 1
    return calls
  }

  func pongRinging(_ reply: ReplyDoorbell) {
    _ = pong()
    reply.ring()
  }
}

/// The calling actor pinned to another AsyncRunLoop loop; it measures on its own thread.
actor LoopPinger: LoopActor {
  nonisolated let loop: RunLoopThread
  private var total = 0

  init(loop: RunLoopThread) { self.loop = loop }

  func ping(_ ponger: LoopPonger, count: Int) async -> [Double] {
    await sampleRoundTrips(count) { total &+= await ponger.pong() }
  }
}

/// The answering actor on a NIO event loop.
actor NIOPonger {
  private nonisolated let executor: any SerialExecutor
  nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }
  private var calls = 0

  init(loop: any EventLoop) { executor = loop.executor }

  func pong() -> Int {
    calls &+= 1
    return calls
  }

  func pongRinging(_ reply: ReplyDoorbell) {
    _ = pong()
    reply.ring()
  }
}

/// The calling actor on another NIO event loop.
actor NIOPinger {
  private nonisolated let executor: any SerialExecutor
  nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }
  private var total = 0

  init(loop: any EventLoop) { executor = loop.executor }

  func ping(_ ponger: NIOPonger, count: Int) async -> [Double] {
    await sampleRoundTrips(count) { total &+= await ponger.pong() }
  }
}

/// How the plain thread starts the call.
enum ThreadCallStart {
  /// `Task(executorPreference: loop) { await actor.method() }` (AsyncRunLoop's advice; NIO's loop
  /// is not a `TaskExecutor`, so NIO has no such route).
  case preferringTheLoop
  /// `Task.immediate { await actor.method() }`: the first hop enqueues straight on the actor's
  /// executor from the calling thread.
  case immediate
}

/// thread-actor-rtt / asyncrunloop*.
final class AsyncRunLoopThreadActorRTT: LatencySession {
  private let reply = ReplyDoorbell()
  private let loop: RunLoopThread
  private let ponger: LoopPonger
  private let epollMembers: EpollPathMembers?
  private let start: ThreadCallStart
  private let settled: Bool

  init(pin: PinPlan, path: LoopPath, start: ThreadCallStart, settled: Bool) {
    loop = try! RunLoopThread(name: "thread-actor", cpu: pin.serverCPU)
    ponger = LoopPonger(loop: loop)
    epollMembers = EpollPathMembers.place(loop, on: path)
    self.start = start
    self.settled = settled
  }

  func measure(_ count: Int) -> [Double] {
    let (loop, ponger, reply) = (self.loop, self.ponger, self.reply)
    let settle = settled ? reply.waitUntilRingerSleeps : {}
    switch start {
    case .preferringTheLoop:
      return sampleRoundTrips(count, settle: settle) {
        Task(executorPreference: loop) { await ponger.pongRinging(reply) }
        reply.wait()
      }
    case .immediate:
      return sampleRoundTrips(count, settle: settle) {
        Task.immediate { await ponger.pongRinging(reply) }
        reply.wait()
      }
    }
  }

  func close() {
    epollMembers?.remove()
    loop.shutdownAndWait()
    reply.close()
  }
}

/// thread-actor-rtt / nio-immediate.
final class NIOThreadActorRTT: LatencySession {
  private let reply = ReplyDoorbell()
  private let server: NIOLoop
  private let ponger: NIOPonger
  private let settled: Bool

  init(pin: PinPlan, settled: Bool) {
    server = NIOLoop(cpu: pin.serverCPU)
    ponger = NIOPonger(loop: server.loop)
    self.settled = settled
  }

  func measure(_ count: Int) -> [Double] {
    let (ponger, reply) = (self.ponger, self.reply)
    return sampleRoundTrips(count, settle: settled ? reply.waitUntilRingerSleeps : {}) {
      Task.immediate { await ponger.pongRinging(reply) }
      reply.wait()
    }
  }

  func close() {
    server.shutdown()
    reply.close()
  }
}

/// actor-rtt / asyncrunloop*: `LoopPinger` on loop A (client CPU) awaits `LoopPonger` on loop B
/// (server CPU).
final class AsyncRunLoopActorRTT: LatencySession {
  private let loopA: RunLoopThread
  private let loopB: RunLoopThread
  private let pinger: LoopPinger
  private let ponger: LoopPonger
  private let epollMembers: [EpollPathMembers]

  init(pin: PinPlan, path: LoopPath) {
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

  func close() {
    epollMembers.forEach { $0.remove() }
    loopA.shutdownAndWait()
    loopB.shutdownAndWait()
  }
}

/// actor-rtt / nio: `NIOPinger` on NIO loop A (client CPU) awaits `NIOPonger` on loop B (server CPU).
final class NIOActorRTT: LatencySession {
  private let loopA: NIOLoop
  private let loopB: NIOLoop
  private let pinger: NIOPinger
  private let ponger: NIOPonger

  init(pin: PinPlan) {
    loopA = NIOLoop(cpu: pin.clientCPU)
    loopB = NIOLoop(cpu: pin.serverCPU)
    pinger = NIOPinger(loop: loopA.loop)
    ponger = NIOPonger(loop: loopB.loop)
  }

  func measure(_ count: Int) -> [Double] {
    let (pinger, ponger) = (self.pinger, self.ponger)
    return blockingAwait { await pinger.ping(ponger, count: count) }
  }

  func close() {
    loopA.shutdown()
    loopB.shutdown()
  }
}

/// actor-rtt / floor-futex: two threads that each sleep on a futex word; the measuring thread is
/// A, a server thread B touches a counter.
final class FloorFutexPingPong: LatencySession {
  private let toServer = FutexDoorbell()
  private let toClient = FutexDoorbell()
  private let stop = StopFlag()
  private let server: PlainThread
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

/// actor-rtt / floor-epoll: two threads that each sleep in epoll_wait on their own eventfd.
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

enum ActorScenarios {
  static func threadActor(_ pin: PinPlan, mode: RunMode, settled: Bool) -> ScenarioResult {
    func arl(_ path: LoopPath, _ start: ThreadCallStart) -> PeerSpec<any LatencySession> {
      PeerSpec(
        name: "asyncrunloop\(path.suffix)\(start == .immediate ? "-immediate" : "")", kind: .asyncRunLoop,
        matchedFloor: path.matchedFloor, nioPeer: "nio-immediate",
        open: { AsyncRunLoopThreadActorRTT(pin: pin, path: path, start: start, settled: settled) })
    }
    return runLatencyScenario(
      settled ? "thread-actor-rtt" : "thread-actor-rtt-b2b",
      notes: [
        "a plain thread starts a task that calls a method of an actor pinned to a loop; the method rings the"
          + " thread's reply eventfd; µs per round trip",
        settled
          ? "settled: the loop thread sleeps before each round trip"
          : "back-to-back: no wait between round trips; the loop may still be awake",
        "asyncrunloop / asyncrunloop-epoll: Task(executorPreference: loop) { await actor.m() };"
          + " -immediate: Task.immediate { await actor.m() }; nio-immediate: Task.immediate into an actor whose"
          + " unownedExecutor is the NIO event loop (NIO's loop is not a TaskExecutor)",
      ],
      peers: [
        arl(.futex, .preferringTheLoop), arl(.epoll, .preferringTheLoop), arl(.futex, .immediate),
        arl(.epoll, .immediate),
        PeerSpec(
          name: "nio-immediate", kind: .nio, matchedFloor: "floor-epoll", nioPeer: nil,
          open: { NIOThreadActorRTT(pin: pin, settled: settled) }),
        PeerSpec(
          name: "floor-futex", kind: .floor, matchedFloor: nil, nioPeer: nil,
          open: { FloorWake(pin: pin, sleepingIn: .futex, settled: settled) }),
        PeerSpec(
          name: "floor-epoll", kind: .floor, matchedFloor: nil, nioPeer: nil,
          open: { FloorWake(pin: pin, sleepingIn: .epoll, settled: settled) }),
      ],
      mode: mode)
  }

  static func actorActor(_ pin: PinPlan, mode: RunMode) -> ScenarioResult {
    runLatencyScenario(
      "actor-rtt",
      notes: [
        "an actor on loop A awaits a method of an actor on loop B (both touch state); µs per round trip",
        "asyncrunloop: two RunLoopThreads on the futex path (LoopActor); asyncrunloop-epoll: both on the epoll"
          + " path; nio: two NIO event loops (one-thread groups), actors with unownedExecutor = loop.executor",
        "floors: two threads ping-ponging on futex words / in epoll_wait on eventfds",
      ],
      peers: [
        PeerSpec(
          name: "asyncrunloop", kind: .asyncRunLoop, matchedFloor: "floor-futex", nioPeer: "nio",
          open: { AsyncRunLoopActorRTT(pin: pin, path: .futex) }),
        PeerSpec(
          name: "asyncrunloop-epoll", kind: .asyncRunLoop, matchedFloor: "floor-epoll", nioPeer: "nio",
          open: { AsyncRunLoopActorRTT(pin: pin, path: .epoll) }),
        PeerSpec(name: "nio", kind: .nio, matchedFloor: "floor-epoll", nioPeer: nil, open: { NIOActorRTT(pin: pin) }),
        PeerSpec(
          name: "floor-futex", kind: .floor, matchedFloor: nil, nioPeer: nil, open: { FloorFutexPingPong(pin: pin) }),
        PeerSpec(
          name: "floor-epoll", kind: .floor, matchedFloor: nil, nioPeer: nil, open: { FloorEpollPingPong(pin: pin) }),
      ],
      mode: mode)
  }
}
