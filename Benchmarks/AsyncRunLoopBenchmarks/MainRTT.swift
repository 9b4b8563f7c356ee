import AsyncRunLoop
import Dispatch

// main-rtt: a plain thread (the measuring thread) runs a closure on the main thread and gets its
// result. The main thread is given to the peer's main loop before each batch (see
// MainThreadDriver), so the peers alternate on it: A B A B.

/// Gives the main thread to `owner` for each batch.
class MainLoopSession: LatencySession {
  private let driver: MainThreadDriver
  private let owner: MainThreadOwner

  init(driver: MainThreadDriver, owner: MainThreadOwner) {
    self.driver = driver
    self.owner = owner
  }

  func activate() {
    driver.begin(owner)
    if owner == .asyncRunLoop {
      // `runOnMainAndWait` refuses to wait until the main loop is really running.
      while !RunLoopThread.isMainLoopRunning { sleepNanoseconds(100_000) }
    }
    _ = measure(10)  // the first calls after a switch pay for it
  }

  func deactivate() { driver.end() }

  func measure(_ count: Int) -> [Double] { fatalError("subclass") }

  func close() {}
}

/// asyncrunloop: the main thread runs `runMainLoop()`; the plain thread calls
/// `runOnMainAndWait { value }` (blocking).
final class RunOnMainAndWaitRTT: MainLoopSession {
  init(driver: MainThreadDriver) { super.init(driver: driver, owner: .asyncRunLoop) }

  override func measure(_ count: Int) -> [Double] {
    var total = 0
    let samples = sampleRoundTrips(count) { total &+= try! runOnMainAndWait { 1 } }
    return withExtendedLifetime(total) { samples }
  }
}

/// asyncrunloop-await-runOnMain (extra): the main thread runs `runMainLoop()`; the plain thread
/// starts a task that awaits `runOnMain { value }` and waits for it: the same shape as the
/// Foundation peer, so the two differ only in the main loop.
final class AwaitRunOnMainRTT: MainLoopSession {
  init(driver: MainThreadDriver) { super.init(driver: driver, owner: .asyncRunLoop) }

  override func measure(_ count: Int) -> [Double] {
    var total = 0
    let samples = sampleRoundTrips(count) { total &+= blockingAwait { await runOnMain { 1 } } }
    return withExtendedLifetime(total) { samples }
  }
}

/// mainactor-foundation-runloop: the main thread runs Foundation's `RunLoop.main`; a plain thread
/// cannot `await`, so it starts a task that awaits `MainActor.run { value }` and waits for it.
final class MainActorRunRTT: MainLoopSession {
  init(driver: MainThreadDriver) { super.init(driver: driver, owner: .foundation) }

  override func measure(_ count: Int) -> [Double] {
    var total = 0
    let samples = sampleRoundTrips(count) { total &+= blockingAwait { await MainActor.run { 1 } } }
    return withExtendedLifetime(total) { samples }
  }
}

/// dispatch-main-sync-foundation-runloop (extra): the main thread runs Foundation's
/// `RunLoop.main`; the plain thread calls `DispatchQueue.main.sync { value }` (blocking), the
/// plain-thread route without AsyncRunLoop.
final class DispatchMainSyncRTT: MainLoopSession {
  init(driver: MainThreadDriver) { super.init(driver: driver, owner: .foundation) }

  override func measure(_ count: Int) -> [Double] {
    var total = 0
    let samples = sampleRoundTrips(count) { total &+= DispatchQueue.main.sync { 1 } }
    return withExtendedLifetime(total) { samples }
  }
}

enum MainScenarios {
  static func mainRTT(_ context: BenchmarkContext) -> ScenarioResult {
    let driver = context.mainDriver
    return runLatencyScenario(
      "main-rtt", floor: nil,
      notes: [
        "a plain thread runs a closure on the main thread and gets its result; µs per round trip",
        "the main thread alternates between runMainLoop() and Foundation's RunLoop.main before each batch",
        "extras: asyncrunloop-await-runOnMain has the Foundation peer's shape (task + await);"
          + " dispatch-main-sync-foundation-runloop is the plain-thread route without AsyncRunLoop;"
          + " asyncrunloop-factory-mainactor is that shape in an async main on AsyncRunLoopExecutorFactory"
          + " (a child process, MainRTTAsyncMain)",
      ],
      peers: [
        PeerSpec(name: "asyncrunloop", open: { RunOnMainAndWaitRTT(driver: driver) }),
        PeerSpec(name: "mainactor-foundation-runloop", open: { MainActorRunRTT(driver: driver) }),
        PeerSpec(name: "asyncrunloop-await-runOnMain", open: { AwaitRunOnMainRTT(driver: driver) }),
        PeerSpec(name: "dispatch-main-sync-foundation-runloop", open: { DispatchMainSyncRTT(driver: driver) }),
        factoryPeer(),
      ],
      mode: context.mode)
  }

  /// The factory route's peer, when its executable was built.
  static func factoryPeer() -> PeerSpec<any LatencySession> {
    guard let executable = FactoryMainActorRTT.executable else {
      return PeerSpec(
        name: "asyncrunloop-factory-mainactor", open: nil,
        unavailableReason: "not built: swift build -c release --product MainRTTAsyncMain")
    }
    return PeerSpec(name: "asyncrunloop-factory-mainactor", open: { FactoryMainActorRTT(executable: executable) })
  }
}
