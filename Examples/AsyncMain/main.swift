@_spi(ExperimentalCustomExecutors) import AsyncRunLoop

// An `async` main on the main loop: with AsyncRunLoopExecutorFactory as the program's executor
// factory, the main actor's code — this `main`, every `@MainActor` type, `runOnMain` bodies,
// `DispatchQueue.main` blocks — runs on the process's main thread, served by the main loop
// together with `RunLoopThread.main`'s sources and timers. Tasks that are not isolated to the
// main actor still run on the global pool, and actors pinned to a loop run on that loop's thread.
//
// The factory needs the compiler setting `-Xfrontend -disable-availability-checking` on this
// executable target (see Package.swift): without it Swift 6.3.1 ignores the declaration on Linux.
//
// Run it: swift run AsyncMainExample

/// A reading counter pinned to a worker loop: its methods run on the worker's thread.
actor Sensor: LoopActor {
  nonisolated let loop: RunLoopThread
  private var total = 0

  init(loop: RunLoopThread) { self.loop = loop }

  func record(_ reading: Int) -> Int {
    precondition(loop.isOnLoopThread, "the pinned actor ran off its loop thread")
    total += reading
    return total
  }
}

/// Told about the running total. Main-actor isolated: every callout runs on the main thread.
@MainActor
protocol SensorDelegate: AnyObject {
  func sensor(didReachTotal total: Int)
}

/// Wraps the main-actor delegate for code on any thread: each call is the FORCE_MAIN_THREAD guard
/// (inline on the main thread; elsewhere queued for the main thread, in call order).
final class MainThreadSensorDelegate: Sendable {
  @MainActor private let target: any SensorDelegate

  @MainActor init(_ target: any SensorDelegate) { self.target = target }

  func sensor(didReachTotal total: Int) {
    runOnMain { [self] in target.sensor(didReachTotal: total) }
  }
}

/// The application's main-thread object.
@MainActor
final class Dashboard: SensorDelegate {
  private(set) var totals: [Int] = []
  private let expected: Int

  init(expectedReadings: Int) { self.expected = expectedReadings }

  func sensor(didReachTotal total: Int) {
    precondition(RunLoopThread.isMainThread, "a delegate callout ran off the main thread")
    totals.append(total)
    if totals.count == expected { stopMainLoop() }  // the last callout ends `await runMainLoop()`
  }
}

@main
struct AsyncMainExample {
  /// The one declaration that puts this `async` main on the main loop.
  typealias DefaultExecutorFactory = AsyncRunLoopExecutorFactory

  static func main() async {
    expectMainThread("main")
    let worker = RunLoopThread.start(named: "worker")
    let sensor = Sensor(loop: worker)
    let dashboard = Dashboard(expectedReadings: 5)
    let delegate = MainThreadSensorDelegate(dashboard)

    // A source sequence consumed on the worker loop: each reading goes through the pinned actor,
    // and the delegate hears the new total on the main thread (the FORCE_MAIN_THREAD idiom).
    let readings = worker.sourceSequence(of: Int.self)
    let consumer = Task(executorPreference: worker) {
      var received = 0
      for await reading in readings {
        let total = await sensor.record(reading)
        delegate.sensor(didReachTotal: total)  // from the worker thread
        received += 1
        if received == 5 { break }
      }
    }

    // A timer sequence on the main loop: its ticks reach this main-actor code on the main thread.
    var ticks = 0
    for await _ in RunLoopThread.main.timer(every: .milliseconds(5)) {
      expectMainThread("a main-loop tick")
      ticks += 1
      _ = readings.post(ticks)
      if ticks == 5 { break }
    }
    // Wait for stopMainLoop() as a synchronous main's runMainLoop() would: the dashboard calls it
    // on its last callout. Meanwhile the main loop keeps serving the main actor.
    await runMainLoop()
    expectMainThread("main after runMainLoop()")
    await consumer.value
    print("ticks: \(ticks), delegate totals: \(dashboard.totals), all on the main thread")
    print("stopMainLoop() ended await runMainLoop()")

    worker.shutdown()
    print("clean exit")
  }

  static func expectMainThread(_ what: String) {
    precondition(RunLoopThread.isMainThread, "\(what) ran off the main thread")
    MainActor.preconditionIsolated("\(what) is not on the main actor")
  }
}
