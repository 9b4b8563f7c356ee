import Glibc
import Testing

@testable import AsyncRunLoop

// Helpers for the tests of loop-thread adds and removals that first apply the waiting changes
// (`LoopCore.afterWaitingChanges`), the loop-thread paths that still change state first
// (`invalidate()`, `setFireDate`), the shutdown drain, the chunked job queue, observers and
// timers. Blocking work runs on threads of the tests' own; results are checked after the
// watchdog returns.

let loopThreadModeA: RunLoopMode = "loop-thread-mode-a"

let loopThreadModeB: RunLoopMode = "loop-thread-mode-b"

let loopThreadModeC: RunLoopMode = "loop-thread-mode-c"

/// What the loop and a member's binding say, read on the loop thread.
struct BindingAgreement: Sendable, Equatable, CustomStringConvertible {
  var modes: [RunLoopMode]
  var bound: Bool
  var records: Int
  var registrations: Int

  var description: String {
    "modes \(modes.map(\.rawValue)), bound \(bound), records \(records), registrations \(registrations)"
  }
}

/// Reads the agreement for `member` on `loop`'s thread (nil when the loop refused the block).
func bindingAgreement(_ member: some LoopMember, on loop: RunLoopThread) -> BindingAgreement? {
  try? loop.performAndWait {
    BindingAgreement(
      modes: loop.core.modes(of: member).sorted { $0.rawValue < $1.rawValue },
      bound: member.isBound(to: loop.shared),
      records: loop.core.modeTable.allRecords.count,
      registrations: loop.core.descriptors.count)
  }
}

/// The same, read on the loop thread itself (inside a callout or block).
func bindingAgreementHere(_ member: some LoopMember, on loop: RunLoopThread) -> BindingAgreement {
  BindingAgreement(
    modes: loop.core.modes(of: member).sorted { $0.rawValue < $1.rawValue },
    bound: member.isBound(to: loop.shared),
    records: loop.core.modeTable.allRecords.count,
    registrations: loop.core.descriptors.count)
}

/// Runs `body` on `loop`'s thread (a performed block) while what `pending` sends from this thread
/// waits in the inbox: `pending` runs once the block has started, and the block goes on after.
func withChangeWaiting<T: Sendable>(
  on loop: RunLoopThread, pending: @escaping @Sendable () -> Void, _ body: @escaping @Sendable () -> T
) -> T? {
  let started = TestGate()
  let go = TestGate()
  let result = Locked<T?>(nil)
  let done = TestGate()
  loop.perform {
    started.open()
    _ = go.wait(timeout: .seconds(10))
    let value = body()
    result.withLock { $0 = value }
    done.open()
  }
  guard started.wait(timeout: .seconds(10)) else { return nil }
  pending()
  go.open()
  guard done.wait(timeout: .seconds(10)) else { return nil }
  return result.withLock { $0 }
}

/// Runs `loop` in `mode` for `duration` on its thread (from a performed block), and waits.
func runOnLoopAndWait(_ loop: RunLoopThread, mode: RunLoopMode, for duration: Duration) {
  let done = TestGate()
  loop.perform {
    _ = loop.run(mode: mode, for: duration)
    done.open()
  }
  _ = done.wait(timeout: .seconds(10))
}

/// A custom source that logs its routines under `name`.
func loggedSource(
  _ name: String, _ log: EventLog, pairs: PairLog? = nil,
  cancel extra: (@Sendable (InputSource, RunLoopThread) -> Void)? = nil,
  perform: @escaping @Sendable (InputSource) -> Void = { _ in }
) -> InputSource {
  InputSource(
    schedule: { _, loop, _ in
      log.add("schedule \(name)")
      pairs?.schedule(loop)
    },
    cancel: { source, loop in
      log.add("cancel \(name)")
      pairs?.cancel(loop)
      extra?(source, loop)
    }, perform: perform)
}

/// Two loops and a member moved between them by its own callout.
final class CalloutPingPongScenario: Sendable {
  let loops: [RunLoopThread]
  let fires = Guarded<[String]>([])
  let overlaps = AtomicCounter()
  let wrongLoop = AtomicCounter()
  let inCallout = Guarded(false)
  init(_ loops: [RunLoopThread]) { self.loops = loops }

  /// The other loop than the calling thread's.
  var other: RunLoopThread {
    let here = RunLoopThread.current
    return loops.first { $0 !== here }!
  }

  /// Marks a callout's start (counting overlaps) and records where it runs.
  func begin(_ member: some LoopMember) {
    let overlapped = inCallout.withLock { busy -> Bool in
      defer { busy = true }
      return busy
    }
    if overlapped { overlaps.increment() }
    let here = RunLoopThread.current
    // The test's final `invalidate()` (from its own thread) may land while a callout starts: an
    // invalidated member is on no loop, which is not a callout on the wrong loop. (`invalidate()`
    // does not wait for a callout; `invalidateAndWait()` does.)
    let onItsLoop = member.withBinding { $0.loop === here.shared || !$0.isValid }
    if !onItsLoop { wrongLoop.increment() }
    fires.withLock { $0.append(here.name) }
  }

  func end() { inCallout.withLock { $0 = false } }
}

/// An actor pinned to a loop: counts calls, and runs the loop modally from one of its methods.
actor CallCountingActor: LoopActor {
  nonisolated let loop: RunLoopThread
  private(set) var calls = 0
  private(set) var misisolated = 0
  init(loop: RunLoopThread) { self.loop = loop }

  func call() -> Int {
    if loop.isIsolatingCurrentContext() != true { misisolated += 1 }
    calls += 1
    return calls
  }

  /// Runs `mode` modally until `until` opens (checked by a timer in the mode), returning how many
  /// calls the actor served meanwhile, and the run's result.
  func modal(mode: RunLoopMode, until: TestGate) async throws -> (served: Int, result: RunLoopRunResult) {
    let before = calls
    let watcher = LoopTimer(after: .zero, repeatingEvery: .milliseconds(1)) { _ in
      if until.opened { RunLoopThread.current.stop() }
    }
    loop.add(watcher, to: mode)
    defer { watcher.invalidate() }
    // The limit only bounds a hang (scaled: under ThreadSanitizer 10 s served 1,929 of 2,000 calls).
    let result = try await loop.runModal(mode: mode, for: .seconds(10 * watchdogScale))
    return (calls - before, result)
  }

  /// Runs the loop nested (synchronously, inside this job) in `mode` until `release` opens.
  func holdInNestedRun(mode: RunLoopMode, started: TestGate, release: TestGate) {
    let watcher = LoopTimer(after: .zero, repeatingEvery: .milliseconds(1)) { _ in
      if release.opened { RunLoopThread.current.stop() }
    }
    loop.add(watcher, to: mode)
    defer { watcher.invalidate() }
    started.open()
    _ = loop.run(mode: mode, for: .seconds(10))
  }

  /// `performAndWait` on the actor's own loop (inline), nested three deep.
  func nestedPerformAndWait() throws -> Int {
    let loop = self.loop
    return try loop.performAndWait { try loop.performAndWait { try loop.performAndWait { 7 } } }
  }
}
