import AsyncRunLoop
import NIOCore
import NIOPosix

// wake-rtt and wake-rtt-b2b (AsyncRunLoopBenchmarks' WakeRTT.swift): the measuring thread signals
// a server, the server rings the reply eventfd the client blocks on. Settled: before each round
// trip (untimed) the client waits until the thread that rang is asleep again. Back-to-back: the
// next request goes out as soon as the reply arrived (the server may still be awake).

/// The floors: a server thread that sleeps until signalled and rings the reply.
final class FloorWake: LatencySession {
  enum Sleep {
    /// Blocks in read() on its request eventfd (the bare floor).
    case read
    /// Sleeps in epoll_wait on a non-blocking eventfd, then reads it (as NIO's loop and an
    /// AsyncRunLoop loop on the epoll path do).
    case epoll
    /// Sleeps on a futex word (as an AsyncRunLoop loop on the futex path does).
    case futex
  }

  private let ringRequest: @Sendable () -> Void
  private let closeRequest: @Sendable () -> Void
  private let reply = ReplyDoorbell()
  private let stop = StopFlag()
  private let server: PlainThread
  private let settled: Bool

  init(pin: PinPlan, sleepingIn sleep: Sleep, settled: Bool) {
    self.settled = settled
    switch sleep {
    case .read:
      let request = EventDoorbell()
      ringRequest = { request.ring() }
      closeRequest = { request.close() }
      server = PlainThread(name: "floor-eventfd", cpu: pin.serverCPU) { [reply, stop] in
        while true {
          request.wait()
          if stop.isSet { return }
          reply.ring()
        }
      }
    case .epoll:
      let request = EventDoorbell(nonBlocking: true)
      ringRequest = { request.ring() }
      closeRequest = { request.close() }
      let epoll = EpollWaiter(watching: request.descriptor)
      server = PlainThread(name: "floor-epoll", cpu: pin.serverCPU) { [reply, stop] in
        while true {
          epoll.wait()
          request.drain()
          if stop.isSet { break }
          reply.ring()
        }
        epoll.close()
      }
    case .futex:
      let request = FutexDoorbell()
      ringRequest = { request.ring() }
      closeRequest = {}
      server = PlainThread(name: "floor-futex", cpu: pin.serverCPU) { [reply, stop] in
        var seen: UInt32 = 0
        while true {
          request.wait(seen: &seen)
          if stop.isSet { return }
          reply.ring()
        }
      }
    }
  }

  func measure(_ count: Int) -> [Double] {
    let ringRequest = self.ringRequest
    return sampleRoundTrips(count, settle: settled ? reply.waitUntilRingerSleeps : {}) {
      ringRequest()
      reply.wait()
    }
  }

  func close() {
    stop.set()
    ringRequest()
    server.join()
    closeRequest()
    reply.close()
  }
}

/// asyncrunloop: a `CommandSource` on a `RunLoopThread`; `post` is append + signal + wake; the
/// handler rings the reply. With `viaPerform`: `loop.perform { reply.ring() }` instead, the
/// closure-per-item route that matches NIO's `execute` most closely.
final class AsyncRunLoopWake: LatencySession {
  private let reply = ReplyDoorbell()
  private let loop: RunLoopThread
  private let source: CommandSource<UInt32>
  private let epollMembers: EpollPathMembers?
  private let settled: Bool
  private let viaPerform: Bool

  init(pin: PinPlan, path: LoopPath, settled: Bool, viaPerform: Bool = false) {
    self.settled = settled
    self.viaPerform = viaPerform
    loop = try! RunLoopThread(name: "wake-server", cpu: pin.serverCPU)
    source = CommandSource { [reply] _ in reply.ring() }
    loop.add(source.source, to: .default)
    epollMembers = EpollPathMembers.place(loop, on: path)
  }

