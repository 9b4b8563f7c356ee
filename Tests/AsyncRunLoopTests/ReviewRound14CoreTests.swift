import Glibc
import Testing

@testable import AsyncRunLoop

// Review round 14 (core): loop-thread adds and removals that first apply the waiting changes
// (`LoopCore.afterWaitingChanges`), the loop-thread paths that still change state first
// (`invalidate()`, `setFireDate`), the shutdown drain, the chunked job queue, observers and
// timers. Blocking work runs on threads of the tests' own; results are checked after the
// watchdog returns.

private let r14cModeA: RunLoopMode = "r14c-a"
private let r14cModeB: RunLoopMode = "r14c-b"
private let r14cModeC: RunLoopMode = "r14c-c"

/// What the loop and a member's binding say, read on the loop thread.
private struct R14CAgreement: Sendable, Equatable, CustomStringConvertible {
  var modes: [RunLoopMode]
  var bound: Bool
  var records: Int
  var registrations: Int

  var description: String {
    "modes \(modes.map(\.rawValue)), bound \(bound), records \(records), registrations \(registrations)"
  }
}

/// Reads the agreement for `member` on `loop`'s thread (nil when the loop refused the block).
private func r14cAgreement(_ member: some LoopMember, on loop: RunLoopThread) -> R14CAgreement? {
  try? loop.performAndWait {
    R14CAgreement(
      modes: loop.core.modes(of: member).sorted { $0.rawValue < $1.rawValue },
      bound: member.isBound(to: loop.shared),
      records: loop.core.modeTable.allRecords.count,
      registrations: loop.core.descriptors.count)
  }
}

/// The same, read on the loop thread itself (inside a callout or block).
private func r14cAgreementHere(_ member: some LoopMember, on loop: RunLoopThread) -> R14CAgreement {
  R14CAgreement(
    modes: loop.core.modes(of: member).sorted { $0.rawValue < $1.rawValue },
    bound: member.isBound(to: loop.shared),
    records: loop.core.modeTable.allRecords.count,
    registrations: loop.core.descriptors.count)
}

