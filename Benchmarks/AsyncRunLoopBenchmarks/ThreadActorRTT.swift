import AsyncRunLoop

// thread-actor-rtt (issue 26): a plain thread (the measuring thread) calls a method of an actor
// pinned to a loop, and the method rings the thread's reply eventfd; one sample is one round
// trip. The loop is asleep before each round trip (settled, as wake-rtt), on the futex path
// (`asyncrunloop`: it holds nothing but the actor's jobs) or the epoll path (`asyncrunloop-epoll`:
// a timer and a descriptor registered). The floors are wake-rtt's: a thread woken through a
// futex, epoll_wait, or a blocking read().

extension LoopPonger {
  /// `pong()`, then rings `reply` from inside the actor (on the loop thread).
  func pongRinging(_ reply: ReplyDoorbell) {
    _ = pong()
    reply.ring()
  }
}

extension QueuePonger {
  func pongRinging(_ reply: ReplyDoorbell) {
    _ = pong()
    reply.ring()
  }
}

/// How the thread starts the call.
enum ThreadCallStart {
  /// `Task(executorPreference: loop) { await actor.method() }`: the README's advice for code that
  /// drives a loop's actor. The task's first job goes to the loop (one wake-up), then hops to the
  /// actor's executor role on the loop thread (no wake-up).
  case preferringTheLoop
  /// `Task.immediate { await actor.method() }`: the task starts on the calling thread and its
  /// first hop enqueues straight on the actor's executor (one wake-up); it ends on the global pool.
  case immediate
  /// `Task.detached { await actor.method() }`: the task starts on the global pool (a wake-up of a
  /// pool thread), then hops to the actor on the loop (a wake-up of the loop).
  case detached
}

/// thread-actor-rtt / asyncrunloop and asyncrunloop-epoll (and -immediate).
final class AsyncRunLoopThreadActorRTT: LatencySession {
  private let reply = ReplyDoorbell()
  private let loop: RunLoopThread
  private let ponger: LoopPonger
  private let epollMembers: EpollPathMembers?
  private let start: ThreadCallStart
  private let settled: Bool

  /// `settled` false: back-to-back round trips (the loop may still be awake).
  init(pin: PinPlan, path: LoopPath, start: ThreadCallStart = .preferringTheLoop, settled: Bool = true) {
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
    case .detached:
      return sampleRoundTrips(count, settle: settle) {
        Task.detached { await ponger.pongRinging(reply) }
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

/// thread-actor-rtt / dispatch-queue-executor: `Task.immediate` into an actor on a
/// dispatch-queue executor.
final class DispatchThreadActorRTT: LatencySession {
  private let reply = ReplyDoorbell()
  private let ponger = QueuePonger(executor: DispatchQueueExecutor(label: "thread-actor"))

  func measure(_ count: Int) -> [Double] {
    let (ponger, reply) = (self.ponger, self.reply)
    return sampleRoundTrips(count, settle: reply.waitUntilRingerSleeps) {
      Task.immediate { await ponger.pongRinging(reply) }
      reply.wait()
    }
  }

  func close() { reply.close() }
}

extension ActorScenarios {
  static func threadActorRTT(_ context: BenchmarkContext) -> ScenarioResult {
    let pin = context.pin
    return runLatencyScenario(
      "thread-actor-rtt", floor: "floor-futex",
      notes: [
        "a plain thread starts a task that calls a pinned actor's method, which rings the thread's reply"
          + " eventfd; the loop sleeps before each round trip; µs per round trip",
        "asyncrunloop: Task(executorPreference: loop), futex path — matched floor floor-futex;"
          + " asyncrunloop-epoll: the same on the epoll path — matched floor floor-epoll",
        "asyncrunloop-immediate: Task.immediate (first hop straight to the actor), futex path",
        "asyncrunloop-detached / -epoll-detached: Task.detached (starts on the global pool, then hops)",
        "-b2b: back-to-back, no wait for the loop to sleep between round trips (it may still be awake)",
      ],
      peers: [
        PeerSpec(name: "asyncrunloop", open: { AsyncRunLoopThreadActorRTT(pin: pin, path: .futex) }),
        PeerSpec(name: "asyncrunloop-epoll", open: { AsyncRunLoopThreadActorRTT(pin: pin, path: .epoll) }),
        PeerSpec(
          name: "asyncrunloop-immediate",
          open: { AsyncRunLoopThreadActorRTT(pin: pin, path: .futex, start: .immediate) }),
        PeerSpec(
          name: "asyncrunloop-detached", open: { AsyncRunLoopThreadActorRTT(pin: pin, path: .futex, start: .detached) }),
        PeerSpec(
          name: "asyncrunloop-epoll-detached",
          open: { AsyncRunLoopThreadActorRTT(pin: pin, path: .epoll, start: .detached) }),
        PeerSpec(
          name: "asyncrunloop-b2b", open: { AsyncRunLoopThreadActorRTT(pin: pin, path: .futex, settled: false) }),
        PeerSpec(
          name: "asyncrunloop-epoll-b2b", open: { AsyncRunLoopThreadActorRTT(pin: pin, path: .epoll, settled: false) }),
        PeerSpec(name: "floor-eventfd", open: { FloorWake(pin: pin, sleepingIn: .read) }),
        PeerSpec(name: "floor-futex", open: { FloorWake(pin: pin, sleepingIn: .futex) }),
        PeerSpec(name: "floor-epoll", open: { FloorWake(pin: pin, sleepingIn: .epoll) }),
        PeerSpec(name: "dispatch-queue-executor", open: { DispatchThreadActorRTT() }),
      ],
      mode: context.mode)
  }
}
