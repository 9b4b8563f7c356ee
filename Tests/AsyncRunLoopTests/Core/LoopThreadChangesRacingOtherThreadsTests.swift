import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("Loop-thread changes racing other threads' changes keep one order", .serialized, .timeLimit(.minutes(10)))
struct LoopThreadChangesRacingOtherThreadsTests {
  /// The loop thread adds a source to `.common` while another thread removes it from `.common`
  /// (and the reverse), 3,000 rounds. Promised: loop and binding agree after every round, and
  /// every schedule is paired with a cancel once the source is invalidated.
  @Test(arguments: [true, false])
  func commonAddsAndRemovesRacingLeaveLoopAndBindingAgreeing(loopThreadRemoves: Bool) async throws {
    let pairs = PairLog()
    let source = InputSource(
      schedule: { _, loop, _ in pairs.schedule(loop) }, cancel: { _, loop in pairs.cancel(loop) }, perform: { _ in })
    let outcome = try await withWatchdogOnThread(timeout: .seconds(60), "common race") {
      try raceMembership(
        source, mode: .common, loopThreadRemoves: loopThreadRemoves, rounds: 3_000,
        add: { $0.add($1, to: $2) }, remove: { $0.remove($1, from: $2) })
    }
    source.invalidate()
    guard let outcome else { return }
    #expect(outcome.mismatches == 0, "\(outcome.mismatches) of 3,000: \(outcome.example)")
    #expect(pairs.unpaired == [])
  }