/// Runs `body` on `loop`'s thread (a performed block) while what `pending` sends from this thread
/// waits in the inbox: `pending` runs once the block has started, and the block goes on after.
private func r14cWithChangeWaiting<T: Sendable>(
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
private func r14cRun(_ loop: RunLoopThread, mode: RunLoopMode, for duration: Duration) {
  let done = TestGate()
  loop.perform {
    _ = loop.run(mode: mode, for: duration)
    done.open()
  }
  _ = done.wait(timeout: .seconds(10))
}

/// A custom source that logs its routines under `name`.
private func r14cLoggedSource(
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

@Suite("ReviewRound14Core: loop-thread adds after waiting changes", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound14CoreAddTests {
  /// A timer in mode A is added on the loop thread to mode B while a removal of another source
  /// waits; that source's cancel routine (applied first) removes the timer from A, its last mode.
  /// Promised: the calls apply in order (removed from A, then added to B): the timer is in B only,
  /// the loop holds one record for it, and it fires once when mode B runs.
  @Test func aLoopThreadTimerAddAfterAWaitingCalloutRemovedIt() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "timer add after callout") {
      () throws -> (inside: R14CAgreement?, after: R14CAgreement?, fires: Int) in
      let loop = try RunLoopThread(name: "r14c-t1")
      defer { loop.shutdownAndWait() }
      let fires = AtomicCounter()
      let timer = LoopTimer(after: .zero) { _ in fires.increment() }
      let log = EventLog()
      loop.add(timer, to: r14cModeA)
      let other = r14cLoggedSource("other", log, cancel: { _, loop in loop.remove(timer, from: r14cModeA) })
      loop.add(other)
      _ = try loop.performAndWait {}
      let inside = r14cWithChangeWaiting(on: loop, pending: { loop.remove(other) }) {
        loop.add(timer, to: r14cModeB)
        return r14cAgreementHere(timer, on: loop)
      }
      r14cRun(loop, mode: r14cModeB, for: .milliseconds(30))
      let after = r14cAgreement(timer, on: loop)
      timer.invalidate()
      return (inside, after, fires.current)
    }
    guard let outcome else { return }
    let expected = R14CAgreement(modes: [r14cModeB], bound: true, records: 1, registrations: 0)
    #expect(outcome.inside == expected)
    #expect(outcome.fires == 1)
    #expect(outcome.after == R14CAgreement(modes: [], bound: false, records: 0, registrations: 0))
  }

  /// An observer in mode A is added on the loop thread to mode B while a removal of another
  /// source waits, whose cancel routine invalidates the observer. Promised: the invalidation
  /// comes first, so the add is ignored: the observer is on no loop, the loop holds no record of
  /// it, and it is never told.
  @Test func aLoopThreadObserverAddAfterAWaitingCalloutInvalidatedIt() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "observer add after invalidation") {
      () throws -> (inside: R14CAgreement?, told: Int, valid: Bool) in
      let loop = try RunLoopThread(name: "r14c-t2")
      defer { loop.shutdownAndWait() }
      let told = AtomicCounter()
      let observer = LoopObserver(activities: .entry) { _, _ in told.increment() }
      loop.add(observer, to: r14cModeA)
      let log = EventLog()
      let other = r14cLoggedSource("other", log, cancel: { _, _ in observer.invalidate() })
      loop.add(other)
      _ = try loop.performAndWait {}
      let inside = r14cWithChangeWaiting(on: loop, pending: { loop.remove(other) }) {
        loop.add(observer, to: r14cModeB)
        return r14cAgreementHere(observer, on: loop)
      }
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: r14cModeB)
      r14cRun(loop, mode: r14cModeB, for: .milliseconds(20))
      keep.invalidate()
      return (inside, told.current, observer.isValid)
    }
    guard let outcome else { return }
    #expect(outcome.inside == R14CAgreement(modes: [], bound: false, records: 0, registrations: 0))
    #expect(outcome.told == 0)
    #expect(!outcome.valid)
  }

  /// A custom source in mode A is added on the loop thread to mode B while the invalidation of a
  /// command source (sent from another thread with commands still buffered) waits; the closing
  /// delivery's handler removes the first source from A and runs the loop nested in mode C.
  /// Promised: the closing delivery comes first (every accepted command once, before the command
  /// source's cancel), so the source's stay ends (cancel) and a new one begins in B (schedule);
  /// the loop and the binding agree.
  @Test func aLoopThreadAddAfterAClosingDeliveryRemovedIt() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "add after closing delivery") {
      () throws -> (inside: R14CAgreement?, log: [String], delivered: [Int], after: R14CAgreement?) in
      let loop = try RunLoopThread(name: "r14c-t3")
      defer { loop.shutdownAndWait() }
      let log = EventLog()
      let member = r14cLoggedSource("member", log)
      loop.add(member, to: r14cModeA)
      let delivered = Guarded<[Int]>([])
      let command = CommandSource<Int>(cancel: { _, _ in log.add("cancel command") }) { value in
        delivered.withLock { $0.append(value) }
        if value == 1 {
          let loop = RunLoopThread.current
          loop.remove(member, from: r14cModeA)
          _ = loop.run(mode: r14cModeC, for: .milliseconds(5))
        }
      }
      loop.add(command.source)
      _ = try loop.performAndWait {}
      let inside = r14cWithChangeWaiting(
        on: loop,
        pending: {
          for value in 0..<3 { command.post(value) }
          command.source.invalidate()
        }
      ) {
        loop.add(member, to: r14cModeB)
        return r14cAgreementHere(member, on: loop)
      }
      let after = r14cAgreement(member, on: loop)
      member.invalidate()
      _ = try loop.performAndWait {}
      return (inside, log.snapshot, delivered.snapshot, after)
    }
    guard let outcome else { return }
    let expected = R14CAgreement(modes: [r14cModeB], bound: true, records: 1, registrations: 0)
    #expect(outcome.inside == expected)
    #expect(outcome.after == expected)
    #expect(outcome.delivered == [0, 1, 2])
    #expect(
      outcome.log == ["schedule member", "cancel member", "cancel command", "schedule member", "cancel member"],
      "\(outcome.log)")
  }

  /// A readiness source in mode A is removed on the loop thread from A while an add of it to mode
  /// B, sent from another thread, waits, and a removal of another source waits behind it whose
  /// cancel routine removes it from B. Promised: the calls apply in the order made (add B,
  /// remove B, remove A): the descriptor is deregistered, the binding says "on no loop", and the
  /// loop spins on nothing (the pipe is left readable).
  @Test func aLoopThreadRemovalOfADescriptorAfterWaitingAddAndRemove() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "descriptor removal after waits") {
      () throws -> (inside: R14CAgreement?, after: R14CAgreement?, handled: Int) in
      let loop = try RunLoopThread(name: "r14c-t4")
      defer { loop.shutdownAndWait() }
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let handled = AtomicCounter()
      let member = DescriptorSource(descriptor: pipe.read) { _, _ in handled.increment() }
      try loop.add(member, to: r14cModeA)
      let log = EventLog()
      let other = r14cLoggedSource("other", log, cancel: { _, loop in loop.remove(member, from: r14cModeB) })
      loop.add(other)
      _ = try loop.performAndWait {}
      let inside = r14cWithChangeWaiting(
        on: loop,
        pending: {
          try? loop.add(member, to: r14cModeB)
          loop.remove(other)
        }
      ) {
        loop.remove(member, from: r14cModeA)
        return r14cAgreementHere(member, on: loop)
      }
      writeByte(pipe.write)
      r14cRun(loop, mode: r14cModeA, for: .milliseconds(20))
      r14cRun(loop, mode: r14cModeB, for: .milliseconds(20))
      let after = r14cAgreement(member, on: loop)
      member.invalidate()
      return (inside, after, handled.current)
    }
    guard let outcome else { return }
    let none = R14CAgreement(modes: [], bound: false, records: 0, registrations: 0)
    #expect(outcome.inside == none)
    #expect(outcome.after == none)
    #expect(outcome.handled == 0)
  }

  /// A custom source is added on the loop thread to `.common` while a waiting custom change (sent
  /// from another thread) adds mode C to the common set, and a removal of another source waits
  /// behind it whose cancel routine adds mode B to the common set on the loop thread. Promised: a
  /// member in `.common` is in every common mode, also those that join the set before or after.
  @Test func aLoopThreadCommonAddAfterWaitingCommonModeChanges() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "common add after waits") {
      () throws -> (inside: R14CAgreement?, later: R14CAgreement?, log: [String]) in
      let loop = try RunLoopThread(name: "r14c-t5")
      defer { loop.shutdownAndWait() }
      let log = EventLog()
      let member = r14cLoggedSource("member", log)
      let other = r14cLoggedSource("other", log, cancel: { _, loop in loop.addModeToCommonModes(r14cModeB) })
      loop.add(other)
      _ = try loop.performAndWait {}
      let inside = r14cWithChangeWaiting(
        on: loop,
        pending: {
          loop.addModeToCommonModes(r14cModeC)
          loop.remove(other)
        }
      ) {
        loop.add(member, to: .common)
        return r14cAgreementHere(member, on: loop)
      }
      loop.addModeToCommonModes(r14cModeA)
      let later = r14cAgreement(member, on: loop)
      member.invalidate()
      _ = try loop.performAndWait {}
      return (inside, later, log.snapshot)
    }
    guard let outcome else { return }
    #expect(outcome.inside?.modes == [.default, r14cModeB, r14cModeC].sorted { $0.rawValue < $1.rawValue })
    #expect(outcome.inside?.records == 1)
    #expect(outcome.later?.modes == [.default, r14cModeA, r14cModeB, r14cModeC].sorted { $0.rawValue < $1.rawValue })
    #expect(outcome.log == ["schedule other", "cancel other", "schedule member", "cancel member"], "\(outcome.log)")
  }

  /// A readiness source on descriptor N is invalidated from another thread while the loop is
  /// busy; then, on the loop thread, a second readiness source on N is added. Promised: the
  /// invalidation was made first, so it is applied first: the second source registers (no
  /// `EEXIST`), hears the pipe, and the loop holds exactly its registration.
  @Test func aLoopThreadDescriptorAddAfterAWaitingInvalidationOfTheSameNumber() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "descriptor add after invalidation") {
      () throws -> (added: Bool, inside: R14CAgreement?, heardFirst: Int, heardSecond: Int, after: R14CAgreement?) in
      let loop = try RunLoopThread(name: "r14c-t8")
      defer { loop.shutdownAndWait() }
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let heardFirst = AtomicCounter()
      let heardSecond = AtomicCounter()
      let first = DescriptorSource(descriptor: pipe.read) { _, _ in heardFirst.increment() }
      let second = DescriptorSource(descriptor: pipe.read) { _, _ in
        heardSecond.increment()
        _ = drainDescriptor(pipe.read)
      }
      try loop.add(first)
      _ = try loop.performAndWait {}
      let inside = r14cWithChangeWaiting(on: loop, pending: { first.invalidate() }) { () -> (Bool, R14CAgreement) in
        let added = (try? loop.add(second)) != nil
        return (added, r14cAgreementHere(second, on: loop))
      }
      writeByte(pipe.write)
      waitUntil("the second source hears the pipe") { heardSecond.current >= 1 }
      second.invalidate()
      let after = r14cAgreement(second, on: loop)
      return (inside?.0 ?? false, inside?.1, heardFirst.current, heardSecond.current, after)
    }
    guard let outcome else { return }
    #expect(outcome.added)
    #expect(outcome.inside == R14CAgreement(modes: [.default], bound: true, records: 1, registrations: 1))
    #expect(outcome.heardFirst == 0)
    #expect(outcome.heardSecond >= 1)
    #expect(outcome.after == R14CAgreement(modes: [], bound: false, records: 0, registrations: 0))
  }

  /// A source in `.common` (the common set is default and B) is removed on the loop thread from
  /// `.default` by name, then mode C joins the common set by a change from another thread that
  /// waits while the loop thread removes the source from `.common`. Promised: removing
  /// `.default` by name takes it out of that mode only; a mode that joins the common set later
  /// still receives it; removing `.common` then takes it off the loop (cancel once, no record).
  @Test func commonModeRemovalsByNameAndACommonModeJoiningWhileARemovalWaits() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "common removals") {
      () throws -> (afterDefault: R14CAgreement?, inside: R14CAgreement?, log: [String]) in
      let loop = try RunLoopThread(name: "r14c-t7")
      defer { loop.shutdownAndWait() }
      let log = EventLog()
      let member = r14cLoggedSource("member", log)
      loop.addModeToCommonModes(r14cModeB)
      loop.add(member, to: .common)
      _ = try loop.performAndWait { loop.remove(member, from: .default) }
      let afterDefault = r14cAgreement(member, on: loop)
      let inside = r14cWithChangeWaiting(on: loop, pending: { loop.addModeToCommonModes(r14cModeC) }) {
        let before = r14cAgreementHere(member, on: loop)
        loop.remove(member, from: .common)
        return before.modes == [r14cModeB] ? r14cAgreementHere(member, on: loop) : before
      }
      return (afterDefault, inside, log.snapshot)
    }
    guard let outcome else { return }
    #expect(outcome.afterDefault?.modes == [r14cModeB])
    #expect(outcome.afterDefault?.bound == true)
    #expect(outcome.inside == R14CAgreement(modes: [], bound: false, records: 0, registrations: 0))
    #expect(outcome.log == ["schedule member", "cancel member"], "\(outcome.log)")
  }

  /// Another thread sends registration changes without pause (a timer's new fire date, again and
  /// again) while the loop thread adds a source. The loop stays live meanwhile (a repeating timer
  /// keeps firing: passes apply a bounded number of changes each). Promised: "at once when called
  /// there": the loop-thread add returns while the flood goes on (it comes after the changes sent
  /// before it, and need not wait for those sent after it, let alone for the sender to stop).
  @Test
  func aLoopThreadAddReturnsDuringAFloodOfChangesFromAnotherThread() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "add during a flood") {
      () throws -> (returned: Bool, sent: Int, ticksBefore: Int, modes: [RunLoopMode]) in
      let loop = try RunLoopThread(name: "r14c-t6")
      defer { loop.shutdownAndWait() }
      let busy = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(busy, to: r14cModeC)
      let ticks = AtomicCounter()
      let ticker = LoopTimer(after: .zero, repeatingEvery: .milliseconds(1)) { _ in ticks.increment() }
      loop.add(ticker)
      _ = try loop.performAndWait {}
      let stop = Guarded(false)
      let sent = AtomicCounter()
      let flooder = startThread {
        var date = LoopClock.Instant.now.advanced(by: .seconds(3600))
        while !stop.snapshot {
          for _ in 0..<64 {
            date = date.advanced(by: .nanoseconds(1))
            busy.setFireDate(date)
          }
          sent.increment()
        }
      }
      waitUntil("the flood started") { sent.current > 100 }
      let before = ticks.current
      usleep(200_000)
      let ticksBefore = ticks.current - before
      let member = InputSource(perform: { _ in })
      let returned = TestGate()
      let modes = Guarded<[RunLoopMode]>([])
      loop.perform {
        loop.add(member, to: r14cModeA)
        modes.withLock { $0 = loop.core.modes(of: member) }
        returned.open()
      }
      let inTime = returned.wait(timeout: .seconds(10 * watchdogScale))
      stop.withLock { $0 = true }
      joinThread(flooder)
      _ = returned.wait(timeout: .seconds(20))
      member.invalidate()
      busy.invalidate()
      ticker.invalidate()
      return (inTime, sent.current * 64, ticksBefore, modes.snapshot)
    }
    guard let outcome else { return }
    #expect(outcome.ticksBefore > 0, "the loop was not live during the flood")
    #expect(
      outcome.returned,
      "the loop-thread add did not return in 10 s (times the watchdog scale) while \(outcome.sent) changes were sent")
    #expect(outcome.modes == [r14cModeA])
  }
}