  func measure(_ count: Int) -> [Double] {
    let settle = settled ? reply.waitUntilRingerSleeps : {}
    if viaPerform {
      let (loop, reply) = (self.loop, self.reply)
      return sampleRoundTrips(count, settle: settle) {
        loop.perform { reply.ring() }
        reply.wait()
      }
    }
    return sampleRoundTrips(count, settle: settle) {
      source.post(1)
      reply.wait()
    }
  }

  func close() {
    source.source.invalidate()
    epollMembers?.remove()
    loop.shutdownAndWait()
    reply.close()
  }
}

/// nio: `eventLoop.execute { reply.ring() }` on a NIO event loop thread.
final class NIOExecuteWake: LatencySession {
  private let reply = ReplyDoorbell()
  private let server: NIOLoop
  private let settled: Bool

  init(pin: PinPlan, settled: Bool) {
    self.settled = settled
    server = NIOLoop(cpu: pin.serverCPU)
  }

  func measure(_ count: Int) -> [Double] {
    let (loop, reply) = (server.loop, self.reply)
    return sampleRoundTrips(count, settle: settled ? reply.waitUntilRingerSleeps : {}) {
      loop.execute { reply.ring() }
      reply.wait()
    }
  }

  func close() {
    server.shutdown()
    reply.close()
  }
}

enum WakeScenarios {
  static func wake(_ pin: PinPlan, mode: RunMode, settled: Bool) -> ScenarioResult {
    runLatencyScenario(
      settled ? "wake-rtt" : "wake-rtt-b2b",
      notes: [
        "the client thread signals a server, the server rings the client's reply eventfd (the client blocks in"
          + " read() for every peer); µs per round trip",
        settled
          ? "settled: before each round trip the client waits until the server thread sleeps"
          : "back-to-back: no wait between round trips; the server may still be awake",
        "asyncrunloop: CommandSource.post; asyncrunloop-perform: RunLoopThread.perform {} (closure per item);"
          + " nio: EventLoop.execute {} (closure per item)",
      ],
      peers: [
        PeerSpec(
          name: "asyncrunloop", kind: .asyncRunLoop, matchedFloor: "floor-futex", nioPeer: "nio",
          open: { AsyncRunLoopWake(pin: pin, path: .futex, settled: settled) }),
        PeerSpec(
          name: "asyncrunloop-epoll", kind: .asyncRunLoop, matchedFloor: "floor-epoll", nioPeer: "nio",
          open: { AsyncRunLoopWake(pin: pin, path: .epoll, settled: settled) }),
        PeerSpec(
          name: "asyncrunloop-perform", kind: .asyncRunLoop, matchedFloor: "floor-futex", nioPeer: "nio",
          open: { AsyncRunLoopWake(pin: pin, path: .futex, settled: settled, viaPerform: true) }),
        PeerSpec(
          name: "asyncrunloop-epoll-perform", kind: .asyncRunLoop, matchedFloor: "floor-epoll", nioPeer: "nio",
          open: { AsyncRunLoopWake(pin: pin, path: .epoll, settled: settled, viaPerform: true) }),
        PeerSpec(
          name: "nio", kind: .nio, matchedFloor: "floor-epoll", nioPeer: nil,
          open: { NIOExecuteWake(pin: pin, settled: settled) }),
        PeerSpec(
          name: "floor-futex", kind: .floor, matchedFloor: nil, nioPeer: nil,
          open: { FloorWake(pin: pin, sleepingIn: .futex, settled: settled) }),
        PeerSpec(
          name: "floor-epoll", kind: .floor, matchedFloor: nil, nioPeer: nil,
          open: { FloorWake(pin: pin, sleepingIn: .epoll, settled: settled) }),
        PeerSpec(
          name: "floor-eventfd", kind: .floor, matchedFloor: nil, nioPeer: nil,
          open: { FloorWake(pin: pin, sleepingIn: .read, settled: settled) }),
      ],
      mode: mode)
  }
}
