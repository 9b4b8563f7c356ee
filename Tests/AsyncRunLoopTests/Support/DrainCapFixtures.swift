import Glibc
import Testing

@testable import AsyncRunLoop

// Helpers for the tests of the every-mode timers of executor jobs due later (`Task.sleep` under a loop's
// preference), `LoopTimer.setFireDate` coalescing, the shutdown drain's time cap, current loops
// taking jobs only inside a run, and signalled sources deferred while their modes do not run.
// Blocking work runs on threads of the tests' own; results are checked after the watchdog returns.

let drainPrivateMode: RunLoopMode = "drain-private-mode"

let drainInnerMode: RunLoopMode = "drain-inner-mode"

let drainModalMode: RunLoopMode = "drain-modal-mode"

let drainModeM: RunLoopMode = "drain-mode-m"

let drainModeX: RunLoopMode = "drain-mode-x"

/// An actor on a loop, for jobs that run the loop nested.
actor NestedRunActor: LoopActor {
  nonisolated let loop: RunLoopThread
  nonisolated let overlap = JobOverlapCounter()
  private(set) var calls = 0

  init(loop: RunLoopThread) { self.loop = loop }

  /// Runs the loop nested in this job, in `mode`, for `duration`.
  func nestedRun(_ mode: RunLoopMode, for duration: Duration, log: EventLog) -> RunLoopRunResult {
    log.add("nested begin")
    let result = loop.run(mode: mode, for: duration)
    log.add("nested end")
    return result
  }

  /// Sleeps `duration` isolated to the actor (no task executor preference); returns how long it
  /// took (nil: it threw).
  func sleep(_ duration: Duration) async -> Duration? {
    let start = ContinuousClock.now
    do { try await Task.sleep(for: duration) } catch { return nil }
    return ContinuousClock.now - start
  }

  /// One short job.
  func call() {
    overlap.enter()
    defer { overlap.leave() }
    calls += 1
  }
}

/// Sleeps `duration` under `loop`'s preference; returns how long it took (nil: it threw).
func sleepUnderPreference(on loop: RunLoopThread, _ duration: Duration) async -> Duration? {
  await Task(executorPreference: loop) { () -> Duration? in
    let start = ContinuousClock.now
    do { try await Task.sleep(for: duration) } catch { return nil }
    return ContinuousClock.now - start
  }.value
}

/// The mode names `member`'s binding holds (read through reflection: the list is private).
func bindingModes(_ member: some LoopMember) -> [RunLoopMode] {
  member.withBinding { binding -> [RunLoopMode] in
    guard let names = Mirror(reflecting: binding).children.first(where: { $0.label == "modes" })?.value else {
      return []
    }
    var modes: [RunLoopMode] = []
    for child in Mirror(reflecting: names).children {
      if child.label == "first", let first = child.value as? RunLoopMode?, let first { modes.append(first) }
      if child.label == "others", let others = child.value as? [RunLoopMode] { modes += others }
    }
    return modes.sorted { $0.rawValue < $1.rawValue }
  }
}

/// Round after round, the loop thread changes `timer`'s membership in mode X (it stays in mode M)
/// while another thread makes the opposite change at a varying moment (`loopThreadRemoves`: the
/// loop thread removes, the other adds; else the reverse). After each round (both calls
/// returned, the changes applied), counts the rounds where the loop's modes for the timer differ
/// from its binding's.
func raceTimerMembership(loopThreadRemoves: Bool, rounds: Int) throws -> (mismatches: Int, example: String) {
  let loop = try RunLoopThread(name: "b1")
  defer { loop.shutdownAndWait() }
  let timer = LoopTimer(after: .seconds(3600)) { _ in }
  loop.add(timer, to: drainModeM)
  let go = AtomicCounter()
  let done = AtomicCounter()
  let other = startThread {
    for round in 1...rounds {
      while go.current < round { sched_yield() }
      for _ in 0..<(round % 64) { _ = done.current }
      if loopThreadRemoves { loop.add(timer, to: drainModeX) } else { loop.remove(timer, from: drainModeX) }
      _ = done.increment()
    }
  }
  let result = try loop.performAndWait { () -> (Int, String) in
    var mismatches = 0
    var example = ""
    for round in 1...rounds {
      if loopThreadRemoves { loop.add(timer, to: drainModeX) } else { loop.remove(timer, from: drainModeX) }
      _ = go.increment()
      if loopThreadRemoves { loop.remove(timer, from: drainModeX) } else { loop.add(timer, to: drainModeX) }
      while done.current < round { sched_yield() }
      loop.core.applyControlsIfAny()
      let bound = bindingModes(timer)
      let here = loop.core.modes(of: timer).sorted { $0.rawValue < $1.rawValue }
      if bound != here {
        mismatches += 1
        if example.isEmpty { example = "round \(round): binding \(bound), loop \(here)" }
      }
    }
    return (mismatches, example)
  }
  joinThread(other)
  timer.invalidate()
  return result
}