extension ReviewRound14CoreAddTests {
  /// Another thread sends a change every 100 microseconds (slower than the loop applies them)
  /// while the loop thread adds and removes 2,000 sources in one block. Promised: each call comes
  /// after the changes sent before it and returns: the retry of `afterWaitingChanges` (again
  /// while a change arrived meanwhile) does not livelock under a steady trickle; at the end the
  /// loop holds exactly the timer's record.
  @Test func loopThreadAddsAndRemovesFinishUnderASteadyTrickleOfChanges() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "adds under a trickle") {
      () throws -> (finished: Bool, records: Int?, sent: Int) in
      let loop = try RunLoopThread(name: "r14c-t9")
      defer { loop.shutdownAndWait() }
      let busy = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(busy, to: r14cModeC)
      _ = try loop.performAndWait {}
      let stop = Guarded(false)
      let sent = AtomicCounter()
      let trickler = startThread {
        var date = LoopClock.Instant.now.advanced(by: .seconds(3600))
        while !stop.snapshot {
          date = date.advanced(by: .nanoseconds(1))
          busy.setFireDate(date)
          sent.increment()
          usleep(100)  // (sleeping, not spinning: under a sanitizer on two cores a spin starved the loop)
        }
      }
      waitUntil("the trickle started") { sent.current > 100 }
      let finished = TestGate()
      loop.perform {
        for _ in 0..<2_000 {
          let source = InputSource(perform: { _ in })
          loop.add(source, to: r14cModeA)
          loop.remove(source, from: r14cModeA)
        }
        finished.open()
      }
      let inTime = finished.wait(timeout: .seconds(10 * watchdogScale))
      stop.withLock { $0 = true }
      joinThread(trickler)
      _ = finished.wait(timeout: .seconds(10 * watchdogScale))
      let records = try? loop.performAndWait { loop.core.modeTable.allRecords.count }
      busy.invalidate()
      return (inTime, records, sent.current)
    }
    guard let outcome else { return }
    #expect(
      outcome.finished,
      "2,000 loop-thread adds and removals did not finish in 10 s (times the watchdog scale; \(outcome.sent) sent)")
    #expect(outcome.records == 1)
  }
}

extension ReviewRound14CoreAddTests {
  /// A loop-thread `add(member, to: B)` while a removal of another source waits; that source's
  /// cancel routine runs the loop nested in mode C, during which another thread adds the member
  /// to C and then removes it from C again, and the nested run applies both. Promised: each call
  /// comes after the changes sent before it, so the member ends in B only, scheduled once, the
  /// loop holding one record for it; the nested run heard nothing of it.
  @Test func aLoopThreadAddAfterANestedRunThatAppliedOtherThreadsChanges() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "add after nested run") {
      () throws -> (inside: R14CAgreement?, nestedSaw: [RunLoopMode], log: [String]) in
      let loop = try RunLoopThread(name: "r14c-t10")
      defer { loop.shutdownAndWait() }
      let log = EventLog()
      let member = r14cLoggedSource("member", log)
      let inNested = TestGate()
      let sent = TestGate()
      let nestedSaw = Guarded<[RunLoopMode]>([])
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: r14cModeC)
      let other = r14cLoggedSource(
        "other", log,
        cancel: { _, loop in
          let watcher = LoopTimer(after: .zero, repeatingEvery: .milliseconds(1)) { _ in
            inNested.open()
            if sent.opened {
              nestedSaw.withLock { $0 = loop.core.modes(of: member) }
              RunLoopThread.current.stop()
            }
          }
          loop.add(watcher, to: r14cModeC)
          _ = loop.run(mode: r14cModeC, for: .seconds(5))
          watcher.invalidate()
        })
      loop.add(other)
      _ = try loop.performAndWait {}
      startThread(detached: true) {
        _ = inNested.wait(timeout: .seconds(10))
        loop.add(member, to: r14cModeC)
        loop.remove(member, from: r14cModeC)
        loop.wakeUp()
        usleep(5_000)
        sent.open()
      }
      let inside = r14cWithChangeWaiting(on: loop, pending: { loop.remove(other) }) {
        loop.add(member, to: r14cModeB)
        return r14cAgreementHere(member, on: loop)
      }
      member.invalidate()
      keep.invalidate()
      _ = try loop.performAndWait {}
      return (inside, nestedSaw.snapshot, log.snapshot)
    }
    guard let outcome else { return }
    #expect(outcome.inside == R14CAgreement(modes: [r14cModeB], bound: true, records: 2, registrations: 0))
    #expect(outcome.nestedSaw == [])
    #expect(
      outcome.log == [
        "schedule other", "cancel other", "schedule member", "cancel member", "schedule member", "cancel member",
      ], "\(outcome.log)")
  }
}

