import Glibc
import Testing

@testable import AsyncRunLoop

@Suite(
  "Changes made on the loop thread take the fast path only when nothing waits", .serialized, .timeLimit(.minutes(10)))
struct LoopThreadFastPathTests {
  /// A block on the loop waits while another thread sends a change (add to a mode, or a removal),
  /// then signals it; the block then makes the opposite change on the loop thread, sometimes from
  /// a nested run. Promised: the loop-thread call comes after every change sent before it, so the
  /// routines pair up in order and each source ends as the block left it.
  @Test func aLoopThreadChangeAfterACrossThreadOneWithHappensBeforeComesAfterIt() async throws {
    let loop = try RunLoopThread(name: "fast")
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "fast path order") {
      () -> (wrong: [String], rounds: Int) in
      defer { loop.shutdownAndWait() }
      let wrong = Locked<[String]>([])
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: movedModeA)
      let rounds = repeatRounds(300, budget: .milliseconds(600)) { round in
        let log = EventLog()
        let source = InputSource(
          schedule: { _, _, mode in log.add("schedule \(mode)") }, cancel: { _, _ in log.add("cancel") }
        ) { _ in }
        let sent = TestGate()
        let done = TestGate()
        let addsFirst = round % 2 == 0
        if !addsFirst { loop.add(source, to: movedModeA) }
        loop.perform {
          _ = sent.wait(timeout: .seconds(10))
          let change: @Sendable () -> Void = {
            if addsFirst {
              loop.remove(source, from: movedModeA)  // after the add sent from the other thread
            } else {
              loop.add(source, to: movedModeA)  // after the removal sent from the other thread
            }
          }
          if round % 3 == 0 {
            loop.perform(inModes: [movedModeA]) { change() }
            _ = loop.run(mode: movedModeA, until: .now.advanced(by: .milliseconds(1)))
          } else {
            change()
          }
          done.open()
        }
        if addsFirst { loop.add(source, to: movedModeA) } else { loop.remove(source, from: movedModeA) }
        sent.open()
        _ = done.wait(timeout: .seconds(10))
        _ = try? loop.performAndWait {}
        let expected =
          addsFirst
          ? ["schedule \(movedModeA)", "cancel"] : ["schedule \(movedModeA)", "cancel", "schedule \(movedModeA)"]
        let bound = source.isBound(to: loop.shared)
        if log.snapshot != expected || bound != !addsFirst {
          wrong.withLock { $0.append("round \(round): \(log.snapshot), bound \(bound)") }
        }
        source.invalidate()
      }
      keep.invalidate()
      return (wrong.withLock { $0 }, rounds)
    }
    guard let outcome else { return }
    #expect(outcome.wrong == [])
    print("fast path order: \(outcome.rounds) rounds")
  }
}

