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
      registrations: loop.core.descriptorsByToken.count)
  }
}

/// The same, read on the loop thread itself (inside a callout or block).
private func r14cAgreementHere(_ member: some LoopMember, on loop: RunLoopThread) -> R14CAgreement {
  R14CAgreement(
    modes: loop.core.modes(of: member).sorted { $0.rawValue < $1.rawValue },
    bound: member.isBound(to: loop.shared),
    records: loop.core.modeTable.allRecords.count,
    registrations: loop.core.descriptorsByToken.count)
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

@Suite("ReviewRound14Core: loop-thread adds after waiting changes", .serialized, .timeLimit(.minutes(2)))
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

  /// Another thread sends registration changes without pause (a timer's new fire date, again and
  /// again) while the loop thread adds a source. The loop stays live meanwhile (a repeating timer
  /// keeps firing: passes apply a bounded number of changes each). Promised: "at once when called
  /// there": the loop-thread add returns while the flood goes on (it comes after the changes sent
  /// before it, and need not wait for those sent after it, let alone for the sender to stop).
  @Test func aLoopThreadAddReturnsDuringAFloodOfChangesFromAnotherThread() async throws {
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
      let inTime = returned.wait(timeout: .seconds(3))
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
    #expect(outcome.returned, "the loop-thread add did not return in 3 s while \(outcome.sent) changes were sent")
    #expect(outcome.modes == [r14cModeA])
  }
}

@Suite("ReviewRound14Core: loop-thread state-first paths", .serialized, .timeLimit(.minutes(2)))
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

@Suite("ReviewRound14Core: the shutdown drain", .serialized, .timeLimit(.minutes(2)))
struct ReviewRound14CoreShutdownTests {
  /// A chain of custom sources: the first is on the loop; the cancel routine of each adds the
  /// next to the loop (on the loop thread). The loop shuts down. Promised: "cancel exactly once
  /// per schedule" and "adding anything to a loop that has terminated invalidates it at once":
  /// every source the drain scheduled is cancelled, and none is left valid on the dead loop.
  @Test func aChainOfCancelRoutinesAddingSourcesDuringTheDrainIsFullyDetached() async throws {
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