extension ReviewRound14CoreAddTests {
  /// A timer added to mode C by name, then to `.common` on the loop thread while a change that
  /// puts C into the common set waits (so C holds it by name and through `.common`). Promised:
  /// removing `.common` undoes only the add to `.common` (it stays in C, by name, and fires
  /// there); a mode that joins the common set afterwards does not receive it; removing C then
  /// takes it off the loop.
  @Test func aModeHeldByNameAndThroughCommonKeepsTheMemberAfterRemovingCommon() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "by name and common") {
      () throws -> (inside: [RunLoopMode]?, afterCommon: R14CAgreement?, fired: Int, final: R14CAgreement?) in
      let loop = try RunLoopThread(name: "r14c-t11")
      defer { loop.shutdownAndWait() }
      let fired = AtomicCounter()
      let timer = LoopTimer(after: .zero, repeatingEvery: .milliseconds(2)) { _ in fired.increment() }
      loop.add(timer, to: r14cModeC)
      _ = try loop.performAndWait {}
      let inside = r14cWithChangeWaiting(on: loop, pending: { loop.addModeToCommonModes(r14cModeC) }) {
        loop.add(timer, to: .common)
        return r14cAgreementHere(timer, on: loop).modes
      }
      _ = try loop.performAndWait { loop.remove(timer, from: .common) }
      loop.addModeToCommonModes(r14cModeA)
      let afterCommon = r14cAgreement(timer, on: loop)
      r14cRun(loop, mode: r14cModeC, for: .milliseconds(20))
      _ = try loop.performAndWait { loop.remove(timer, from: r14cModeC) }
      let final = r14cAgreement(timer, on: loop)
      timer.invalidate()
      return (inside, afterCommon, fired.current, final)
    }
    guard let outcome else { return }
    #expect(outcome.inside == [.default, r14cModeC].sorted { $0.rawValue < $1.rawValue })
    #expect(outcome.afterCommon == R14CAgreement(modes: [r14cModeC], bound: true, records: 1, registrations: 0))
    #expect(outcome.fired >= 1)
    #expect(outcome.final == R14CAgreement(modes: [], bound: false, records: 0, registrations: 0))
  }
}

@Suite("ReviewRound14Core: loop-thread state-first paths", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound14CoreStateFirstTests {
  /// A custom source added from another thread (its add waiting) is invalidated on the loop
  /// thread, while a removal of another source waits behind the add whose cancel routine adds
  /// the first source to mode B. Promised: an add made before an invalidation is still scheduled
  /// (then cancelled): schedule and cancel pair up; the re-add of the invalidated source is
  /// ignored; the loop holds no record.
  @Test func aLoopThreadInvalidationAfterAWaitingAddAndAReAddingCallout() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "invalidate after waits") {
      () throws -> (inside: R14CAgreement?, log: [String], after: R14CAgreement?) in
      let loop = try RunLoopThread(name: "r14c-s1")
      defer { loop.shutdownAndWait() }
      let log = EventLog()
      let member = r14cLoggedSource("member", log)
      let other = r14cLoggedSource("other", log, cancel: { _, loop in loop.add(member, to: r14cModeB) })
      loop.add(other)
      _ = try loop.performAndWait {}
      let inside = r14cWithChangeWaiting(
        on: loop,
        pending: {
          loop.add(member, to: r14cModeA)
          loop.remove(other)
        }
      ) {
        member.invalidate()
        return r14cAgreementHere(member, on: loop)
      }
      let after = r14cAgreement(member, on: loop)
      return (inside, log.snapshot, after)
    }
    guard let outcome else { return }
    let none = R14CAgreement(modes: [], bound: false, records: 0, registrations: 0)
    #expect(outcome.inside == none)
    #expect(outcome.after == none)
    #expect(
      outcome.log == ["schedule other", "schedule member", "cancel member", "cancel other"], "\(outcome.log)")
  }

  /// A command source in mode A is invalidated on the loop thread while three posts and an add of
  /// it to mode B (sent from another thread) wait; the handler of the first command adds the
  /// source to mode C (on the loop thread). Promised: every accepted command is delivered
  /// exactly once, in order, before `cancel`, which runs once; later posts are refused; the
  /// re-add is ignored; the loop holds no record.
  @Test func aLoopThreadInvalidationOfACommandSourceWithWaitingPostsAndAdd() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "command invalidation") {
      () throws -> (delivered: [Int], log: [String], late: Bool, after: R14CAgreement?) in
      let loop = try RunLoopThread(name: "r14c-s4")
      defer { loop.shutdownAndWait() }
      let log = EventLog()
      let delivered = Guarded<[Int]>([])
      let holder = Guarded<InputSource?>(nil)
      let command = CommandSource<Int>(
        schedule: { _, _, _ in log.add("schedule") }, cancel: { _, _ in log.add("cancel") }
      ) { value in
        delivered.withLock { $0.append(value) }
        if value == 0, let source = holder.snapshot { RunLoopThread.current.add(source, to: r14cModeC) }
      }
      holder.withLock { $0 = command.source }
      loop.add(command.source, to: r14cModeA)
      _ = try loop.performAndWait {}
      _ = r14cWithChangeWaiting(
        on: loop,
        pending: {
          for value in 0..<3 { command.post(value) }
          loop.add(command.source, to: r14cModeB)
        }
      ) { command.source.invalidate() }
      let late = command.post(99)
      let after = r14cAgreement(command.source, on: loop)
      return (delivered.snapshot, log.snapshot, late, after)
    }
    guard let outcome else { return }
    #expect(outcome.delivered == [0, 1, 2])
    #expect(outcome.log == ["schedule", "cancel"], "\(outcome.log)")
    #expect(!outcome.late)
    #expect(outcome.after == R14CAgreement(modes: [], bound: false, records: 0, registrations: 0))
  }

  /// A timer in mode A (far in the future) gets a new fire date (now) on the loop thread while a
  /// removal of another source waits whose cancel routine moves the timer from A to B. Promised:
  /// the timer keeps the new date wherever it is: it is in B only, one record, and fires once when
  /// B runs (never in A).
  @Test func aLoopThreadSetFireDateWhileAWaitingCalloutMovesTheTimer() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "setFireDate with waiting move") {
      () throws -> (inside: R14CAgreement?, firesA: Int, firesB: Int, after: R14CAgreement?) in
      let loop = try RunLoopThread(name: "r14c-s2")
      defer { loop.shutdownAndWait() }
      let fires = AtomicCounter()
      let timer = LoopTimer(after: .seconds(3600)) { _ in fires.increment() }
      loop.add(timer, to: r14cModeA)
      let log = EventLog()
      let other = r14cLoggedSource(
        "other", log,
        cancel: { _, loop in
          loop.remove(timer, from: r14cModeA)
          loop.add(timer, to: r14cModeB)
        })
      loop.add(other)
      _ = try loop.performAndWait {}
      let inside = r14cWithChangeWaiting(on: loop, pending: { loop.remove(other) }) {
        timer.setFireDate(.now)
        return r14cAgreementHere(timer, on: loop)
      }
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: r14cModeA)
      r14cRun(loop, mode: r14cModeA, for: .milliseconds(20))
      let firesA = fires.current
      r14cRun(loop, mode: r14cModeB, for: .milliseconds(20))
      let firesB = fires.current - firesA
      keep.invalidate()
      let after = r14cAgreement(timer, on: loop)
      return (inside, firesA, firesB, after)
    }
    guard let outcome else { return }
    #expect(outcome.inside == R14CAgreement(modes: [r14cModeB], bound: true, records: 1, registrations: 0))
    #expect(outcome.firesA == 0)
    #expect(outcome.firesB == 1)
    #expect(outcome.after == R14CAgreement(modes: [], bound: false, records: 0, registrations: 0))
  }

  /// The same, with the callout moving the timer to another loop: the new date goes with it, and
  /// it fires there once; the first loop holds nothing of it.
  @Test func aLoopThreadSetFireDateWhileAWaitingCalloutMovesTheTimerAway() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "setFireDate with waiting move away") {
      () throws -> (here: R14CAgreement?, there: R14CAgreement?, fires: Int, loops: [String]) in
      let loop = try RunLoopThread(name: "r14c-s3")
      let away = try RunLoopThread(name: "r14c-s3b")
      defer {
        loop.shutdownAndWait()
        away.shutdownAndWait()
      }
      let loops = Guarded<[String]>([])
      let timer = LoopTimer(after: .seconds(3600)) { _ in loops.withLock { $0.append(RunLoopThread.current.name) } }
      loop.add(timer, to: r14cModeA)
      let log = EventLog()
      let other = r14cLoggedSource(
        "other", log,
        cancel: { _, loop in
          loop.remove(timer, from: r14cModeA)
          away.add(timer)
        })
      loop.add(other)
      _ = try loop.performAndWait {}
      _ = r14cWithChangeWaiting(on: loop, pending: { loop.remove(other) }) {
        timer.setFireDate(.now)
      }
      waitUntil("the timer fires on the other loop") { !loops.snapshot.isEmpty }
      let here = r14cAgreement(timer, on: loop)
      let there = r14cAgreement(timer, on: away)
      return (here, there, loops.snapshot.count, loops.snapshot)
    }
    guard let outcome else { return }
    #expect(outcome.here == R14CAgreement(modes: [], bound: false, records: 0, registrations: 0))
    #expect(outcome.there == R14CAgreement(modes: [], bound: false, records: 0, registrations: 0))
    #expect(outcome.loops == ["r14c-s3b"])
  }
}