@Suite("Loop-thread adds and removals wait for the changes sent before them", .serialized, .timeLimit(.minutes(10)))
struct LoopThreadChangesAfterWaitingChangesTests {
  /// A loop-thread `add(source, to: B)` of a source already in mode A, made while a removal of
  /// another source sent from another thread waits; that source's cancel routine (run when the
  /// loop applies the waiting removal, before the add: it was sent first) removes the first
  /// source from A, its last mode. In that order (removed from A, then added to B) the source's
  /// stay ends (cancel) and a new one begins in B (schedule), where a signal fires it; the loop
  /// and the binding agree. Binding first and applying the waiting change after left the loop
  /// holding nothing while the binding said "in B".
  @Test
  func aLoopThreadAddSurvivesARemovalMadeByAWaitingChangesCallout() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "add after waiting change") {
      () throws -> (inside: [RunLoopMode], after: [RunLoopMode]?, fires: Int, log: [String]) in
      let loop = try RunLoopThread(name: "fp1")
      defer { loop.shutdownAndWait() }
      let log = EventLog()
      let fires = AtomicCounter()
      let member = InputSource(
        schedule: { _, _, _ in log.add("schedule") }, cancel: { _, _ in log.add("cancel") },
        perform: { _ in fires.increment() })
      loop.add(member, to: inboxModeA)
      let other = InputSource(cancel: { _, loop in loop.remove(member, from: inboxModeA) }, perform: { _ in })
      loop.add(other)
      _ = try loop.performAndWait {}
      let inside =
        withChangeWaiting(on: loop, pending: { loop.remove(other) }) { () -> [RunLoopMode] in
          loop.add(member, to: inboxModeB)
          return loop.core.modes(of: member)
        } ?? []
      member.signal()
      let done = TestGate()
      loop.perform {
        _ = loop.run(mode: inboxModeB, until: .now.advanced(by: .milliseconds(50)))
        done.open()
      }
      _ = done.wait(timeout: .seconds(10))
      let after = loopModes(member, on: loop)
      let snapshot = log.snapshot
      member.invalidate()
      return (inside, after, fires.current, snapshot)
    }
    guard let outcome else { return }
    #expect(outcome.inside == [inboxModeB], "the add's own call left the source in \(outcome.inside)")
    #expect(outcome.after == [inboxModeB], "afterwards the source is in \(String(describing: outcome.after))")
    #expect(outcome.fires == 1, "a signal in mode B fired it \(outcome.fires) times")
    #expect(outcome.log == ["schedule", "cancel", "schedule"], "\(outcome.log)")
  }

  /// A loop-thread `add(source, to: B)` of a source on no loop, made while a removal sent from
  /// another thread waits; that removal's cancel routine removes the first source from B. The
  /// removal came first, so the cancel routine's `remove` finds the source on no loop (a no-op)
  /// and the add then schedules it in B: the loop holds its record, and the binding agrees.
  /// Binding first let the `remove` undo a binding whose add the loop then applied anyway: a
  /// record held, and a source scheduled, on a loop its binding said it was not on.
  @Test
  func aLoopThreadAddUndoneByAWaitingChangesCalloutLeavesNothingBehind() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "add undone by waiting change") {
      () throws -> (records: Int?, log: [String], bound: Bool, modes: [RunLoopMode]?, after: Int?) in
      let loop = try RunLoopThread(name: "fp2")
      defer { loop.shutdownAndWait() }
      let log = EventLog()
      let member = InputSource(
        schedule: { _, loop, _ in log.add("schedule \(loop.name)") },
        cancel: { _, loop in log.add("cancel \(loop.name)") }, perform: { _ in })
      let other = InputSource(cancel: { _, loop in loop.remove(member, from: inboxModeB) }, perform: { _ in })
      loop.add(other)
      _ = try loop.performAndWait {}
      _ = withChangeWaiting(on: loop, pending: { loop.remove(other) }) {
        loop.add(member, to: inboxModeB)
      }
      _ = try loop.performAndWait {}
      let records = recordCount(loop)
      let bound = member.isBound(to: loop.shared)
      let modes = loopModes(member, on: loop)
      member.invalidate()
      let after = recordCount(loop)
      return (records, log.snapshot, bound, modes, after)
    }
    guard let outcome else { return }
    #expect(outcome.records == 1, "the loop holds \(String(describing: outcome.records)) records")
    #expect(outcome.bound)
    #expect(outcome.modes == [inboxModeB])
    #expect(outcome.after == 0, "after the invalidation the loop holds \(String(describing: outcome.after))")
    #expect(outcome.log == ["schedule fp2", "cancel fp2"], "\(outcome.log)")
  }
}

extension LoopThreadChangesAfterWaitingChangesTests {
  /// The same with a readiness source: the waiting change's cancel routine removes it while it is
  /// on no loop (a no-op), then the loop-thread `add` registers it; its handler hears the pipe,
  /// and its invalidation deregisters it. Binding first left it registered while its binding said
  /// it was on no loop: its handler never ran, and a readable descriptor ended every wait at once
  /// (the loop spun).
  @Test
  func aLoopThreadAddOfADescriptorUndoneByAWaitingChangesCalloutDeregistersIt() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "descriptor add undone") {
      () throws -> (registrations: Int?, handled: Int, after: Int?) in
      let loop = try RunLoopThread(name: "fp3")
      defer { loop.shutdownAndWait() }
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let handled = AtomicCounter()
      let member = DescriptorSource(descriptor: pipe.read) { _, _ in
        handled.increment()
        _ = drainDescriptor(pipe.read)
      }
      let other = InputSource(cancel: { _, loop in loop.remove(member, from: .default) }, perform: { _ in })
      loop.add(other)
      _ = try loop.performAndWait {}
      _ = withChangeWaiting(on: loop, pending: { loop.remove(other) }) {
        try? loop.add(member, to: .default)
      }
      let registrations = try? loop.performAndWait { loop.core.descriptors.count }
      writeByte(pipe.write)
      waitUntil("the handler hears the pipe") { handled.current >= 1 }
      member.invalidate()
      let after = try? loop.performAndWait { loop.core.descriptors.count }
      return (registrations, handled.current, after)
    }
    guard let outcome else { return }
    #expect(outcome.registrations == 1, "the loop holds \(String(describing: outcome.registrations)) registrations")
    #expect(outcome.handled >= 1)
    #expect(outcome.after == 0, "after the invalidation: \(String(describing: outcome.after)) registrations")
  }
}