  /// The loop-thread change of a timer races another thread's opposite change while the
  /// second application (the changes sent before the binding changed) runs schedule routines
  /// that make loop-thread calls of their own, 3,000 rounds. Promised (`bind`/`unbind`): a change
  /// sent after the binding changed never overtakes the call, so loop and binding agree. Found:
  /// as `aNestedCallInTheSecondApplicationDoesNotLetALaterChangeOvertake`, by chance (1-2 rounds
  /// of 3,000 in about a third of the runs).
  @Test(arguments: [true, false])
  func aNestedLoopThreadCallInTheSecondApplicationKeepsLoopAndBindingAgreeing(loopThreadRemoves: Bool)
    async throws
  {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(60), "nested call race") {
      try raceTimerMembershipWithCallouts(loopThreadRemoves: loopThreadRemoves, rounds: 3_000)
    }
    guard let outcome else { return }
    #expect(outcome.mismatches == 0, "\(outcome.mismatches) of 3,000: \(outcome.example)")
  }

  /// 20,000 sources added from another thread wait in the inbox (the loop is blocked); each
  /// one's schedule routine adds a timer to a mode, a loop-thread call. Promised: a schedule
  /// routine may add members on the loop thread; every source is scheduled and the loop lives on.
  /// Found: each loop-thread call first applies every waiting change (`bind`'s
  /// `applyControlsIfAny`), whose schedule routine makes the next call: the recursion is as deep
  /// as the queue and overflows the loop thread's stack (SIGSEGV, the whole test process dies).
  @Test
  func scheduleRoutinesAddingOnTheLoopThreadDoNotRecursePerWaitingChange() async throws {
    let loop = try RunLoopThread(name: "s1")
    defer { loop.shutdownAndWait() }
    let timer = LoopTimer(after: .seconds(3600)) { _ in }
    let scheduled = AtomicCounter()
    let count = 20_000
    let outcome = try await withWatchdogOnThread(timeout: .seconds(60), "recursive schedules") { () -> Int? in
      let release = blockLoop(loop)
      var sources: [InputSource] = []
      for _ in 0..<count {
        let source = InputSource(
          schedule: { _, loop, _ in
            loop.add(timer, to: racingModeY)
            scheduled.increment()
          }, cancel: { _, _ in }, perform: { _ in })
        loop.add(source, to: racingModeY)
        sources.append(source)
      }
      release.open()
      let seen = try? loop.performAndWait { scheduled.current }
      for source in sources { source.invalidate() }
      timer.invalidate()
      return seen
    }
    #expect(outcome == count)
  }

  /// Step by step, no race: the loop thread adds a timer to X (or removes it) while source P's
  /// add waits in the inbox. P's schedule routine (the call's first application) has another
  /// thread add source S, so S's add arrives before the binding changes and is applied after it
  /// (`applyControls(through:)`). S's schedule routine has a third thread make the opposite change
  /// of the timer (sent after the binding changed) and then makes a loop-thread call on another
  /// timer. Promised (`bind`/`unbind`): a change sent after the binding changed must not overtake
  /// the call, so loop and binding agree. Found: the nested call applies every waiting change,
  /// the opposite one too, before the outer call's own change.
  @Test(arguments: [true, false])
  func aNestedCallInTheSecondApplicationDoesNotLetALaterChangeOvertake(loopThreadRemoves: Bool) async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "nested overtaking") { () -> String? in
      let loop = try RunLoopThread(name: "n1")
      defer { loop.shutdownAndWait() }
      let timer = LoopTimer(after: .seconds(3600)) { _ in }
      let other = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(timer, to: racingModeM)
      if loopThreadRemoves { loop.add(timer, to: racingModeX) }
      let s = InputSource(
        schedule: { _, loop, _ in
          joinThread(
            startThread {
              if loopThreadRemoves { loop.add(timer, to: racingModeX) } else { loop.remove(timer, from: racingModeX) }
            })
          loop.add(other, to: racingModeY)
        }, cancel: { _, _ in }, perform: { _ in })
      let p = InputSource(
        schedule: { _, loop, _ in joinThread(startThread { loop.add(s, to: racingModeY) }) }, cancel: { _, _ in },
        perform: { _ in })
      let disagreement = try loop.performAndWait { () -> String? in
        joinThread(startThread { loop.add(p, to: racingModeY) })
        if loopThreadRemoves { loop.remove(timer, from: racingModeX) } else { loop.add(timer, to: racingModeX) }
        return bindingDisagreement(loop, timer) ?? "agree"
      }
      for member in [s, p] { member.invalidate() }
      timer.invalidate()
      other.invalidate()
      return disagreement
    }
    #expect(outcome == "agree")
  }

  /// The same race on a descriptor source in a named mode. Promised: as above.
  @Test(arguments: [true, false])
  func descriptorAddsAndRemovesRacingLeaveLoopAndBindingAgreeing(loopThreadRemoves: Bool) async throws {
    let pipe = makePipe()
    defer {
      close(pipe.read)
      close(pipe.write)
    }
    let source = DescriptorSource(descriptor: pipe.read, interest: .readable) { _, _ in }
    let outcome = try await withWatchdogOnThread(timeout: .seconds(60), "descriptor race") {
      try raceMembership(
        source, mode: racingModeX, loopThreadRemoves: loopThreadRemoves, rounds: 3_000,
        add: { try? $0.add($1, to: $2) }, remove: { $0.remove($1, from: $2) })
    }
    source.invalidate()
    guard let outcome else { return }
    #expect(outcome.mismatches == 0, "\(outcome.mismatches) of 3,000: \(outcome.example)")
  }

  /// Another thread adds a fresh source whose schedule routine (on the loop thread, inside the
  /// application of that add) adds a timer to X or removes it, while a third thread makes the
  /// opposite change of the timer, 2,000 rounds. Promised: loop and binding agree after each round.
  @Test(arguments: [true, false])
  func aCalloutChangingAnotherMemberRacingAThirdThreadLeavesThemAgreeing(calloutRemoves: Bool) async throws {
    let rounds = 2_000
    let outcome = try await withWatchdogOnThread(timeout: .seconds(60), "callout race") { () -> (Int, String)? in
      let loop = try RunLoopThread(name: "b2")
      defer { loop.shutdownAndWait() }
      let timer = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(timer, to: racingModeM)
      let go = AtomicCounter()
      let done = AtomicCounter()
      let other = startThread {
        for round in 1...rounds {
          while go.current < round { sched_yield() }
          for _ in 0..<(round % 32) { _ = done.current }
          if calloutRemoves { loop.add(timer, to: racingModeX) } else { loop.remove(timer, from: racingModeX) }
          _ = done.increment()
        }
      }
      var mismatches = 0
      var example = ""
      for round in 1...rounds {
        if calloutRemoves { loop.add(timer, to: racingModeX) } else { loop.remove(timer, from: racingModeX) }
        let scheduled = TestGate()
        let source = InputSource(
          schedule: { _, loop, _ in
            if calloutRemoves { loop.remove(timer, from: racingModeX) } else { loop.add(timer, to: racingModeX) }
            scheduled.open()
          }, cancel: { _, _ in }, perform: { _ in })
        _ = go.increment()
        loop.add(source, to: racingModeY)
        scheduled.wait(timeout: .seconds(10))
        while done.current < round { sched_yield() }
        let disagreement = try loop.performAndWait { bindingDisagreement(loop, timer) }
        source.invalidate()
        if let disagreement {
          mismatches += 1
          if example.isEmpty { example = "round \(round): \(disagreement)" }
        }
      }
      joinThread(other)
      timer.invalidate()
      return (mismatches, example)
    }
    guard let outcome, let outcome else { return }
    #expect(outcome.0 == 0, "\(outcome.0) of \(rounds): \(outcome.1)")
  }
}