@Suite("ReviewRound14Core: the shutdown drain", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound14CoreShutdownTests {
  /// A chain of custom sources: the first is on the loop; the cancel routine of each adds the
  /// next to the loop (on the loop thread). The loop shuts down. Promised: "cancel exactly once
  /// per schedule" and "adding anything to a loop that has terminated invalidates it at once":
  /// every source the drain scheduled is cancelled, and none is left valid on the dead loop.
  @Test
  func aChainOfCancelRoutinesAddingSourcesDuringTheDrainIsFullyDetached() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "cancel chain at shutdown") {
      () throws -> (unpaired: [String], log: [String], valid: [Int], bound: [Int]) in
      let loop = try RunLoopThread(name: "r14c-d1")
      let log = EventLog()
      let pairs = PairLog()
      let chain = Guarded<[InputSource]>([])
      let added = Guarded<[Int]>([0])
      let length = 5
      for index in 0..<length {
        let source = r14cLoggedSource(
          "s\(index)", log, pairs: pairs,
          cancel: { _, loop in
            guard index + 1 < length else { return }
            added.withLock { $0.append(index + 1) }
            loop.add(chain.withLock { $0[index + 1] })
          })
        chain.withLock { $0.append(source) }
      }
      loop.add(chain.withLock { $0[0] })
      _ = try loop.performAndWait {}
      loop.shutdownAndWait()
      let sources = chain.snapshot
      let valid = added.snapshot.filter { sources[$0].isValid }
      let bound = sources.indices.filter { sources[$0].isBound(to: loop.shared) }
      for source in sources { source.invalidate() }
      return (pairs.unpaired, log.snapshot, valid, bound)
    }
    guard let outcome else { return }
    #expect(outcome.unpaired == [], "\(outcome.log)")
    #expect(outcome.valid == [], "\(outcome.log)")
    #expect(outcome.bound == [], "\(outcome.log)")
  }
}

extension ReviewRound14CoreShutdownTests {
  /// Two other threads keep sending registration changes (adding a mode to the common set, again
  /// and again: accepted while the loop drains) when the loop is shut down. Promised: the drain
  /// ends even if producers keep sending ("if producers outpace the drain for
  /// `shutdownDrainRounds` rounds the loop terminates anyway"): `shutdownAndWait()` returns while
  /// the flood goes on.
  @Test
  func theDrainEndsDuringAFloodOfChangesFromAnotherThread() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "drain during a flood") {
      () throws -> (returned: Bool, sent: Int) in
      let loop = try RunLoopThread(name: "r14c-d2")
      let stop = Guarded(false)
      let sent = AtomicCounter()
      let flooders = (0..<2).map { _ in
        startThread {
          while !stop.snapshot {
            for _ in 0..<64 { loop.addModeToCommonModes(r14cModeC) }
            sent.increment()
          }
        }
      }
      waitUntil("the flood started") { sent.current > 100 }
      let returned = TestGate()
      startThread(detached: true) {
        loop.shutdownAndWait()
        returned.open()
      }
      let inTime = returned.wait(timeout: .seconds(10 * watchdogScale))
      stop.withLock { $0 = true }
      for flooder in flooders { joinThread(flooder) }
      _ = returned.wait(timeout: .seconds(20))
      return (inTime, sent.current * 64)
    }
    guard let outcome else { return }
    #expect(
      outcome.returned,
      "shutdownAndWait() did not return in 10 s (times the watchdog scale) while \(outcome.sent) changes were sent")
  }
}

/// Two loops and a member moved between them by its own callout.
private final class R14CPingPong: Sendable {
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
    if !member.isBound(to: here.shared) { wrongLoop.increment() }
    fires.withLock { $0.append(here.name) }
  }

  func end() { inCallout.withLock { $0 = false } }
}

extension ReviewRound14CoreActorTests {
  /// A job on the loop (an actor method) runs the loop nested, synchronously, in the default mode
  /// (which runs no jobs, as documented); a task on the global executor then asks the loop for a
  /// modal run in mode B, and calls an actor on the loop. Documented (`runModal`): a modal run
  /// that starts inside one of the loop's jobs is nested in it and, like any run there, runs no
  /// jobs until the job returns: the modal run runs (its timer fires) to its 2 s limit, the calls
  /// wait, and they are served once the job has returned. (Review round 14 expected the calls
  /// served during the modal run: no second job may start while one is on the stack.)
  @Test
  func aModalRunThatStartsInsideARunNestedInAJobRunsNoJobsUntilTheJobReturns() async throws {
    let loop = try RunLoopThread(name: "r14c-m2")
    defer { loop.shutdownAndWait() }
    let holder = R14CActor(loop: loop)
    let callee = R14CActor(loop: loop)
    let started = TestGate()
    let releaseHolder = TestGate()
    let callsDone = TestGate()
    let outcome = try await withWatchdog(timeout: .seconds(30), "modal run inside a nested run") {
      () async throws -> (servedDuringModal: Bool, result: RunLoopRunResult, modalTicks: Int, servedAfter: Bool) in
      let holding = Task { await holder.holdInNestedRun(mode: .default, started: started, release: releaseHolder) }
      _ = await execOnNewThread { started.wait(timeout: .seconds(10)) }
      let modalTicks = AtomicCounter()
      let modal = Task.detached { () async throws -> RunLoopRunResult in
        let watcher = LoopTimer(after: .zero, repeatingEvery: .milliseconds(1)) { _ in
          modalTicks.increment()
          if callsDone.opened { RunLoopThread.current.stop() }
        }
        loop.add(watcher, to: r14cModeB)
        defer { watcher.invalidate() }
        return try await loop.runModal(mode: r14cModeB, for: .seconds(2))
      }
      _ = await execOnNewThread { usleep(50_000) }  // the modal run starts (inside the nested run)
      let calls = Task.detached { () async -> Void in
        for _ in 0..<10 { _ = await callee.call() }
        callsDone.open()
      }
      let served = await execOnNewThread { callsDone.wait(timeout: .seconds(1)) }
      let result = try await modal.value
      releaseHolder.open()
      await holding.value
      let servedAfter = await execOnNewThread { callsDone.wait(timeout: .seconds(10 * watchdogScale)) }
      await calls.value
      return (served, result, modalTicks.current, servedAfter)
    }
    guard let outcome else { return }
    #expect(!outcome.servedDuringModal, "a job ran inside the holder's job")
    #expect(outcome.result == .timedOut)
    #expect(outcome.modalTicks > 0, "the modal run did not run")
    #expect(outcome.servedAfter, "the calls were not served after the holder's job returned")
  }
}

