import AsyncRunLoop
import AsyncRunLoopFoundation

// bridged-foundation-rtt: a task on the default executor awaits a method of an actor pinned to a
// Foundation run-loop thread through `CFRunLoopExecutor` (jobs as CFRunLoopPerformBlock +
// CFRunLoopWakeUp blocks), next to the same actor on our own loop and on a dispatch queue.

/// The answering actor, pinned to a Foundation run-loop thread.
actor FoundationThreadPonger: Ponger {
  private nonisolated let executor: CFRunLoopExecutor
  nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }
  private var calls = 0

  init(executor: CFRunLoopExecutor) { self.executor = executor }

  func pong() -> Int {
    calls &+= 1
    return calls
  }
}

/// bridged-foundation-rtt / cf-run-loop-executor.
final class FoundationThreadTaskActorRTT: LatencySession {
  private let executor = CFRunLoopExecutor.startThread(name: "cf-actor")
  private let ponger: FoundationThreadPonger

  init() { ponger = FoundationThreadPonger(executor: executor) }

  func measure(_ count: Int) -> [Double] { sampleTaskRoundTrips(to: ponger, count: count) }

  func close() { executor.shutdown() }
}

enum BridgedFoundationScenarios {
  static func bridgedFoundationRTT(_ context: BenchmarkContext) -> ScenarioResult {
    let pin = context.pin
    return runLatencyScenario(
      "bridged-foundation-rtt", floor: nil,
      notes: [
        "a task on the default executor awaits a method of an actor pinned to a Foundation run-loop thread"
          + " (CFRunLoopExecutor), to our loop, to a dispatch queue; µs per round trip"
      ],
      peers: [
        PeerSpec(name: "cf-run-loop-executor", open: { FoundationThreadTaskActorRTT() }),
        PeerSpec(name: "asyncrunloop", open: { AsyncRunLoopTaskActorRTT(pin: pin) }),
        PeerSpec(name: "dispatch-queue-executor", open: { DispatchTaskActorRTT() }),
      ],
      mode: context.mode)
  }
}