@Suite("Loop-thread adds after waiting changes keep the order", .serialized, .timeLimit(.minutes(10)))
struct LoopThreadAddsAfterWaitingChangesTests {
  /// A timer in mode A is added on the loop thread to mode B while a removal of another source
  /// waits; that source's cancel routine (applied first) removes the timer from A, its last mode.
  /// Promised: the calls apply in order (removed from A, then added to B): the timer is in B only,
  /// the loop holds one record for it, and it fires once when mode B runs.
  @Test func aLoopThreadTimerAddAfterAWaitingCalloutRemovedIt() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "timer add after callout") {
      () throws -> (inside: BindingAgreement?, after: BindingAgreement?, fires: Int) in
      let loop = try RunLoopThread(name: "t1")
      defer { loop.shutdownAndWait() }
      let fires = AtomicCounter()
      let timer = LoopTimer(after: .zero) { _ in fires.increment() }
      let log = EventLog()
      loop.add(timer, to: loopThreadModeA)
      let other = loggedSource("other", log, cancel: { _, loop in loop.remove(timer, from: loopThreadModeA) })
      loop.add(other)
      _ = try loop.performAndWait {}
      let inside = withChangeWaiting(on: loop, pending: { loop.remove(other) }) {
        loop.add(timer, to: loopThreadModeB)
        return bindingAgreementHere(timer, on: loop)
      }
      runOnLoopAndWait(loop, mode: loopThreadModeB, for: .milliseconds(30))
      let after = bindingAgreement(timer, on: loop)
      timer.invalidate()
      return (inside, after, fires.current)
    }
    guard let outcome else { return }
    let expected = BindingAgreement(modes: [loopThreadModeB], bound: true, records: 1, registrations: 0)
    #expect(outcome.inside == expected)
    #expect(outcome.fires == 1)
    #expect(outcome.after == BindingAgreement(modes: [], bound: false, records: 0, registrations: 0))
  }

  /// An observer in mode A is added on the loop thread to mode B while a removal of another
  /// source waits, whose cancel routine invalidates the observer. Promised: the invalidation
  /// comes first, so the add is ignored: the observer is on no loop, the loop holds no record of
  /// it, and it is never told.
  @Test func aLoopThreadObserverAddAfterAWaitingCalloutInvalidatedIt() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "observer add after invalidation") {
      () throws -> (inside: BindingAgreement?, told: Int, valid: Bool) in
      let loop = try RunLoopThread(name: "t2")
      defer { loop.shutdownAndWait() }
      let told = AtomicCounter()
      let observer = LoopObserver(activities: .entry) { _, _ in told.increment() }
      loop.add(observer, to: loopThreadModeA)
      let log = EventLog()
      let other = loggedSource("other", log, cancel: { _, _ in observer.invalidate() })
      loop.add(other)
      _ = try loop.performAndWait {}
      let inside = withChangeWaiting(on: loop, pending: { loop.remove(other) }) {
        loop.add(observer, to: loopThreadModeB)
        return bindingAgreementHere(observer, on: loop)
      }
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: loopThreadModeB)
      runOnLoopAndWait(loop, mode: loopThreadModeB, for: .milliseconds(20))
      keep.invalidate()
      return (inside, told.current, observer.isValid)
    }
    guard let outcome else { return }
    #expect(outcome.inside == BindingAgreement(modes: [], bound: false, records: 0, registrations: 0))
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
      () throws -> (inside: BindingAgreement?, log: [String], delivered: [Int], after: BindingAgreement?) in
      let loop = try RunLoopThread(name: "t3")
      defer { loop.shutdownAndWait() }
      let log = EventLog()
      let member = loggedSource("member", log)
      loop.add(member, to: loopThreadModeA)
      let delivered = Guarded<[Int]>([])
      let command = CommandSource<Int>(cancel: { _, _ in log.add("cancel command") }) { value in
        delivered.withLock { $0.append(value) }
        if value == 1 {
          let loop = RunLoopThread.current
          loop.remove(member, from: loopThreadModeA)
          _ = loop.run(mode: loopThreadModeC, for: .milliseconds(5))
        }
      }
      loop.add(command.source)
      _ = try loop.performAndWait {}
      let inside = withChangeWaiting(
        on: loop,
        pending: {
          for value in 0..<3 { command.post(value) }
          command.source.invalidate()
        }
      ) {
        loop.add(member, to: loopThreadModeB)
        return bindingAgreementHere(member, on: loop)
      }
      let after = bindingAgreement(member, on: loop)
      member.invalidate()
      _ = try loop.performAndWait {}
      return (inside, log.snapshot, delivered.snapshot, after)
    }
    guard let outcome else { return }
    let expected = BindingAgreement(modes: [loopThreadModeB], bound: true, records: 1, registrations: 0)
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
      () throws -> (inside: BindingAgreement?, after: BindingAgreement?, handled: Int) in
      let loop = try RunLoopThread(name: "t4")
      defer { loop.shutdownAndWait() }
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let handled = AtomicCounter()
      let member = DescriptorSource(descriptor: pipe.read) { _, _ in handled.increment() }
      try loop.add(member, to: loopThreadModeA)
      let log = EventLog()
      let other = loggedSource("other", log, cancel: { _, loop in loop.remove(member, from: loopThreadModeB) })
      loop.add(other)
      _ = try loop.performAndWait {}
      let inside = withChangeWaiting(
        on: loop,
        pending: {
          try? loop.add(member, to: loopThreadModeB)
          loop.remove(other)
        }
      ) {
        loop.remove(member, from: loopThreadModeA)
        return bindingAgreementHere(member, on: loop)
      }
      writeByte(pipe.write)
      runOnLoopAndWait(loop, mode: loopThreadModeA, for: .milliseconds(20))
      runOnLoopAndWait(loop, mode: loopThreadModeB, for: .milliseconds(20))
      let after = bindingAgreement(member, on: loop)
      member.invalidate()
      return (inside, after, handled.current)
    }
    guard let outcome else { return }
    let none = BindingAgreement(modes: [], bound: false, records: 0, registrations: 0)
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
      () throws -> (inside: BindingAgreement?, later: BindingAgreement?, log: [String]) in
      let loop = try RunLoopThread(name: "t5")
      defer { loop.shutdownAndWait() }
      let log = EventLog()
      let member = loggedSource("member", log)
      let other = loggedSource("other", log, cancel: { _, loop in loop.addModeToCommonModes(loopThreadModeB) })
      loop.add(other)
      _ = try loop.performAndWait {}
      let inside = withChangeWaiting(
        on: loop,
        pending: {
          loop.addModeToCommonModes(loopThreadModeC)
          loop.remove(other)
        }
      ) {
        loop.add(member, to: .common)
        return bindingAgreementHere(member, on: loop)
      }
      loop.addModeToCommonModes(loopThreadModeA)
      let later = bindingAgreement(member, on: loop)
      member.invalidate()
      _ = try loop.performAndWait {}
      return (inside, later, log.snapshot)
    }
    guard let outcome else { return }
    #expect(outcome.inside?.modes == [.default, loopThreadModeB, loopThreadModeC].sorted { $0.rawValue < $1.rawValue })
    #expect(outcome.inside?.records == 1)
    #expect(
      outcome.later?.modes
        == [.default, loopThreadModeA, loopThreadModeB, loopThreadModeC].sorted { $0.rawValue < $1.rawValue })
    #expect(outcome.log == ["schedule other", "cancel other", "schedule member", "cancel member"], "\(outcome.log)")
  }

  /// A readiness source on descriptor N is invalidated from another thread while the loop is
  /// busy; then, on the loop thread, a second readiness source on N is added. Promised: the
  /// invalidation was made first, so it is applied first: the second source registers (no
  /// `EEXIST`), hears the pipe, and the loop holds exactly its registration.
  @Test func aLoopThreadDescriptorAddAfterAWaitingInvalidationOfTheSameNumber() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "descriptor add after invalidation") {
      () throws -> (added: Bool, inside: BindingAgreement?, heardFirst: Int, heardSecond: Int, after: BindingAgreement?)
      in
      let loop = try RunLoopThread(name: "t8")
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
      let inside = withChangeWaiting(on: loop, pending: { first.invalidate() }) { () -> (Bool, BindingAgreement) in
        let added = (try? loop.add(second)) != nil
        return (added, bindingAgreementHere(second, on: loop))
      }
      writeByte(pipe.write)
      waitUntil("the second source hears the pipe") { heardSecond.current >= 1 }
      second.invalidate()
      let after = bindingAgreement(second, on: loop)
      return (inside?.0 ?? false, inside?.1, heardFirst.current, heardSecond.current, after)
    }
    guard let outcome else { return }
    #expect(outcome.added)
    #expect(outcome.inside == BindingAgreement(modes: [.default], bound: true, records: 1, registrations: 1))
    #expect(outcome.heardFirst == 0)
    #expect(outcome.heardSecond >= 1)
    #expect(outcome.after == BindingAgreement(modes: [], bound: false, records: 0, registrations: 0))
  }

  /// A source in `.common` (the common set is default and B) is removed on the loop thread from
  /// `.default` by name, then mode C joins the common set by a change from another thread that
  /// waits while the loop thread removes the source from `.common`. Promised: removing
  /// `.default` by name takes it out of that mode only; a mode that joins the common set later
  /// still receives it; removing `.common` then takes it off the loop (cancel once, no record).
  @Test func commonModeRemovalsByNameAndACommonModeJoiningWhileARemovalWaits() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "common removals") {
      () throws -> (afterDefault: BindingAgreement?, inside: BindingAgreement?, log: [String]) in
      let loop = try RunLoopThread(name: "t7")
      defer { loop.shutdownAndWait() }
      let log = EventLog()
      let member = loggedSource("member", log)
      loop.addModeToCommonModes(loopThreadModeB)
      loop.add(member, to: .common)
      _ = try loop.performAndWait { loop.remove(member, from: .default) }
      let afterDefault = bindingAgreement(member, on: loop)
      let inside = withChangeWaiting(on: loop, pending: { loop.addModeToCommonModes(loopThreadModeC) }) {
        let before = bindingAgreementHere(member, on: loop)
        loop.remove(member, from: .common)
        return before.modes == [loopThreadModeB] ? bindingAgreementHere(member, on: loop) : before
      }
      return (afterDefault, inside, log.snapshot)
    }
    guard let outcome else { return }
    #expect(outcome.afterDefault?.modes == [loopThreadModeB])
    #expect(outcome.afterDefault?.bound == true)
    #expect(outcome.inside == BindingAgreement(modes: [], bound: false, records: 0, registrations: 0))
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
      let loop = try RunLoopThread(name: "t6")
      defer { loop.shutdownAndWait() }
      let busy = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(busy, to: loopThreadModeC)
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
        loop.add(member, to: loopThreadModeA)
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
    #expect(outcome.modes == [loopThreadModeA])
  }
}