extension ReviewRound14CoreActorTests {
  /// An actor on a loop is in a modal run (`runModal`) when another thread shuts the loop down,
  /// while other tasks keep calling the actor. Promised: the modal run ends (its caller resumes,
  /// on the loop's executor, in the drain or on the fallback), every call returns once, isolated,
  /// and nothing hangs.
  @Test func aModalRunFromAnActorEndsAtShutdownAndEveryCallReturns() async throws {
    for round in 0..<3 {
      let loop = try RunLoopThread(name: "r14c-m3")
      let actor = R14CActor(loop: loop)
      let never = TestGate()
      let outcome = try await withWatchdog(timeout: .seconds(30), "modal run vs shutdown, round \(round)") {
        () async -> (modal: String, returned: Int, misisolated: Int) in
        let modal = Task { () async -> String in
          do { return "\(try await actor.modal(mode: r14cModeA, until: never).result)" } catch { return "\(error)" }
        }
        _ = await actor.call()
        startThread(detached: true) {
          usleep(UInt32(2_000 + 3_000 * round))
          loop.shutdown()
        }
        let returned = await withTaskGroup(of: Int.self) { group in
          for _ in 0..<2 {
            group.addTask {
              var count = 0
              for _ in 0..<400 {
                _ = await actor.call()
                count += 1
              }
              return count
            }
          }
          return await group.reduce(0, +)
        }
        return (await modal.value, returned, await actor.misisolated)
      }
      loop.shutdownAndWait()
      guard let outcome else { return }
      #expect(outcome.returned == 800, "round \(round)")
      #expect(outcome.misisolated == 0, "round \(round)")
      #expect(
        ["stopped", "timedOut"].contains(outcome.modal) || outcome.modal.contains("has shut down"),
        "round \(round): \(outcome.modal)")
    }
  }
}

@Suite("ReviewRound14Core: timers and observers moved by their callouts", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound14CoreMoveTests {
  /// A one-shot timer whose callout moves it to the other loop and sets its fire date to now,
  /// 200 times. Promised: a fire date set in the callout wins over the one-shot ending (it fires
  /// again then), callouts never overlap, each runs on the loop the timer is on; after the last
  /// hop it is invalidated and neither loop holds a record of it.
  @Test func aOneShotTimerHoppingBetweenLoopsFiresOncePerHop() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "one-shot hops") {
      () throws -> (fires: Int, overlaps: Int, wrongLoop: Int, valid: Bool, records: [Int?]) in
      let loopA = try RunLoopThread(name: "r14c-h1a")
      let loopB = try RunLoopThread(name: "r14c-h1b")
      defer {
        loopA.shutdownAndWait()
        loopB.shutdownAndWait()
      }
      let scenario = R14CPingPong([loopA, loopB])
      let hops = 200
      let finished = TestGate()
      let timer = LoopTimer(after: .zero) { timer in
        scenario.begin(timer)
        defer { scenario.end() }
        let count = scenario.fires.withLock { $0.count }
        guard count < hops else {
          finished.open()
          return
        }
        let here = RunLoopThread.current
        here.remove(timer)
        scenario.other.add(timer)
        timer.setFireDate(.now)
      }
      loopA.add(timer)
      _ = finished.wait(timeout: .seconds(20))
      _ = try loopA.performAndWait {}
      _ = try loopB.performAndWait {}
      let records = [loopA, loopB].map { loop in try? loop.performAndWait { loop.core.modeTable.allRecords.count } }
      let valid = timer.isValid
      timer.invalidate()
      return (scenario.fires.snapshot.count, scenario.overlaps.current, scenario.wrongLoop.current, valid, records)
    }
    guard let outcome else { return }
    #expect(outcome.fires == 200)
    #expect(outcome.overlaps == 0)
    #expect(outcome.wrongLoop == 0)
    #expect(!outcome.valid)
    #expect(outcome.records == [0, 0])
  }

  /// A repeating timer (every 0 s: once per pass) whose callout moves it to the other loop each
  /// time, while the other loop finds it due in the middle of the callout (`.busy`). Promised:
  /// callouts never overlap and run only on the loop the timer is on; it keeps firing (the busy
  /// loop re-times it when the callout returns); after its invalidation neither loop holds it.
  @Test func aRepeatingTimerMovedByItsCalloutKeepsFiringWithoutOverlap() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "repeating hops") {
      () throws -> (fires: Int, overlaps: Int, wrongLoop: Int, records: [Int?]) in
      let loopA = try RunLoopThread(name: "r14c-h2a")
      let loopB = try RunLoopThread(name: "r14c-h2b")
      defer {
        loopA.shutdownAndWait()
        loopB.shutdownAndWait()
      }
      let scenario = R14CPingPong([loopA, loopB])
      let timer = LoopTimer(after: .zero, repeatingEvery: .zero) { timer in
        scenario.begin(timer)
        defer { scenario.end() }
        let here = RunLoopThread.current
        here.remove(timer)
        scenario.other.add(timer)
        usleep(50)  // the other loop finds it due meanwhile
      }
      loopA.add(timer)
      waitUntil("300 fires") { scenario.fires.snapshot.count >= 300 }
      timer.invalidate()
      _ = try loopA.performAndWait {}
      _ = try loopB.performAndWait {}
      _ = try loopA.performAndWait {}
      let records = [loopA, loopB].map { loop in try? loop.performAndWait { loop.core.modeTable.allRecords.count } }
      return (scenario.fires.snapshot.count, scenario.overlaps.current, scenario.wrongLoop.current, records)
    }
    guard let outcome else { return }
    #expect(outcome.fires >= 300)
    #expect(outcome.overlaps == 0)
    #expect(outcome.wrongLoop == 0)
    #expect(outcome.records == [0, 0])
  }

  /// A repeating observer of every activity whose callout moves it to the other loop each time.
  /// Promised: it is never told inside its own callout (no overlap), only by the loop it is on,
  /// and after its invalidation neither loop holds it.
  @Test func aRepeatingObserverMovedByItsCalloutNeverOverlaps() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "observer hops") {
      () throws -> (told: Int, overlaps: Int, wrongLoop: Int, records: [Int?]) in
      let loopA = try RunLoopThread(name: "r14c-h3a")
      let loopB = try RunLoopThread(name: "r14c-h3b")
      defer {
        loopA.shutdownAndWait()
        loopB.shutdownAndWait()
      }
      let scenario = R14CPingPong([loopA, loopB])
      let observer = LoopObserver(activities: .all) { observer, _ in
        scenario.begin(observer)
        defer { scenario.end() }
        let here = RunLoopThread.current
        here.remove(observer)
        scenario.other.add(observer)
        usleep(20)
      }
      // Passes on both loops (an activity that comes while the callout runs on the other loop is
      // skipped, as a nested run skips it).
      let tickers = [loopA, loopB].map { loop in
        let ticker = LoopTimer(after: .zero, repeatingEvery: .microseconds(200)) { _ in }
        loop.add(ticker)
        return ticker
      }
      loopA.add(observer)
      waitUntil("300 callouts") { scenario.fires.snapshot.count >= 300 }
      observer.invalidate()
      for ticker in tickers { ticker.invalidate() }
      _ = try loopA.performAndWait {}
      _ = try loopB.performAndWait {}
      let records = [loopA, loopB].map { loop in try? loop.performAndWait { loop.core.modeTable.allRecords.count } }
      return (scenario.fires.snapshot.count, scenario.overlaps.current, scenario.wrongLoop.current, records)
    }
    guard let outcome else { return }
    #expect(outcome.told >= 300)
    #expect(outcome.overlaps == 0)
    #expect(outcome.wrongLoop == 0)
    #expect(outcome.records == [0, 0])
  }

  /// A one-shot observer whose callout removes it and adds it back to another mode of the same
  /// loop, then runs the loop nested in that mode. Promised: told exactly once (a nested run skips
  /// it), invalidated after, and the loop holds no record of it.
  @Test func aOneShotObserverReAddedAndNestedInItsCalloutIsToldOnce() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "one-shot re-add") {
      () throws -> (told: Int, valid: Bool, agreement: R14CAgreement?) in
      let loop = try RunLoopThread(name: "r14c-h4")
      defer { loop.shutdownAndWait() }
      let told = AtomicCounter()
      let observer = LoopObserver(activities: [.entry, .beforeTimers, .exit], repeats: false) { observer, _ in
        told.increment()
        let loop = RunLoopThread.current
        loop.remove(observer, from: r14cModeA)
        loop.add(observer, to: r14cModeB)
        _ = loop.run(mode: r14cModeB, for: .milliseconds(5))
      }
      loop.add(observer, to: r14cModeA)
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: r14cModeA)
      loop.add(keep, to: r14cModeB)
      r14cRun(loop, mode: r14cModeA, for: .milliseconds(10))
      r14cRun(loop, mode: r14cModeB, for: .milliseconds(10))
      keep.invalidate()
      return (told.current, observer.isValid, r14cAgreement(observer, on: loop))
    }
    guard let outcome else { return }
    #expect(outcome.told == 1)
    #expect(!outcome.valid)
    #expect(outcome.agreement == R14CAgreement(modes: [], bound: false, records: 0, registrations: 0))
  }
}

