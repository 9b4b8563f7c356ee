import AsyncRunLoop
import CoreFoundation

// bridged-main-rtt: main-rtt with the Foundation bridge installed (MainLoopBridge), so that each
// main loop also serves the other: a plain thread runs a closure on the main thread, through our
// loop (`runOnMainAndWait`) or through Foundation's (`CFRunLoopPerformBlock` + `CFRunLoopWakeUp`),
// while the main thread runs either `runMainLoop()` or `RunLoop.main.run(...)`: four peers, the
// main thread switching owners before each batch as in main-rtt.

/// ours-under-*: `runOnMainAndWait { value }` (blocking), served by our main loop, which either
/// runs the main thread or is hosted by Foundation's run loop through the bridge.
final class BridgedRunOnMainRTT: MainLoopSession {
  override func measure(_ count: Int) -> [Double] {
    var total = 0
    let samples = sampleRoundTrips(count) { total &+= runOnMainWhenServed() }
    return withExtendedLifetime(total) { samples }
  }

  /// Right after the switch to Foundation's run loop, until CF has entered its run (and begun
  /// hosting our loop), `runOnMainAndWait` refuses to wait (`wouldDeadlock`): retried, which only
  /// happens in the untimed warm-up of `activate()`.
  private func runOnMainWhenServed() -> Int {
    while true {
      if let value = try? runOnMainAndWait({ 1 }) { return value }
      sleepNanoseconds(100_000)
    }
  }
}

/// foundation-under-*: `CFRunLoopPerformBlock` on the main run loop in the default mode, then
/// `CFRunLoopWakeUp` (`RunLoop.main.perform` alone does not wake it); the block rings the reply.
/// Served by CF's run, which either runs the main thread or is our main loop's sleep.
final class BridgedFoundationPerformRTT: MainLoopSession {
  private let reply = ReplyDoorbell()

  override func measure(_ count: Int) -> [Double] {
    let reply = self.reply
    let main = CFRunLoopGetMain()
    return sampleRoundTrips(count) {
      CFRunLoopPerformBlock(main, kCFRunLoopDefaultMode) { reply.ring() }
      CFRunLoopWakeUp(main)
      reply.wait()
    }
  }

  override func close() { reply.close() }
}

enum BridgedMainScenarios {
  static func bridgedMainRTT(_ context: BenchmarkContext) -> ScenarioResult {
    let driver = context.mainDriver
    driver.installBridge()
    return runLatencyScenario(
      "bridged-main-rtt", floor: nil,
      notes: [
        "main-rtt with the Foundation bridge installed: a plain thread runs a closure on the main thread"
          + " through our loop (runOnMainAndWait) or Foundation's (CFRunLoopPerformBlock + CFRunLoopWakeUp);"
          + " µs per round trip",
        "the main thread alternates between runMainLoop() and RunLoop.main.run(mode:before:) before each batch;"
          + " the bridge stays installed for the rest of the process",
      ],
      peers: [
        PeerSpec(name: "ours-under-runMainLoop", open: { BridgedRunOnMainRTT(driver: driver, owner: .asyncRunLoop) }),
        PeerSpec(name: "ours-under-RunLoop.main", open: { BridgedRunOnMainRTT(driver: driver, owner: .foundation) }),
        PeerSpec(
          name: "foundation-under-RunLoop.main",
          open: { BridgedFoundationPerformRTT(driver: driver, owner: .foundation) }),
        PeerSpec(
          name: "foundation-under-runMainLoop",
          open: { BridgedFoundationPerformRTT(driver: driver, owner: .asyncRunLoop) }),
      ],
      mode: context.mode)
  }
}
