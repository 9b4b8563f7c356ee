import Glibc
import Testing

@testable import AsyncRunLoop

// Helpers for the tests of loop-thread adds and removes applying only the changes sent before the binding
// changed (`LoopCore.sequenceOfWaitingChanges`), the drain cap refusing changes as they arrive
// (`LoopInbox.refusesChangesFrom`), and `RunLoopMode` equality with its internal flag.
// Blocking work runs on threads of the tests' own; results are checked after the watchdog returns.

let racingModeM: RunLoopMode = "racing-mode-m"

let racingModeX: RunLoopMode = "racing-mode-x"

let racingModeY: RunLoopMode = "racing-mode-y"

/// Whether the loop's modes for `member` are its binding's (loop thread of `loop`).
func bindingDisagreement(_ loop: RunLoopThread, _ member: some LoopMember) -> String? {
  loop.core.applyControlsIfAny()
  let bound = bindingModes(member).flatMap { $0 == .common ? Array(loop.commonModes) : [$0] }
    .sorted { $0.rawValue < $1.rawValue }
  let here = loop.core.modes(of: member).sorted { $0.rawValue < $1.rawValue }
  return bound == here ? nil : "binding \(bound), loop \(here)"
}

/// Round after round, the loop thread changes `member`'s membership in `mode` while another
/// thread makes the opposite change at a varying moment. Counts rounds where loop and binding
/// disagree afterwards.
func raceMembership<Member: LoopMember>(
  _ member: Member, mode: RunLoopMode, loopThreadRemoves: Bool, rounds: Int,
  add: @escaping @Sendable (RunLoopThread, Member, RunLoopMode) -> Void,
  remove: @escaping @Sendable (RunLoopThread, Member, RunLoopMode) -> Void
) throws -> (mismatches: Int, example: String) {
  let loop = try RunLoopThread(name: "b1")
  defer { loop.shutdownAndWait() }
  add(loop, member, racingModeM)
  let go = AtomicCounter()
  let done = AtomicCounter()
  let other = startThread {
    for round in 1...rounds {
      while go.current < round { sched_yield() }
      for _ in 0..<(round % 64) { _ = done.current }
      if loopThreadRemoves { add(loop, member, mode) } else { remove(loop, member, mode) }
      _ = done.increment()
    }
  }
  let result = try loop.performAndWait { () -> (Int, String) in
    var mismatches = 0
    var example = ""
    for round in 1...rounds {
      if loopThreadRemoves { add(loop, member, mode) } else { remove(loop, member, mode) }
      _ = go.increment()
      if loopThreadRemoves { remove(loop, member, mode) } else { add(loop, member, mode) }
      while done.current < round { sched_yield() }
      if let disagreement = bindingDisagreement(loop, member) {
        mismatches += 1
        if example.isEmpty { example = "round \(round): \(disagreement)" }
      }
    }
    return (mismatches, example)
  }
  joinThread(other)
  return result
}

/// As `raceMembership` on a timer in mode X, while a third thread adds (and invalidates) a
/// source each round, as the round begins, whose schedule routines, on the loop thread while the loop applies the
/// changes another thread sent, wait until the round's opposite change has been sent and then make
/// a loop-thread call of their own on another timer (which applies every waiting change first).
func raceTimerMembershipWithCallouts(loopThreadRemoves: Bool, rounds: Int) throws -> (mismatches: Int, example: String)
{
  let loop = try RunLoopThread(name: "b3")
  defer { loop.shutdownAndWait() }
  let timer = LoopTimer(after: .seconds(3600)) { _ in }
  let other = LoopTimer(after: .seconds(3600)) { _ in }
  loop.add(timer, to: racingModeM)
  let go = AtomicCounter()
  let done = AtomicCounter()
  let stop = Guarded(false)
  let opposite = startThread {
    for round in 1...rounds {
      while go.current < round { sched_yield() }
      for _ in 0..<(round % 16) { _ = done.current }
      if loopThreadRemoves { loop.add(timer, to: racingModeX) } else { loop.remove(timer, from: racingModeX) }
      _ = done.increment()
    }
  }
  let flooder = startThread {
    for round in 1...rounds {
      while go.current < round && !stop.snapshot { sched_yield() }
      let source = InputSource(
        schedule: { _, loop, _ in
          let round = go.current
          let limit = ContinuousClock.now.advanced(by: .microseconds(500))
          while done.current < round && ContinuousClock.now < limit { sched_yield() }
          loop.add(other, to: racingModeY)
          loop.remove(other, from: racingModeY)
        }, cancel: { _, _ in }, perform: { _ in })
      loop.add(source, to: racingModeY)
      source.invalidate()
    }
  }
  let result = try loop.performAndWait { () -> (Int, String) in
    var mismatches = 0
    var example = ""
    for round in 1...rounds {
      if loopThreadRemoves { loop.add(timer, to: racingModeX) } else { loop.remove(timer, from: racingModeX) }
      _ = go.increment()
      if loopThreadRemoves { loop.remove(timer, from: racingModeX) } else { loop.add(timer, to: racingModeX) }
      while done.current < round { sched_yield() }
      if let disagreement = bindingDisagreement(loop, timer) {
        mismatches += 1
        if example.isEmpty { example = "round \(round): \(disagreement)" }
      }
    }
    stop.withLock { $0 = true }
    return (mismatches, example)
  }
  joinThread(opposite)
  joinThread(flooder)
  timer.invalidate()
  other.invalidate()
  return result
}

/// Shuts `loop` down with the drain's first round held past the one-second cap (a source's
/// cancel routine waits), runs `body` on another thread meanwhile (its changes are refused: the
/// loop is still draining, not terminated), then lets the drain end. Returns whether it ended.
func withDrainPastTheCap(_ loop: RunLoopThread, _ body: @escaping @Sendable () -> Void) -> Bool {
  let held = TestGate()
  let bodyDone = TestGate()
  let holder = InputSource(
    schedule: { _, _, _ in },
    cancel: { _, _ in
      let start = ContinuousClock.now
      while ContinuousClock.now < start.advanced(by: .milliseconds(1300)) { usleep(10_000) }
      held.open()
      bodyDone.wait(timeout: .seconds(20))
    }, perform: { _ in })
  loop.add(holder, to: .default)
  _ = try? loop.performAndWait {}  // the holder is on the loop
  let shutDown = TestGate()
  let shutter = startThread {
    loop.shutdownAndWait()
    shutDown.open()
  }
  if held.wait(timeout: .seconds(20)) { body() }
  bodyDone.open()
  joinThread(shutter)
  return shutDown.wait(timeout: .zero)
}