@Suite("ReviewRound14Core: the chunked job queue", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound14CoreJobTests {
  /// A current loop (a thread of the test's own) gets 5,000 jobs; its run is stopped by an early
  /// job (thousands are left and go back to the inbox in chunks), a later job runs the loop nested
  /// (which runs no jobs); then, while its thread is out of a run, another 3,000 jobs race
  /// `shutdown()`. Promised: every job runs exactly once, never two at once, in the order
  /// enqueued: those left by the run and those diverted to the fallback executor alike.
  @Test func leftoverJobsOfACurrentLoopThenShutdownRacingABurstRunOnceInOrder() async throws {
    let thread = R7Thread()
    let loop = await thread.loop()
    let order = Guarded<[Int]>([])
    let depth = AtomicCounter()
    let overlaps = AtomicCounter()
    let nestedRan = AtomicCounter()
    let first = 5_000
    let total = 8_000
    @Sendable func job(_ index: Int) {
      if depth.increment() != 1 { overlaps.increment() }
      order.withLock { $0.append(index) }
      if index == 3 { RunLoopThread.current.stop() }
      if index == 4_000, RunLoopThread.currentIfExists === loop {
        let before = order.snapshot.count
        _ = loop.run(for: .milliseconds(5))
        nestedRan.value.store(order.snapshot.count - before, ordering: .sequentiallyConsistent)
      }
      depth.value.subtract(1, ordering: .sequentiallyConsistent)
    }
    var tasks = (0..<first).map { index in Task(executorPreference: loop) { job(index) } }
    _ = await execOnNewThread {
      waitUntil("the jobs waiting") { loop.shared.inboxLock.withLock { loop.shared.inbox.jobs.count } >= first }
    }
    let firstRun = await thread.exec { loop -> RunLoopRunResult in
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepAlive)
      defer { keepAlive.invalidate() }
      return loop.run(for: .seconds(20))
    }
    let leftAfterFirst = first - order.snapshot.count
    // A second run that is not stopped: runs the rest, with the nested run at job 4,000.
    _ = await thread.exec { loop -> RunLoopRunResult in
      let keepAlive = LoopTimer(after: .milliseconds(200)) { _ in }
      loop.add(keepAlive)
      defer { keepAlive.invalidate() }
      return loop.run(for: .milliseconds(300))
    }
    startThread(detached: true) {
      usleep(300)
      loop.shutdown()
    }
    tasks += (first..<total).map { index in Task(executorPreference: loop) { job(index) } }
    let allTasks = tasks
    let done: Void? = try await withWatchdog(timeout: .seconds(20), "every job") {
      for task in allTasks { await task.value }
    }
    thread.quit()
    #expect(done != nil)
    #expect(firstRun == .stopped)
    #expect(leftAfterFirst > 1_024)
    #expect(nestedRan.current == 0, "a run nested in a job ran \(nestedRan.current) jobs")
    #expect(overlaps.current == 0)
    let snapshot = order.snapshot
    #expect(snapshot.count == total)
    let inOrder = snapshot == Array(0..<total)
    #expect(inOrder, "first out of order at \(zip(snapshot, 0...).first { $0 != $1 }.map { "\($0)" } ?? "-")")
  }
}

