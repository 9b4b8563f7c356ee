import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

// Helpers for the tests of a shut-down `RunLoopThread.current` loop handing its jobs to the fallback
// (commit e66260e), the exact order of one pass, common modes, descriptor sources, and waits
// across loops. Gates and polls only, never timing assertions.

/// A thread of the test's own that binds a `RunLoopThread.current` loop and then runs the
/// closures the test sends it, one at a time, until told to exit (its loop then drains).
final class CommandedCurrentLoopThread: Sendable {
  private let commands = Guarded<[@Sendable (RunLoopThread) -> Void]>([])
  private let quitting = Guarded(false)
  private let published = Guarded<RunLoopThread?>(nil)
  /// Opens when the thread's body returned (the loop's exit drain follows on that thread).
  let bodyEnded = TestGate()

  init() {
    ExecThread { [commands, quitting, published, bodyEnded] in
      let loop = RunLoopThread.current
      published.withLock { $0 = loop }
      while true {
        let next = commands.withLock { $0.isEmpty ? nil : $0.removeFirst() }
        if let next {
          next(loop)
          continue
        }
        if quitting.withLock({ $0 }) { break }
        usleep(300)
      }
      bodyEnded.open()
    }.detach()
  }

  /// The thread's loop (polls off the cooperative pool).
  func loop() async -> RunLoopThread {
    await execOnNewThread { [published] in
      while published.withLock({ $0 }) == nil { usleep(300) }
      return published.withLock { $0! }
    }
  }

  /// Sends `body` to the thread without waiting for it.
  func send(_ body: @escaping @Sendable (RunLoopThread) -> Void) {
    commands.withLock { $0.append(body) }
  }

  /// Runs `body` on the thread and returns its result (awaited without blocking the pool).
  func exec<T: Sendable>(_ body: @escaping @Sendable (RunLoopThread) -> T) async -> T {
    await withCheckedContinuation { (continuation: CheckedContinuation<T, Never>) in
      send { loop in continuation.resume(returning: body(loop)) }
    }
  }

  /// Lets the thread exit (its loop drains on it as it ends).
  func quit() { quitting.withLock { $0 = true } }
}

/// An actor on a loop that records overlapping jobs and whether one is in progress.
actor OverlapRecordingActor: LoopActor {
  nonisolated let loop: RunLoopThread
  nonisolated let overlap: JobOverlapCounter
  /// A job of this actor is running now (readable from anywhere).
  nonisolated let inJob = Guarded(false)
  private(set) var calls = 0

  init(loop: RunLoopThread, overlap: JobOverlapCounter = JobOverlapCounter()) {
    self.loop = loop
    self.overlap = overlap
  }

  /// One short job; returns whether it ran isolated to the loop.
  func call() -> Bool {
    overlap.enter()
    defer { overlap.leave() }
    calls += 1
    return loop.isIsolatingCurrentContext() == true
  }

  /// A job that stays on the stack until `release` opens; returns whether it ran on the loop's
  /// own thread.
  func hold(entered: TestGate, release: TestGate) -> Bool {
    overlap.enter()
    inJob.withLock { $0 = true }
    entered.open()
    _ = release.wait(timeout: .seconds(20))
    inJob.withLock { $0 = false }
    overlap.leave()
    calls += 1
    return loop.isOnLoopThread
  }

  /// Runs the loop nested inside this job (opens `entered` from inside the nested run).
  func nestedRun(_ mode: RunLoopMode, entered: TestGate) -> RunLoopRunResult {
    overlap.enter()
    defer { overlap.leave() }
    // Shut down before this job ran (the test's shutdown gave up waiting for the nested run),
    // this runs on the fallback, where `run` would trap: report that, and do not take the
    // whole test process down with it.
    guard loop.isOnLoopThread else {
      calls += 1
      return .finished
    }
    let marker = LoopTimer(after: .zero) { _ in entered.open() }
    loop.add(marker, to: mode)
    let result = loop.run(mode: mode, for: .seconds(20))
    marker.invalidate()
    calls += 1
    return result
  }

  /// A modal run of `mode` while this actor is suspended.
  func modal(_ mode: RunLoopMode) async throws(RunLoopError) -> RunLoopRunResult {
    // The limit only ends the run if the shutdown never comes (scaled: the 20 calls before it
    // took over 20 s under ThreadSanitizer in a full run).
    try await loop.runModal(mode: mode, for: .seconds(20) * watchdogScale)
  }
}

/// Which callout a run nested on a current loop's thread is made from.
enum CurrentLoopNestingSite: String, CaseIterable, Sendable {
  case job, block, timer, observer
}

extension OverlapRecordingActor {
  /// On this actor's loop: waits for `first`, whose block waits for `second`.
  func chain(through first: RunLoopThread, then second: RunLoopThread) throws -> Int {
    try first.performAndWait { () throws -> Int in
      try second.performAndWait { 1 } + 2
    }
  }
}

/// Helpers shared by the suites that conform (they call them as `Self.name` or by name).
protocol PassTestModes {}

extension PassTestModes {
  var modeM: RunLoopMode { RunLoopMode("m") }

  var modeNever: RunLoopMode { RunLoopMode("never") }

  // MARK: - 2. The exact order of one pass

  /// Runs `body` on a fresh current-loop thread with an observer of every activity in
  /// `observedMode`, and returns the log (activities and what `body` logged) and its result.
  func logged<T: Sendable>(
    _ observedMode: RunLoopMode = .default,
    _ body: @escaping @Sendable (RunLoopThread, EventLog) -> T
  ) async -> ([String], T) {
    let thread = CommandedCurrentLoopThread()
    defer { thread.quit() }
    return await thread.exec { loop in
      let log = EventLog()
      let observer = LoopObserver(activities: .all) { _, activity in log.add("\(activity)") }
      loop.add(observer, to: observedMode)
      let result = body(loop, log)
      observer.invalidate()
      return (log.snapshot, result)
    }
  }

  static func names(_ activities: [LoopActivity]) -> [String] { activities.map { "\($0)" } }
}
