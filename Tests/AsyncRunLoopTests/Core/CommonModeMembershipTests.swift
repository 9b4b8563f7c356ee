import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

/// Members in the common modes follow the common set, and names count once.
@Suite("Members in the common modes follow the common set, and names count once", .serialized, .timeLimit(.minutes(10)))
struct CommonModeMembershipTests: MemberPromiseSettling, SharedTestLoops, PassTestModes {
  /// The binding and the loop agree on when a member has left its loop, through `.common` too:
  /// removing `.default` by name from a member added to `.common` leaves it on the loop (no
  /// cancel; a mode joining the common set later still receives it), removing `.common` from a
  /// member added to `.default` by name leaves it in `.default`, and only removing the last name
  /// ends it there (cancel once) and lets it move.
  @Test(arguments: [true, false])
  func aMemberLeavesItsLoopWhenItsLastModeNameIsRemovedCommonIncluded(addedToCommon: Bool) throws {
    let loopA = try RunLoopThread(name: "common-a")
    let loopB = try RunLoopThread(name: "common-b")
    defer {
      loopA.shutdownAndWait()
      loopB.shutdownAndWait()
    }
    let log = Log()
    let command = CommandSource<Int>(cancel: { _, loop in log.add("cancel@\(loop.name)") }) { value in
      log.add("cmd\(value)@\(RunLoopThread.currentIfExists?.name ?? "?")")
    }
    let first: RunLoopMode = addedToCommon ? .common : .default
    let other: RunLoopMode = addedToCommon ? .default : .common
    loopA.add(command.source, to: first)
    try Self.settle(loopA)
    loopA.remove(command.source, from: other)
    try Self.settle(loopA)
    #expect(log.snapshot.isEmpty, "removing a name it was not added by ended it: \(log.snapshot)")
    if addedToCommon {
      // Out of .default, still in the common set: a mode that joins it receives the source.
      loopA.addModeToCommonModes("late")
      #expect(command.post(1))
      let result = try loopA.performAndWait {
        loopA.run(mode: "late", for: .milliseconds(200), returnAfterSourceHandled: true)
      }
      #expect(result == .handledSource)
    } else {
      #expect(command.post(1))  // still in .default, where the owned loop runs
    }
    #expect(waitUntil(timeout: .seconds(5)) { log.count("cmd1@common-a") == 1 })
    loopA.remove(command.source, from: first)  // its last name: it leaves the loop
    try Self.settle(loopA)
    #expect(log.snapshot == ["cmd1@common-a", "cancel@common-a"])
    loopB.add(command.source)  // free to move
    #expect(command.post(2))
    #expect(waitUntil(timeout: .seconds(5)) { log.count("cmd2@common-b") == 1 })
    #expect(log.snapshot == ["cmd1@common-a", "cancel@common-a", "cmd2@common-b"])
  }

  /// A `.common` descriptor silenced in a mode outside the common set fires in that mode once the
  /// mode joins the common set (the add re-evaluates the silenced ones), exactly once.
  @Test func aSilencedCommonSourceFiresInAModeThatJoinsTheCommonSetLater() throws {
    let loop = try RunLoopThread(name: "common")
    let pipe = FireCountingPipe()
    let (silenced, afterJoin, listed) = try loop.performAndWait { () throws -> (Int, Int, Int) in
      try loop.add(pipe.source, to: .common)
      writeByte(pipe.write)
      runOtherModeBriefly(loop)
      let silenced = pipe.count
      loop.addModeToCommonModes(silencedOtherMode)
      let keepAlive = LoopTimer(after: .seconds(3_600)) { _ in }
      loop.add(keepAlive, to: silencedOtherMode)
      loop.run(mode: silencedOtherMode, until: .now.advanced(by: .milliseconds(20)))
      keepAlive.invalidate()
      loop.run(mode: .default, until: .now)
      return (silenced, pipe.count, loop.core.descriptors.silenced.count)
    }
    #expect(silenced == 0)
    #expect(afterJoin == 1)
    #expect(listed == 0)
    loop.shutdownAndWait()
    pipe.close()
  }

