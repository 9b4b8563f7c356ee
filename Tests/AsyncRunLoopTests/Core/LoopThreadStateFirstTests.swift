import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("Loop-thread paths change the state before calling out", .serialized, .timeLimit(.minutes(10)))
struct LoopThreadStateFirstTests {
  /// A custom source added from another thread (its add waiting) is invalidated on the loop
  /// thread, while a removal of another source waits behind the add whose cancel routine adds
  /// the first source to mode B. Promised: an add made before an invalidation is still scheduled
  /// (then cancelled): schedule and cancel pair up; the re-add of the invalidated source is
  /// ignored; the loop holds no record.
  @Test func aLoopThreadInvalidationAfterAWaitingAddAndAReAddingCallout() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "invalidate after waits") {
      () throws -> (inside: BindingAgreement?, log: [String], after: BindingAgreement?) in
      let loop = try RunLoopThread(name: "s1")
      defer { loop.shutdownAndWait() }
      let log = EventLog()
      let member = loggedSource("member", log)
      let other = loggedSource("other", log, cancel: { _, loop in loop.add(member, to: loopThreadModeB) })
      loop.add(other)
      _ = try loop.performAndWait {}
      let inside = withChangeWaiting(
        on: loop,
        pending: {
          loop.add(member, to: loopThreadModeA)
          loop.remove(other)
        }
      ) {
        member.invalidate()
        return bindingAgreementHere(member, on: loop)
      }
      let after = bindingAgreement(member, on: loop)
      return (inside, log.snapshot, after)
    }
    guard let outcome else { return }
    let none = BindingAgreement(modes: [], bound: false, records: 0, registrations: 0)
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
      () throws -> (delivered: [Int], log: [String], late: Bool, after: BindingAgreement?) in
      let loop = try RunLoopThread(name: "s4")
      defer { loop.shutdownAndWait() }
      let log = EventLog()
      let delivered = Guarded<[Int]>([])
      let holder = Guarded<InputSource?>(nil)
      let command = CommandSource<Int>(
        schedule: { _, _, _ in log.add("schedule") }, cancel: { _, _ in log.add("cancel") }
      ) { value in
        delivered.withLock { $0.append(value) }
        if value == 0, let source = holder.snapshot { RunLoopThread.current.add(source, to: loopThreadModeC) }
      }
      holder.withLock { $0 = command.source }
      loop.add(command.source, to: loopThreadModeA)
      _ = try loop.performAndWait {}
      _ = withChangeWaiting(
        on: loop,
        pending: {
          for value in 0..<3 { command.post(value) }
          loop.add(command.source, to: loopThreadModeB)
        }
      ) { command.source.invalidate() }
      let late = command.post(99)
      let after = bindingAgreement(command.source, on: loop)
      return (delivered.snapshot, log.snapshot, late, after)
    }
    guard let outcome else { return }
    #expect(outcome.delivered == [0, 1, 2])
    #expect(outcome.log == ["schedule", "cancel"], "\(outcome.log)")
    #expect(!outcome.late)
    #expect(outcome.after == BindingAgreement(modes: [], bound: false, records: 0, registrations: 0))
  }

  /// A timer in mode A (far in the future) gets a new fire date (now) on the loop thread while a
  /// removal of another source waits whose cancel routine moves the timer from A to B. Promised:
  /// the timer keeps the new date wherever it is: it is in B only, one record, and fires once when
  /// B runs (never in A).
  @Test func aLoopThreadSetFireDateWhileAWaitingCalloutMovesTheTimer() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "setFireDate with waiting move") {
      () throws -> (inside: BindingAgreement?, firesA: Int, firesB: Int, after: BindingAgreement?) in
      let loop = try RunLoopThread(name: "s2")
      defer { loop.shutdownAndWait() }
      let fires = AtomicCounter()
      let timer = LoopTimer(after: .seconds(3600)) { _ in fires.increment() }
      loop.add(timer, to: loopThreadModeA)
      let log = EventLog()
      let other = loggedSource(
        "other", log,
        cancel: { _, loop in
          loop.remove(timer, from: loopThreadModeA)
          loop.add(timer, to: loopThreadModeB)
        })
      loop.add(other)
      _ = try loop.performAndWait {}
      let inside = withChangeWaiting(on: loop, pending: { loop.remove(other) }) {
        timer.setFireDate(.now)
        return bindingAgreementHere(timer, on: loop)
      }
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: loopThreadModeA)
      runOnLoopAndWait(loop, mode: loopThreadModeA, for: .milliseconds(20))
      let firesA = fires.current
      runOnLoopAndWait(loop, mode: loopThreadModeB, for: .milliseconds(20))
      let firesB = fires.current - firesA
      keep.invalidate()
      let after = bindingAgreement(timer, on: loop)
      return (inside, firesA, firesB, after)
    }
    guard let outcome else { return }
    #expect(outcome.inside == BindingAgreement(modes: [loopThreadModeB], bound: true, records: 1, registrations: 0))
    #expect(outcome.firesA == 0)
    #expect(outcome.firesB == 1)
    #expect(outcome.after == BindingAgreement(modes: [], bound: false, records: 0, registrations: 0))
  }

  /// The same, with the callout moving the timer to another loop: the new date goes with it, and
  /// it fires there once; the first loop holds nothing of it.
  @Test func aLoopThreadSetFireDateWhileAWaitingCalloutMovesTheTimerAway() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "setFireDate with waiting move away") {
      () throws -> (here: BindingAgreement?, there: BindingAgreement?, fires: Int, loops: [String]) in
      let loop = try RunLoopThread(name: "s3")
      let away = try RunLoopThread(name: "s3b")
      defer {
        loop.shutdownAndWait()
        away.shutdownAndWait()
      }
      let loops = Guarded<[String]>([])
      let timer = LoopTimer(after: .seconds(3600)) { _ in loops.withLock { $0.append(RunLoopThread.current.name) } }
      loop.add(timer, to: loopThreadModeA)
      let log = EventLog()
      let other = loggedSource(
        "other", log,
        cancel: { _, loop in
          loop.remove(timer, from: loopThreadModeA)
          away.add(timer)
        })
      loop.add(other)
      _ = try loop.performAndWait {}
      _ = withChangeWaiting(on: loop, pending: { loop.remove(other) }) {
        timer.setFireDate(.now)
      }
      waitUntil("the timer fires on the other loop") { !loops.snapshot.isEmpty }
      let here = bindingAgreement(timer, on: loop)
      let there = bindingAgreement(timer, on: away)
      return (here, there, loops.snapshot.count, loops.snapshot)
    }
    guard let outcome else { return }
    #expect(outcome.here == BindingAgreement(modes: [], bound: false, records: 0, registrations: 0))
    #expect(outcome.there == BindingAgreement(modes: [], bound: false, records: 0, registrations: 0))
    #expect(outcome.loops == ["s3b"])
  }
}