extension LoopThreadAddsAfterWaitingChangesTests {
  /// Another thread sends a change every 100 microseconds (slower than the loop applies them)
  /// while the loop thread adds and removes 2,000 sources in one block. Promised: each call comes
  /// after the changes sent before it and returns: the retry of `afterWaitingChanges` (again
  /// while a change arrived meanwhile) does not livelock under a steady trickle; at the end the
  /// loop holds exactly the timer's record.
  @Test func loopThreadAddsAndRemovesFinishUnderASteadyTrickleOfChanges() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "adds under a trickle") {
      () throws -> (finished: Bool, records: Int?, sent: Int) in
      let loop = try RunLoopThread(name: "t9")
      defer { loop.shutdownAndWait() }
      let busy = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(busy, to: loopThreadModeC)
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
          loop.add(source, to: loopThreadModeA)
          loop.remove(source, from: loopThreadModeA)
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

extension LoopThreadAddsAfterWaitingChangesTests {
  /// A loop-thread `add(member, to: B)` while a removal of another source waits; that source's
  /// cancel routine runs the loop nested in mode C, during which another thread adds the member
  /// to C and then removes it from C again, and the nested run applies both. Promised: each call
  /// comes after the changes sent before it, so the member ends in B only, scheduled once, the
  /// loop holding one record for it; the nested run heard nothing of it.
  @Test func aLoopThreadAddAfterANestedRunThatAppliedOtherThreadsChanges() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "add after nested run") {
      () throws -> (inside: BindingAgreement?, nestedSaw: [RunLoopMode], log: [String]) in
      let loop = try RunLoopThread(name: "t10")
      defer { loop.shutdownAndWait() }
      let log = EventLog()
      let member = loggedSource("member", log)
      let inNested = TestGate()
      let sent = TestGate()
      let nestedSaw = Guarded<[RunLoopMode]>([])
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: loopThreadModeC)
      let other = loggedSource(
        "other", log,
        cancel: { _, loop in
          let watcher = LoopTimer(after: .zero, repeatingEvery: .milliseconds(1)) { _ in
            inNested.open()
            if sent.opened {
              nestedSaw.withLock { $0 = loop.core.modes(of: member) }
              RunLoopThread.current.stop()
            }
          }
          loop.add(watcher, to: loopThreadModeC)
          _ = loop.run(mode: loopThreadModeC, for: .seconds(5))
          watcher.invalidate()
        })
      loop.add(other)
      _ = try loop.performAndWait {}
      startThread(detached: true) {
        _ = inNested.wait(timeout: .seconds(10))
        loop.add(member, to: loopThreadModeC)
        loop.remove(member, from: loopThreadModeC)
        loop.wakeUp()
        usleep(5_000)
        sent.open()
      }
      let inside = withChangeWaiting(on: loop, pending: { loop.remove(other) }) {
        loop.add(member, to: loopThreadModeB)
        return bindingAgreementHere(member, on: loop)
      }
      member.invalidate()
      keep.invalidate()
      _ = try loop.performAndWait {}
      return (inside, nestedSaw.snapshot, log.snapshot)
    }
    guard let outcome else { return }
    #expect(outcome.inside == BindingAgreement(modes: [loopThreadModeB], bound: true, records: 2, registrations: 0))
    #expect(outcome.nestedSaw == [])
    #expect(
      outcome.log == [
        "schedule other", "cancel other", "schedule member", "cancel member", "schedule member", "cancel member",
      ], "\(outcome.log)")
  }
}