  /// "Its last mode" counts names, `.common` being one: a source added to `.common` and to "named"
  /// by name, with "late" joining the common set afterwards, is in all three; removing
  /// `.default` by name takes it out of that mode only (no cancel), removing `.common` leaves
  /// "named" (still no cancel), and removing "named" cancels it, once.
  @Test func commonModeNamesCountAsOneAndALateCommonModeReceivesTheSource() async throws {
    let loop = try RunLoopThread(name: "common")
    let cancels = AtomicCounter()
    let source = InputSource(cancel: { _, _ in cancels.increment() }, perform: { _ in })
    let named: RunLoopMode = "named"
    let late: RunLoopMode = "late"
    loop.add(source, to: .common)
    loop.add(source, to: named)
    loop.addModeToCommonModes(late)
    let steps = try await withWatchdogOnThread(timeout: .seconds(20), "common mode names") { () -> [String] in
      func modes() -> String {
        let list = (try? loop.performAndWait { loop.core.modes(of: source).map(\.rawValue).sorted() }) ?? []
        return list.joined(separator: ",") + " cancels \(cancels.current)"
      }
      var steps = [modes()]
      loop.remove(source, from: .default)
      steps.append(modes())
      loop.remove(source, from: .common)
      steps.append(modes())
      loop.remove(source, from: named)
      steps.append(modes())
      loop.shutdownAndWait()
      steps.append("after shutdown: cancels \(cancels.current)")
      return steps
    }
    #expect(
      steps == [
        "kCFRunLoopDefaultMode,late,named cancels 0", "late,named cancels 0", "named cancels 0", " cancels 1",
        "after shutdown: cancels 1",
      ], "\(steps ?? [])")
  }

  /// Promise (RunLoopThread+Members): a member added to `.common` is in every common mode, also
  /// one that joins the common set later; schedule once per join of the loop, cancel exactly once
  /// per schedule. One thread adds modes to the common set while another adds and removes an
  /// input source and an observer in `.common`; afterwards, each common mode runs the source
  /// exactly once per signal and tells the observer exactly once per entry.
  @Test func membersInCommonReachModesAddedToTheSetConcurrently() async throws {
    let failures = try await failuresOverRounds(25, budget: .seconds(4), "common modes vs churn") {
      round, failures in
      guard let loop = try? RunLoopThread(name: "common") else { return failures.append("no loop") }
      defer { loop.shutdownAndWait() }
      let schedules = AtomicCounter()
      let cancels = AtomicCounter()
      let performs = AtomicCounter()
      let entries = AtomicCounter()
      let source = InputSource(
        schedule: { _, _, _ in schedules.increment() }, cancel: { _, _ in cancels.increment() }
      ) { _ in performs.increment() }
      let observer = LoopObserver(activities: .entry) { _, _ in entries.increment() }
      let modes = (0..<16).map { RunLoopMode("c\(round)-\($0)") }
      let addModes: @Sendable () -> Void = { for mode in modes { loop.addModeToCommonModes(mode) } }
      let churn: @Sendable () -> Void = {
        for index in 0..<60 {
          loop.add(source, to: .common)
          loop.add(observer, to: .common)
          if index % 3 == 0 { loop.add(source, to: modes[index % modes.count]) }
          loop.remove(source, from: .common)
          loop.remove(observer, from: .common)
          if index % 3 == 0 { loop.remove(source, from: modes[index % modes.count]) }
        }
        loop.add(source, to: .common)
        loop.add(observer, to: .common)
      }
      race([addModes, churn])
      let perMode: [String]? = try? loop.performAndWait { () -> [String] in
        var wrong: [String] = []
        for mode in modes {
          let (p, e) = (performs.current, entries.current)
          source.signal()
          let result = loop.run(mode: mode, until: .now)
          if performs.current - p != 1 || entries.current - e != 1 {
            wrong.append("\(mode): performs +\(performs.current - p), entries +\(entries.current - e), \(result)")
          }
        }
        if schedules.current != cancels.current + 1 {
          wrong.append("on the loop: schedules \(schedules.current), cancels \(cancels.current)")
        }
        return wrong
      }
      for problem in perMode ?? ["performAndWait refused"] { failures.append("round \(round): \(problem)") }
      source.invalidate()
      observer.invalidate()
      _ = try? loop.performAndWait {}
      if schedules.current != cancels.current {
        failures.append("round \(round): after invalidate schedules \(schedules.current), cancels \(cancels.current)")
      }
    }
    #expect(failures == [])
  }

  /// Promise (RunLoopThread+Members, "its last mode"): removing `.common` takes a member out of
  /// every common mode, including one that joins the set at the same moment from another thread
  /// (either order ends with the source in no common mode), while a mode it was added to by name
  /// keeps it; cancel runs once, when the last named mode goes.
  @Test func removingCommonRacingAModeJoiningTheSetLeavesOnlyNamedModes() async throws {
    let failures = try await failuresOverRounds(200, budget: .seconds(3), "remove .common vs join") {
      round, failures in
      let loop = Self.sharedLoop
      let joining = RunLoopMode("join-\(round)")
      let named = RunLoopMode("named-\(round)")
      let schedules = AtomicCounter()
      let cancels = AtomicCounter()
      let performs = AtomicCounter()
      let source = InputSource(
        schedule: { _, _, _ in schedules.increment() }, cancel: { _, _ in cancels.increment() }
      ) { _ in performs.increment() }
      loop.add(source, to: .common)
      loop.add(source, to: named)
      race([{ loop.addModeToCommonModes(joining) }, { loop.remove(source, from: .common) }])
      let seen: (joining: Int, named: Int, cancels: Int)? = try? loop.performAndWait {
        let before = performs.current
        source.signal()
        loop.run(mode: joining, until: .now)
        let inJoining = performs.current - before
        loop.run(mode: named, until: .now)
        return (inJoining, performs.current - before - inJoining, cancels.current)
      }
      if let seen, seen.joining != 0 || seen.named != 1 || seen.cancels != 0 {
        failures.append("round \(round): joining +\(seen.joining), named +\(seen.named), cancels \(seen.cancels)")
      }
      loop.remove(source, from: named)
      _ = try? loop.performAndWait {}
      if schedules.current != 1 || cancels.current != 1 {
        failures.append("round \(round): schedules \(schedules.current), cancels \(cancels.current)")
      }
      source.invalidate()
    }
    #expect(failures == [])
  }

  /// Promise (DescriptorSource in `.common`): a readiness source added to `.common` is watched
  /// in every common mode, also modes that join the set while another thread adds and removes
  /// it; after it is removed from `.common` no common mode runs it.
  @Test func aDescriptorSourceInCommonFollowsModesJoiningTheSet() async throws {
    let failures = try await failuresOverRounds(30, budget: .seconds(4), "descriptor in common") {
      round, failures in
      let loop = Self.sharedLoop
      let ends = makePipe()
      defer {
        close(ends.read)
        close(ends.write)
      }
      let fires = AtomicCounter()
      let source = DescriptorSource(descriptor: ends.read) { _, _ in fires.increment() }
      let modes = (0..<8).map { RunLoopMode("d\(round)-\($0)") }
      let churn: @Sendable () -> Void = {
        for _ in 0..<30 {
          try? loop.add(source, to: .common)
          loop.remove(source, from: .common)
        }
        try? loop.add(source, to: .common)
      }
      race([{ for mode in modes { loop.addModeToCommonModes(mode) } }, churn])
      writeByte(ends.write)
      let missing: [String]? = try? loop.performAndWait {
        var missing: [String] = []
        for mode in modes {
          let before = fires.current
          loop.run(mode: mode, until: .now)
          if fires.current == before { missing.append("\(mode)") }
        }
        return missing
      }
      if let missing, !missing.isEmpty { failures.append("round \(round): not fired in \(missing)") }
      source.invalidate()
      _ = try? loop.performAndWait {}
    }
    #expect(failures == [])
  }

  /// Promise ("its last mode" counts mode names): on the loop thread, step by step, with exact
  /// counts: a source in `.common` is scheduled once however many modes join the set; removing
  /// `.default` by name takes it out of that mode only (it stays in the other common modes and
  /// in ones that join later); removing `.common` leaves a mode it was added to by name; cancel
  /// runs once, when the last name goes. An observer removed from `.common` is not told in a
  /// mode that joins the set afterwards, and is again once re-added.
  @Test func commonSetBookkeepingIsExact() async throws {
    let report = try await withWatchdogOnThread(timeout: .seconds(20), "common bookkeeping") { () throws -> [String] in
      let loop = try RunLoopThread(name: "book")
      defer { loop.shutdownAndWait() }
      return try loop.performAndWait { () -> [String] in
        var wrong: [String] = []
        let schedules = AtomicCounter()
        let cancels = AtomicCounter()
        let performs = AtomicCounter()
        let told = AtomicCounter()
        let source = InputSource(
          schedule: { _, _, _ in schedules.increment() }, cancel: { _, _ in cancels.increment() }
        ) { _ in performs.increment() }
        let observer = LoopObserver(activities: .entry) { _, _ in told.increment() }
        let keep = LoopTimer(after: .seconds(3_600)) { _ in }
        defer { keep.invalidate() }
        func fired(in mode: RunLoopMode) -> (performs: Int, told: Int) {
          let (p, t) = (performs.current, told.current)
          source.signal()
          loop.add(keep, to: mode)
          loop.run(mode: mode, until: .now)
          return (performs.current - p, told.current - t)
        }
        func expect(_ mode: RunLoopMode, _ wanted: (Int, Int), _ step: String) {
          let got = fired(in: mode)
          if got != wanted { wrong.append("\(step): \(mode) gave \(got), wanted \(wanted)") }
        }
        loop.add(source, to: .common)
        loop.add(observer, to: .common)
        let modes = (0..<5).map { RunLoopMode("book-\($0)") }
        for mode in modes { loop.addModeToCommonModes(mode) }
        if schedules.current != 1 { wrong.append("schedules \(schedules.current) after modes joined") }
        for mode in modes { expect(mode, (1, 1), "joined") }
        loop.remove(source, from: .default)
        expect(.default, (0, 1), "removed .default by name")
        expect(modes[0], (1, 1), "removed .default by name")
        let late = RunLoopMode("book-late")
        loop.addModeToCommonModes(late)
        expect(late, (1, 1), "joined after .default was removed")
        loop.remove(observer, from: .common)
        let later = RunLoopMode("book-later")
        loop.addModeToCommonModes(later)
        expect(later, (1, 0), "observer removed, then a mode joined")
        loop.add(observer, to: .common)
        expect(later, (1, 1), "observer re-added")
        loop.add(source, to: modes[2])
        loop.remove(source, from: .common)
        if cancels.current != 0 { wrong.append("cancelled while still in a named mode") }
        expect(modes[1], (0, 1), "after removing .common")
        expect(modes[2], (1, 1), "the named mode after removing .common")
        loop.remove(source, from: modes[2])
        if schedules.current != 1 || cancels.current != 1 {
          wrong.append("at the end: schedules \(schedules.current), cancels \(cancels.current)")
        }
        observer.invalidate()
        return wrong
      }
    }
    #expect(report == [])
  }

  /// Promise ("its last mode" counts mode names; a member is on one loop at a time): a source
  /// added to `.common` and then removed from `.default` by name is still on its loop (it stays
  /// until removed from `.common`), so adding it to a second loop traps, naming both loops.
  @Test func removingDefaultByNameDoesNotFreeACommonMemberForAnotherLoop() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let first = try RunLoopThread(name: "trap-first")
      let second = try RunLoopThread(name: "trap-second")
      let source = InputSource { _ in }
      first.add(source, to: .common)
      first.remove(source, from: .default)
      second.add(source, to: .default)
    }
    expectStandardError(of: result, mentions: "trap-first")
    expectStandardError(of: result, mentions: "trap-second")
  }

  /// Added to `.common`, removed from `.default` by name: stays on the loop in no mode; a mode
  /// joining the common set later receives it; removing `.common` then cancels it, once.
  @Test
  func commonMemberRemovedByNameThenCommonModeAddedThenCommonRemoved() async throws {
    let loop = try RunLoopThread(name: "common")
    defer { loop.shutdownAndWait() }
    let pairs = PairLog()
    let modeX = RunLoopMode("common-late")
    let result = try await withWatchdogOnThread { () -> [String] in
      let source = InputSource(
        schedule: { _, loop, _ in pairs.schedule(loop) }, cancel: { _, loop in pairs.cancel(loop) },
        perform: { _ in })
      let log = EventLog()
      loop.add(source, to: .common)
      loop.remove(source, from: .default)
      try loop.performAndWait { log.add("after remove default: \(loop.core.modes(of: source))") }
      loop.addModeToCommonModes(modeX)
      try loop.performAndWait { log.add("after common X: \(loop.core.modes(of: source))") }
      loop.remove(source, from: .common)
      try loop.performAndWait { log.add("after remove common: \(loop.core.modes(of: source))") }
      // Free to move now.
      let other = try RunLoopThread(name: "common-2")
      other.add(source, to: .default)
      try other.performAndWait { log.add("on other: \(other.core.modes(of: source))") }
      source.invalidate()
      other.shutdownAndWait()
      return log.snapshot
    }
    #expect(
      result == [
        "after remove default: []", "after common X: [\(modeX)]", "after remove common: []",
        "on other: [\(RunLoopMode.default)]",
      ])
    #expect(pairs.unpaired.isEmpty, "\(pairs.unpaired)")
    #expect(pairs.counts.snapshot["common"]?.schedule == 1)
  }

  /// A mode added to the common set from a callout inside a nested run of that very mode: a
  /// signalled source in `.common` joins it and fires in that run.
  @Test func aModeJoiningTheCommonSetDuringItsOwnRunServesCommonMembersAtOnce() async throws {
    let thread = CommandedCurrentLoopThread()
    defer { thread.quit() }
    let mode = modeM
    let (nested, fired) = await thread.exec { loop -> (RunLoopRunResult?, Int) in
      let fired = Locked(0)
      let nested = Guarded<RunLoopRunResult?>(nil)
      let source = InputSource { _ in fired.withLock { $0 += 1 } }
      loop.add(source, to: .common)
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepAlive, to: mode)
      loop.add(keepAlive)
      let opener = LoopTimer(after: .zero) { _ in
        loop.perform(inModes: [mode]) {
          loop.addModeToCommonModes(mode)
          source.signal()
        }
        nested.withLock { $0 = loop.run(mode: mode, for: .seconds(5), returnAfterSourceHandled: true) }
        loop.stop()
      }
      loop.add(opener)
      _ = loop.run(for: .seconds(20))
      let inCommon = loop.commonModes.contains(mode)
      source.invalidate()
      keepAlive.invalidate()
      opener.invalidate()
      return (inCommon ? nested.snapshot : nil, fired.withLock { $0 })
    }
    #expect(nested == .handledSource)
    #expect(fired == 1)
  }
}