/// An actor pinned to a loop: counts calls, and runs the loop modally from one of its methods.
private actor R14CActor: LoopActor {
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

extension ReviewRound14CoreJobTests {
  /// A current loop's thread, out of a run, adds a source while a change from another thread
  /// waits (so the add applies the inbox); 200 jobs wait in its inbox. Then the loop is shut
  /// down and 200 more jobs are enqueued. Promised ("outside a run, every job the loop accepted
  /// is in the inbox"; `shutdown()`: "as soon as its thread is out of a run, the jobs it accepted
  /// and every later one run on the fallback, in order"): all 400 run, in order, without waiting
  /// for the thread to exit.
  @Test
  func jobsTakenByALoopThreadAddOutsideARunStillLeaveAtShutdown() async throws {
    let thread = R7Thread()
    let loop = await thread.loop()
    let order = Guarded<[Int]>([])
    let first = 200
    let total = 400
    func start(_ range: Range<Int>) -> [Task<Void, Never>] {
      range.map { index in Task(executorPreference: loop) { order.withLock { $0.append(index) } } }
    }
    var tasks = start(0..<first)
    _ = await execOnNewThread {
      waitUntil("the jobs waiting") { loop.shared.inboxLock.withLock { loop.shared.inbox.jobs.count } >= first }
    }
    let timer = LoopTimer(after: .seconds(3600)) { _ in }
    loop.add(timer)  // from this thread: a change waits in the inbox
    let source = InputSource(perform: { _ in })
    let inInbox = await thread.exec { loop -> Int in
      loop.add(source)  // on the loop thread, out of a run
      return loop.shared.inboxLock.withLock { loop.shared.inbox.jobs.count }
    }
    loop.shutdown()
    tasks += start(first..<total)
    let ranBeforeExit = await execOnNewThread { () -> [Int] in
      let deadline = ContinuousClock.now.advanced(by: .seconds(3))
      while order.snapshot.count < total && ContinuousClock.now < deadline { usleep(1000) }
      return order.snapshot
    }
    thread.quit()  // its exit drain runs whatever it still holds
    let allTasks = tasks
    let done: Void? = try await withWatchdog(timeout: .seconds(20), "every job") {
      for task in allTasks { await task.value }
    }
    #expect(done != nil)
    #expect(inInbox == first, "out of a run, \(first - inInbox) jobs were held by the thread, not the inbox")
    #expect(ranBeforeExit.count == total, "only \(ranBeforeExit.count) of \(total) jobs ran before the thread exited")
    let snapshot = order.snapshot
    let inOrder = snapshot == Array(0..<total)
    #expect(inOrder, "the jobs ran out of order: the first were \(snapshot.prefix(3))")
  }
}

extension ReviewRound14CoreJobTests {
  /// A current loop's thread runs the loop in short runs again and again (each run's leftover
  /// jobs go back to the inbox) while two threads each enqueue 3,000 jobs (chunks' worth) and a
  /// third shuts the loop down part-way. Promised: every job runs exactly once, never two at
  /// once, each producer's in the order it enqueued them (on the thread or, after the shutdown,
  /// on the fallback).
  @Test func shortRunsRacingABurstAndShutdownKeepEachProducersOrder() async throws {
    for round in 0..<3 {
      let thread = R7Thread()
      let loop = await thread.loop()
      let seen = Guarded<[Int: [Int]]>([:])
      let depth = AtomicCounter()
      let overlaps = AtomicCounter()
      let perProducer = 3_000
      let tasks = Guarded<[Task<Void, Never>]>([])
      let running = Guarded(true)
      thread.send { loop in
        let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
        loop.add(keepAlive)
        while running.snapshot { _ = loop.run(for: .microseconds(300)) }
        keepAlive.invalidate()
      }
      let producers: [@Sendable () -> Void] = (0..<2).map { producer in
        {
          var mine: [Task<Void, Never>] = []
          for index in 0..<perProducer {
            mine.append(
              Task(executorPreference: loop) {
                if depth.increment() != 1 { overlaps.increment() }
                seen.withLock { $0[producer, default: []].append(index) }
                depth.value.subtract(1, ordering: .sequentiallyConsistent)
              })
          }
          tasks.withLock { $0 += mine }
        }
      }
      let shutter: @Sendable () -> Void = {
        usleep(UInt32(500 + 1_500 * round))
        loop.shutdown()
      }
      await execOnNewThread { race(producers + [shutter]) }
      let allTasks = tasks.snapshot
      let done: Void? = try await withWatchdog(timeout: .seconds(20), "every job, round \(round)") {
        for task in allTasks { await task.value }
      }
      running.withLock { $0 = false }
      thread.quit()
      #expect(done != nil)
      #expect(overlaps.current == 0, "round \(round)")
      let snapshot = seen.snapshot
      for producer in 0..<2 {
        let mine = snapshot[producer] ?? []
        #expect(
          mine == Array(0..<perProducer),
          "round \(round), producer \(producer): \(mine.count) jobs, in order \(mine == mine.sorted())")
      }
    }
  }
}

extension ReviewRound14CoreJobTests {
  /// The same start (a current loop's thread, out of a run, adds a source while a change waits;
  /// 100 jobs of one actor wait), then `shutdown()`, 100 more calls of the actor (each job takes
  /// a millisecond), and the thread exits at once. Promised: the loop is one serial executor,
  /// also once its jobs run on the fallback ("still isolated to the loop"): no two jobs of the
  /// actor ever run at once.
  @Test
  func jobsTakenOutsideARunNeverOverlapTheFallbackQueue() async throws {
    let thread = R7Thread()
    let loop = await thread.loop()
    let depth = AtomicCounter()
    let overlaps = AtomicCounter()
    let ran = AtomicCounter()
    let first = 100
    let total = 200
    func start(_ range: Range<Int>) -> [Task<Void, Never>] {
      range.map { _ in
        Task(executorPreference: loop) {
          if depth.increment() != 1 { overlaps.increment() }
          usleep(1_000)
          ran.increment()
          depth.value.subtract(1, ordering: .sequentiallyConsistent)
        }
      }
    }
    var tasks = start(0..<first)
    _ = await execOnNewThread {
      waitUntil("the jobs waiting") { loop.shared.inboxLock.withLock { loop.shared.inbox.jobs.count } >= first }
    }
    let timer = LoopTimer(after: .seconds(3600)) { _ in }
    loop.add(timer)
    let source = InputSource(perform: { _ in })
    _ = await thread.exec { loop in loop.add(source) }
    loop.shutdown()
    tasks += start(first..<total)
    thread.quit()
    let allTasks = tasks
    let done: Void? = try await withWatchdog(timeout: .seconds(20), "every job") {
      for task in allTasks { await task.value }
    }
    #expect(done != nil)
    #expect(ran.current == total)
    #expect(overlaps.current == 0, "\(overlaps.current) jobs of the loop's serial executor started while another ran")
  }
}

@Suite("ReviewRound14Core: modal runs and waits from actors on the loop", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound14CoreActorTests {
  /// An actor on a loop runs the loop modally (`runModal`) from one of its methods, and other
  /// tasks call the actor 2,000 times meanwhile (more than a chunk of jobs). Promised: "the loop
  /// keeps running executor jobs during it, the caller's actor's other work included": the calls
  /// are served during the modal run (which ends when they are done), each once, isolated; a
  /// `performAndWait` from the actor on its own loop runs inline.
  @Test func aModalRunFromAnActorOnTheLoopServesTheActorsOtherCalls() async throws {
    let loop = try RunLoopThread(name: "r14c-m1")
    defer { loop.shutdownAndWait() }
    let actor = R14CActor(loop: loop)
    let callsDone = TestGate()
    let outcome = try await withWatchdog(timeout: .seconds(30), "modal run with calls") {
      () async throws -> (served: Int, result: RunLoopRunResult, returned: Int, nested: Int, misisolated: Int) in
      async let modal = actor.modal(mode: r14cModeA, until: callsDone)
      // Let the modal run start (its first calls are served inside it either way).
      _ = await actor.call()
      let returned = await withTaskGroup(of: Int.self) { group in
        for _ in 0..<4 {
          group.addTask {
            var count = 0
            for _ in 0..<500 {
              _ = await actor.call()
              count += 1
            }
            return count
          }
        }
        return await group.reduce(0, +)
      }
      let nested = try await actor.nestedPerformAndWait()
      callsDone.open()
      let (served, result) = try await modal
      return (served, result, returned, nested, await actor.misisolated)
    }
    guard let outcome else { return }
    #expect(outcome.returned == 2_000)
    #expect(outcome.served >= 2_000)
    #expect(outcome.result == .stopped)
    #expect(outcome.nested == 7)
    #expect(outcome.misisolated == 0)
  }
}