extension LoopThreadAddsAfterWaitingChangesTests {
  /// A timer added to mode C by name, then to `.common` on the loop thread while a change that
  /// puts C into the common set waits (so C holds it by name and through `.common`). Promised:
  /// removing `.common` undoes only the add to `.common` (it stays in C, by name, and fires
  /// there); a mode that joins the common set afterwards does not receive it; removing C then
  /// takes it off the loop.
  @Test func aModeHeldByNameAndThroughCommonKeepsTheMemberAfterRemovingCommon() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "by name and common") {
      () throws -> (inside: [RunLoopMode]?, afterCommon: BindingAgreement?, fired: Int, final: BindingAgreement?) in
      let loop = try RunLoopThread(name: "t11")
      defer { loop.shutdownAndWait() }
      let fired = AtomicCounter()
      let timer = LoopTimer(after: .zero, repeatingEvery: .milliseconds(2)) { _ in fired.increment() }
      loop.add(timer, to: loopThreadModeC)
      _ = try loop.performAndWait {}
      let inside = withChangeWaiting(on: loop, pending: { loop.addModeToCommonModes(loopThreadModeC) }) {
        loop.add(timer, to: .common)
        return bindingAgreementHere(timer, on: loop).modes
      }
      _ = try loop.performAndWait { loop.remove(timer, from: .common) }
      loop.addModeToCommonModes(loopThreadModeA)
      let afterCommon = bindingAgreement(timer, on: loop)
      runOnLoopAndWait(loop, mode: loopThreadModeC, for: .milliseconds(20))
      _ = try loop.performAndWait { loop.remove(timer, from: loopThreadModeC) }
      let final = bindingAgreement(timer, on: loop)
      timer.invalidate()
      return (inside, afterCommon, fired.current, final)
    }
    guard let outcome else { return }
    #expect(outcome.inside == [.default, loopThreadModeC].sorted { $0.rawValue < $1.rawValue })
    #expect(
      outcome.afterCommon == BindingAgreement(modes: [loopThreadModeC], bound: true, records: 1, registrations: 0))
    #expect(outcome.fired >= 1)
    #expect(outcome.final == BindingAgreement(modes: [], bound: false, records: 0, registrations: 0))
  }
}
