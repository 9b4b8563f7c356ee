import AsyncRunLoop
import AsyncRunLoopFoundation

// bridged-foundation-wake-rtt: the measuring thread wakes a sleeping server thread, async code
// on that thread replies; one sample is one round trip (the client as in wake-rtt: it signals,
// then blocks on the reply eventfd; before each round trip it waits until the ringer sleeps).
// Side by side: a Foundation run-loop thread wrapped by CFRunLoopExecutor (a CF source sequence
// consumed by a task on that executor), our loop (a SourceSequence consumed by a task on it), the
// same two with a plain callback (Foundation alone: CFRunLoopPerformBlock + CFRunLoopWakeUp; our
// CommandSource), and the eventfd floor.

/// cf-run-loop-executor-sequence: `signal()` on a CFRunLoopSourceSequence; its consumer, a task
/// that prefers the executor, runs on the Foundation thread and rings the reply.
final class FoundationExecutorSequenceWake: LatencySession {
  private let reply = ReplyDoorbell()
  private let executor = CFRunLoopExecutor.startThread(name: "cf-wake")
  private let sequence: CFRunLoopSourceSequence
  private let consumer: Task<Void, Never>

  init() {
    let sequence = executor.sourceSequence()
    self.sequence = sequence
    consumer = Task(executorPreference: executor) { [reply] in
      for await _ in sequence { reply.ring() }
    }
  }

  func measure(_ count: Int) -> [Double] {
    sampleRoundTrips(count, settle: reply.waitUntilRingerSleeps) {
      sequence.signal()
      reply.wait()
    }
  }

  func close() {
    sequence.invalidate()
    let consumer = self.consumer
    blockingAwait { await consumer.value }
    executor.shutdown()
    reply.close()
  }
}

/// asyncrunloop-sequence: `post` on a SourceSequence of our loop; its consumer, a task that prefers
/// the loop, runs on the loop thread and rings the reply.
final class AsyncRunLoopSequenceWake: LatencySession {
  private let reply = ReplyDoorbell()
  private let loop: RunLoopThread
  private let sequence: SourceSequence<Int>
  private let consumer: Task<Void, Never>

  init(pin: PinPlan) {
    loop = try! RunLoopThread(name: "seq-wake", cpu: pin.serverCPU)
    let sequence = loop.sourceSequence(of: Int.self)
    self.sequence = sequence
    consumer = Task(executorPreference: loop) { [reply] in
      for await _ in sequence { reply.ring() }
    }
  }

  func measure(_ count: Int) -> [Double] {
    sampleRoundTrips(count, settle: reply.waitUntilRingerSleeps) {
      _ = sequence.post(1)
      reply.wait()
    }
  }

  func close() {
    sequence.invalidate()
    let consumer = self.consumer
    blockingAwait { await consumer.value }
    loop.shutdownAndWait()
    reply.close()
  }
}

enum BridgedFoundationWakeScenarios {
  static func bridgedFoundationWakeRTT(_ context: BenchmarkContext) -> ScenarioResult {
    let pin = context.pin
    return runLatencyScenario(
      "bridged-foundation-wake-rtt", floor: "floor-eventfd",
      notes: [
        "client thread wakes a sleeping server thread, code on it rings the client's reply eventfd; µs per round trip",
        "*-sequence: an async consumer task on the server thread (CF source sequence on a CFRunLoopExecutor thread,"
          + " SourceSequence on our loop); the others reply from a plain callback",
        "foundation-alone: CFRunLoopPerformBlock + CFRunLoopWakeUp on a Foundation RunLoop thread;"
          + " the CFRunLoopExecutor thread is not pinned",
      ],
      peers: [
        PeerSpec(name: "cf-run-loop-executor-sequence", open: { FoundationExecutorSequenceWake() }),
        PeerSpec(name: "asyncrunloop-sequence", open: { AsyncRunLoopSequenceWake(pin: pin) }),
        PeerSpec(name: "foundation-alone", open: { FoundationRunLoopWake(pin: pin, route: .performAndWakeUp) }),
        PeerSpec(name: "asyncrunloop", open: { AsyncRunLoopWake(pin: pin) }),
        PeerSpec(name: "floor-eventfd", open: { FloorWake(pin: pin, sleepingIn: .read) }),
      ],
      mode: context.mode)
  }
}
