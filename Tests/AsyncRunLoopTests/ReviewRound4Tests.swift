import Glibc
import Testing

@testable import AsyncRunLoop

/// Review round 4: `.common` removal, parked timers, set-aside entries, whole-batch changes, the
/// dense heap table, signals' arrival numbers and `pendingJoins`. Exact counts only. The four
/// tests of timers whose modes change in their own callout failed before the fix (the pass took a
/// change of modes for a move of the fire date).
@Suite("ReviewRound4")
struct ReviewRound4Tests {

  /// Something the routines capture, to see (weakly) that they are released.
  final class Capture: Sendable {}

  // MARK: Timers whose modes change during their own callout

  /// LoopTimer: "a one-shot timer invalidates itself after firing". A one-shot timer in modes A
  /// and B fires in A; its callout removes it from B only (it stays in A). Before the fix the pass
  /// took that for a move and neither invalidated it nor put its A entry (popped) back: the timer
  /// stayed valid, never fired again, and kept mode A alive.
  @Test
  func oneShotTimerRemovedFromOtherModeInCalloutIsInvalidated() async throws {
    let loop = try RunLoopThread(name: "r4-oneshot-remove")
    defer { loop.shutdownAndWait() }
    let modeA = RunLoopMode("r4-a")
    let modeB = RunLoopMode("r4-b")
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (fires: Int, valid: Bool, run: RunLoopRunResult, inA: Bool) in
        let fires = AtomicCounter()
        let timer = LoopTimer(fireAt: .now.advanced(by: .milliseconds(-5))) { timer in
          fires.increment()
          loop.remove(timer, from: modeB)
        }
        loop.add(timer, to: modeA)
        loop.add(timer, to: modeB)
        loop.run(mode: modeA, until: .now)  // one pass: fires
        let valid = timer.isValid
        let inA = loop.core.modes(of: timer).contains(modeA)
        // Nothing else is in A: once the one-shot timer is done, the run finishes at once.
        let run = loop.run(mode: modeA, until: .now.advanced(by: .milliseconds(30)))
        timer.invalidate()
        return (fires.current, valid, run, inA)
      }
    }
    #expect(result?.fires == 1)
    #expect(result?.valid == false, "a one-shot timer that fired stayed valid")
    #expect(result?.inA == false, "the fired one-shot timer is still in mode A")
    #expect(result?.run == .finished, "mode A kept alive by a one-shot timer that already fired")
  }

  /// The same cause for a repeating timer (zero interval: once per pass): removed from mode B in
  /// its first callout, it never fires again in mode A, where it still is.
  @Test
  func repeatingTimerRemovedFromOtherModeInCalloutKeepsFiring() async throws {
    let loop = try RunLoopThread(name: "r4-repeat-remove")
    defer { loop.shutdownAndWait() }
    let modeA = RunLoopMode("r4-a")
    let modeB = RunLoopMode("r4-b")
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> Int in
        let fires = AtomicCounter()
        let timer = LoopTimer(fireAt: .now.advanced(by: .milliseconds(-5)), repeatingEvery: .zero) { timer in
          if fires.increment() == 1 { loop.remove(timer, from: modeB) }
        }
        let keeper = InputSource(perform: { _ in })
        loop.add(keeper, to: modeA)
        loop.add(timer, to: modeA)
        loop.add(timer, to: modeB)
        for _ in 0..<4 { loop.run(mode: modeA, until: .now) }
        timer.invalidate()
        keeper.invalidate()
        return fires.current
      }
    }
    #expect(result == 4, "a repeating timer still in mode A stopped firing there")
  }

  /// SPEC §4: a repeating timer "fires once and moves to the next future multiple of its
  /// interval". A repeating (1 h) timer that adds itself to a new mode in its callout must be
  /// advanced, not put back at the date that just fired (before the fix it fired again on the
  /// next pass for the same grid point).
  @Test
  func repeatingTimerAddedToNewModeInCalloutFiresOncePerDate() async throws {
    let loop = try RunLoopThread(name: "r4-repeat-add")
    defer { loop.shutdownAndWait() }
    let modeA = RunLoopMode("r4-a")
    let modeC = RunLoopMode("r4-c")
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (fires: Int, advanced: Bool) in
        let fires = AtomicCounter()
        let start = LoopClock.Instant.now
        let timer = LoopTimer(fireAt: start.advanced(by: .milliseconds(-5)), repeatingEvery: .seconds(3600)) { timer in
          fires.increment()
          loop.add(timer, to: modeC)  // a no-op after the first time
        }
        let keeper = InputSource(perform: { _ in })
        loop.add(keeper, to: modeA)
        loop.add(timer, to: modeA)
        for _ in 0..<3 { loop.run(mode: modeA, until: .now) }
        let advanced = timer.fireDate > start
        timer.invalidate()
        keeper.invalidate()
        return (fires.current, advanced)
      }
    }
    #expect(result?.fires == 1, "one grid point fired more than once")
    #expect(result?.advanced == true)
  }

  /// The same with the mode joining through `.common`: a one-shot timer in `.common` whose
  /// callout adds a mode to the common set (the timer joins it) fires twice.
  @Test
  func oneShotCommonTimerAddingCommonModeFiresOnce() async throws {
    let loop = try RunLoopThread(name: "r4-common-add")
    defer { loop.shutdownAndWait() }
    let modeX = RunLoopMode("r4-common-x")
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (fires: Int, valid: Bool) in
        let fires = AtomicCounter()
        let timer = LoopTimer(fireAt: .now.advanced(by: .milliseconds(-5))) { _ in
          fires.increment()
          loop.addModeToCommonModes(modeX)
        }
        let keeper = InputSource(perform: { _ in })
        loop.add(keeper, to: .default)
        loop.add(timer, to: .common)
        for _ in 0..<3 { loop.run(mode: .default, until: .now) }
        let valid = timer.isValid
        timer.invalidate()
        keeper.invalidate()
        return (fires.current, valid)
      }
    }
    #expect(result?.fires == 1, "a one-shot timer fired twice")
    #expect(result?.valid == false)
  }

  // MARK: Parked timers (passing checks)

  /// A one-shot timer in A and B whose callout runs B nested (parking its B entry) fires once,
  /// is invalidated, and the nested run neither fires it nor spins.
  @Test
  func parkedOneShotTimerFiresOnceAndLeaves() async throws {
    let loop = try RunLoopThread(name: "r4-park")
    defer { loop.shutdownAndWait() }
    let modeA = RunLoopMode("r4-a")
    let modeB = RunLoopMode("r4-b")
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (fires: Int, passes: Int, valid: Bool, modes: Int) in
        let fires = AtomicCounter()
        let passes = AtomicCounter()
        let observer = LoopObserver(activities: .beforeTimers) { _, _ in passes.increment() }
        loop.add(observer, to: modeB)
        let timer = LoopTimer(fireAt: .now.advanced(by: .milliseconds(-5))) { _ in
          fires.increment()
          loop.run(mode: modeB, until: .now.advanced(by: .milliseconds(20)))
        }
        loop.add(timer, to: modeA)
        loop.add(timer, to: modeB)
        loop.run(mode: modeA, until: .now)
        let valid = timer.isValid
        let modes = loop.core.modeCount(of: timer)
        observer.invalidate()
        timer.invalidate()
        return (fires.current, passes.current, valid, modes)
      }
    }
    #expect(result?.fires == 1)
    #expect((result?.passes ?? 99) < 10, "the nested run spun on the parked timer")
    #expect(result?.valid == false)
    #expect(result?.modes == 0)
  }

  /// A repeating timer parked by a nested run, rescheduled from another thread during the
  /// callout (applied by the nested run), then invalidated in the same callout: no crash, no fire
  /// inside its own callout, its handler released.
  @Test
  func parkedTimerRescheduledFromAnotherThreadThenInvalidated() async throws {
    let loop = try RunLoopThread(name: "r4-park-resched")
    defer { loop.shutdownAndWait() }
    let modeA = RunLoopMode("r4-a")
    let modeB = RunLoopMode("r4-b")
    let result = try await withWatchdogOnThread {
      var weakCapture: [() -> Bool] = []
      var totals = 0
      var rounds = 0
      rounds = repeatRounds(200, budget: .milliseconds(400)) { round in
        let fires = AtomicCounter()
        let capture = Capture()
        weak let weakRef = capture
        let timer = LoopTimer(fireAt: .now.advanced(by: .milliseconds(-5)), repeatingEvery: .seconds(3600)) {
          timer in
          withExtendedLifetime(capture) {}
          fires.increment()
          let other = startThread { timer.setFireDate(.now.advanced(by: .milliseconds(-1))) }
          joinThread(other)
          loop.run(mode: modeB, until: .now)  // applies the reschedule, parks the B entry
          if round % 2 == 0 { timer.invalidate() } else { loop.remove(timer, from: modeB) }
          loop.run(mode: modeA, until: .now)
        }
        try? loop.performAndWait {
          loop.add(timer, to: modeA)
          loop.add(timer, to: modeB)
          loop.run(mode: modeA, until: .now)
          timer.invalidate()
        }
        totals += fires.current
        weakCapture.append { weakRef == nil }
      }
      try loop.performAndWait {}
      return (totals, rounds, weakCapture.allSatisfy { $0() })
    }
    #expect(result?.0 == result?.1, "a timer fired inside its own callout, or not once")
    #expect(result?.2 == true, "a handler was never released")
  }

  // MARK: IndexedTimerHeap against a model

  final class HeapItem: TimerHeapElement {
    var heapSlot = -1
    let id: Int
    init(id: Int) { self.id = id }
  }

  /// Random insert / remove / update / pop sequences against a dictionary model: pops come out
  /// in (deadline, sequence) order, positions stay consistent, slots of removed elements are -1.
  @Test
  func heapMatchesReferenceModel() {
    var generator = SystemRandomNumberGenerator()
    var failures: [String] = []
    for seed in 0..<16 {
      var heap = IndexedTimerHeap<HeapItem>()
      let items = (0..<(8 + seed * 3)).map(HeapItem.init(id:))
      var model: [Int: (deadline: Int64, sequence: UInt64)] = [:]
      var sequence: UInt64 = 0
      for step in 0..<800 {
        let item = items[Int.random(in: 0..<items.count, using: &generator)]
        let deadline = Int64.random(in: 0..<20, using: &generator)
        sequence += 1
        switch Int.random(in: 0..<5, using: &generator) {
        case 0, 1:
          if model[item.id] == nil {
            heap.insert(item, deadline: deadline, sequence: sequence)
            model[item.id] = (deadline, sequence)
          } else {
            heap.update(item, deadline: deadline, sequence: sequence)
            model[item.id] = (deadline, sequence)
          }
        case 2:
          let removed = heap.remove(item)
          if removed != (model[item.id] != nil) { failures.append("seed \(seed) step \(step): remove said \(removed)") }
          model[item.id] = nil
        case 3:
          let expected = model.min { lhs, rhs in
            lhs.value.deadline != rhs.value.deadline
              ? lhs.value.deadline < rhs.value.deadline : lhs.value.sequence < rhs.value.sequence
          }
          let popped = heap.popFirst()
          if popped?.element.id != expected?.key || popped?.deadline != expected?.value.deadline {
            failures.append("seed \(seed) step \(step): popped \(String(describing: popped?.element.id))")
          }
          if let expected { model[expected.key] = nil }
        default:
          if model[item.id] != nil {
            heap.update(item, deadline: deadline, sequence: sequence)
            model[item.id] = (deadline, sequence)
          }
        }
        // Invariants.
        if heap.count != model.count { failures.append("seed \(seed) step \(step): count \(heap.count)") }
        for other in items {
          let inHeap = heap.contains(other)
          if inHeap != (model[other.id] != nil) { failures.append("seed \(seed) step \(step): contains \(other.id)") }
          if !inHeap && other.heapSlot != -1 { failures.append("seed \(seed) step \(step): slot of \(other.id)") }
          if let entry = heap.entry(for: other), let want = model[other.id],
            entry.deadline != want.deadline || entry.sequence != want.sequence
          {
            failures.append("seed \(seed) step \(step): entry of \(other.id)")
          }
        }
        let entries = heap.entries
        for index in entries.indices.dropFirst() {
          let parent = entries[(index - 1) / IndexedTimerHeap<HeapItem>.arity]
          if entries[index].precedes(parent) { failures.append("seed \(seed) step \(step): heap order at \(index)") }
        }
        if heap.firstDeadline != entries.first?.deadline { failures.append("seed \(seed): firstDeadline") }
        if failures.count > 5 { break }
      }
      heap.removeAll()
      if items.contains(where: { $0.heapSlot != -1 }) { failures.append("seed \(seed): removeAll left slots") }
      if !failures.isEmpty { break }
    }
    #expect(failures.isEmpty, "\(failures.prefix(5))")
  }

  // MARK: .common

  /// Added to `.common`, removed from `.default` by name: stays on the loop in no mode; a mode
  /// joining the common set later receives it; removing `.common` then cancels it, once.
  @Test
  func commonMemberRemovedByNameThenCommonModeAddedThenCommonRemoved() async throws {
    let loop = try RunLoopThread(name: "r4-common")
    defer { loop.shutdownAndWait() }
    let pairs = PairLog()
    let modeX = RunLoopMode("r4-common-late")
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
      let other = try RunLoopThread(name: "r4-common-2")
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
    #expect(pairs.counts.snapshot["r4-common"]?.schedule == 1)
  }

  /// Observers order in a mode joined through `.common` and by name: told in their `order`.
  @Test
  func observersInCommonAndNamedModeKeepOrder() async throws {
    let loop = try RunLoopThread(name: "r4-common-obs")
    defer { loop.shutdownAndWait() }
    let modeX = RunLoopMode("r4-common-obs-x")
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> [String] in
        let log = EventLog()
        let late = LoopObserver(activities: .entry, order: 3) { _, _ in log.add("3") }
        let early = LoopObserver(activities: .entry, order: 1) { _, _ in log.add("1") }
        let middle = LoopObserver(activities: .entry, order: 2) { _, _ in log.add("2") }
        loop.add(late, to: .common)
        loop.add(middle, to: modeX)
        loop.add(early, to: .common)
        loop.addModeToCommonModes(modeX)
        let keeper = InputSource(perform: { _ in })
        loop.add(keeper, to: modeX)
        loop.run(mode: modeX, until: .now)
        loop.remove(late, from: .common)
        loop.run(mode: modeX, until: .now)
        for member in [late, early, middle] { member.invalidate() }
        keeper.invalidate()
        return log.snapshot
      }
    }
    #expect(result == ["1", "2", "3", "1", "2"])
  }

  // MARK: Changes in whole batches; nested applyControls

  /// 300 adds sent as one batch; the first one's schedule routine runs the loop nested (which
  /// continues the same queue, bounded); a block sent after them runs after every schedule.
  @Test
  func nestedRunInScheduleKeepsChangeAndBlockOrder() async throws {
    let loop = try RunLoopThread(name: "r4-batch")
    defer { loop.shutdownAndWait() }
    let result = try await withWatchdogOnThread { () -> (ordered: Bool, count: Int, blockLast: Bool) in
      let log = EventLog()
      let release = blockLoop(loop)
      var sources: [InputSource] = []
      for index in 0..<300 {
        let source = InputSource(
          schedule: { _, loop, _ in
            log.add("\(index)")
            if index == 0 || index == 150 { loop.run(mode: .default, until: .now) }
          }, perform: { _ in })
        sources.append(source)
        loop.add(source, to: .default)
      }
      loop.perform { log.add("block") }
      release.open()
      try loop.performAndWait {}
      let entries = log.snapshot
      for source in sources { source.invalidate() }
      let numbers = entries.compactMap(Int.init)
      return (numbers == Array(0..<300), numbers.count, entries.last == "block")
    }
    #expect(result?.ordered == true)
    #expect(result?.count == 300)
    #expect(result?.blockLast == true)
  }

  // MARK: Signals behind the barrier

  /// A signal that waits behind a flood of changes (more than one bounded pass applies), then
  /// the source is removed and moved to another loop: it fires exactly once, on the new loop.
  @Test
  func waitingSignalFollowsTheSourceToItsNextLoop() async throws {
    let first = try RunLoopThread(name: "r4-sig-1")
    let second = try RunLoopThread(name: "r4-sig-2")
    defer {
      first.shutdownAndWait()
      second.shutdownAndWait()
    }
    let result = try await withWatchdogOnThread { () -> (performs: [String], unpaired: [String], rounds: Int) in
      let pairs = PairLog()
      let performs = Guarded<[String]>([])
      var rounds = 0
      rounds = repeatRounds(20, budget: .milliseconds(400)) { round in
        let source = InputSource(
          schedule: { _, loop, _ in pairs.schedule(loop) }, cancel: { _, loop in pairs.cancel(loop) },
          perform: { _ in performs.withLock { $0.append(RunLoopThread.current.name) } })
        first.add(source, to: .default)
        try? first.performAndWait {}
        let release = blockLoop(first)
        let filler = LoopObserver(activities: .entry) { _, _ in }
        for _ in 0..<200 {
          first.add(filler, to: .default)
          first.remove(filler, from: .default)
        }
        source.signal()
        first.remove(source, from: .default)
        second.add(source, to: .default)
        release.open()
        try? first.performAndWait {}
        // Waited for, not taken from barriers on `second`: a pass runs the blocks sent before it
        // (step 3) before it fires the sources signalled before it (step 4), so a source that
        // joined late in one pass fires after the block of the next (invalidated, it would not).
        waitUntil("the perform on r4-sig-2") { performs.snapshot.count > round }
        try? second.performAndWait {}
        source.invalidate()
        filler.invalidate()
      }
      try? first.performAndWait {}
      try? second.performAndWait {}
      return (performs.snapshot, pairs.unpaired, rounds)
    }
    #expect(result?.performs.allSatisfy { $0 == "r4-sig-2" } == true, "\(result?.performs ?? [])")
    #expect(result.map { $0.performs.count == $0.rounds } == true, "one signal, not exactly one perform")
    #expect(result?.unpaired.isEmpty == true, "\(result?.unpaired ?? [])")
  }

  // MARK: pendingJoins, moves, shutdown

  /// A source moved around three loops from racing threads while one loop shuts down: every
  /// loop that scheduled it cancels it exactly once, and the routines are released.
  @Test
  func movesBetweenThreeLoopsWithShutdownPairAndRelease() async throws {
    let result = try await withWatchdogOnThread { () -> (unpaired: [String], leaked: Int, rounds: Int) in
      let pairs = PairLog()
      var leaked = 0
      let rounds = repeatRounds(60, budget: .milliseconds(600)) { round in
        let loops = (0..<3).compactMap { try? RunLoopThread(name: "r4-move-\($0)") }
        var weakRefs: [() -> Bool] = []
        do {
          let capture = Capture()
          weak let weakCapture = capture
          weakRefs.append { weakCapture == nil }
          let source = InputSource(
            schedule: { _, loop, _ in
              withExtendedLifetime(capture) {}
              pairs.schedule(loop)
            }, cancel: { _, loop in pairs.cancel(loop) }, perform: { _ in })
          race([
            {
              for step in 0..<30 {
                let loop = loops[step % 3]
                loop.add(source, to: step % 2 == 0 ? .common : .default)
                loop.remove(source, from: step % 2 == 0 ? .common : .default)
              }
              loops[round % 3].add(source, to: .default)
            },
            { loops[(round + 1) % 3].shutdown() },
            { for _ in 0..<10 { source.signal() } },
          ])
          source.invalidate()
        }
        for loop in loops { loop.shutdownAndWait() }
        leaked += weakRefs.filter { !$0() }.count
      }
      return (pairs.unpaired, leaked, rounds)
    }
    #expect(result?.unpaired.isEmpty == true, "\(result?.unpaired ?? [])")
    #expect(result?.leaked == 0, "routines never released")
  }

  /// CommandSource: every accepted command is delivered exactly once while the source moves
  /// between loops and the last reference to one loop is dropped with adds still queued.
  @Test
  func commandsDeliveredOnceAcrossMovesAndDroppedLoop() async throws {
    let result = try await withWatchdogOnThread { () -> (accepted: Int, delivered: Int, unpaired: [String]) in
      let pairs = PairLog()
      let accepted = AtomicCounter()
      let delivered = AtomicCounter()
      repeatRounds(60, budget: .milliseconds(600)) { round in
        guard let keep = try? RunLoopThread(name: "r4-cmd-keep") else { return }
        let commands = CommandSource<Int>(
          schedule: { _, loop, _ in pairs.schedule(loop) }, cancel: { _, loop in pairs.cancel(loop) },
          handler: { _ in delivered.increment() })
        do {
          // The only reference to this loop: gone at the end of this block, changes still queued.
          guard let droppedLoop = try? RunLoopThread(name: "r4-cmd-drop") else { return }
          let release = blockLoop(droppedLoop)
          droppedLoop.add(commands.source, to: .default)
          race([
            {
              for index in 0..<50 where commands.post(index) { accepted.increment() }
            },
            {
              droppedLoop.remove(commands.source, from: .default)
              keep.add(commands.source, to: round % 2 == 0 ? .common : .default)
              keep.remove(commands.source, from: round % 2 == 0 ? .common : .default)
              droppedLoop.add(commands.source, to: .default)
            },
          ])
          release.open()
        }
        commands.source.invalidate()
        keep.shutdownAndWait()
      }
      // Dropped loops end on their own; wait for their cancels.
      waitUntil(timeout: .seconds(5), "dropped loops to cancel") { pairs.unpaired.isEmpty }
      waitUntil(timeout: .seconds(2), "every accepted command delivered") { delivered.current >= accepted.current }
      return (accepted.current, delivered.current, pairs.unpaired)
    }
    let counts = "accepted \(result?.accepted ?? -1), delivered \(result?.delivered ?? -1)"
    #expect(result.map { $0.accepted == $0.delivered } == true, "\(counts)")
    #expect(result?.unpaired.isEmpty == true, "\(result?.unpaired ?? [])")
  }

  /// "Equal orders fire in signalling order", also for a source signalled while the loop ran a
  /// mode it is not in (kept aside) and a source signalled after it.
  @Test func aSourceKeptAsideFiresBeforeOneSignalledLater() throws {
    let loop = try RunLoopThread(name: "r4-signal-order")
    defer { loop.shutdownAndWait() }
    let log = EventLog()
    let first = InputSource { _ in log.add("first") }
    let second = InputSource { _ in log.add("second") }
    let other: RunLoopMode = "r4-order-other"
    try loop.performAndWait {
      loop.add(first)
      loop.add(second)
      loop.add(LoopTimer(after: .seconds(3600)) { _ in }, to: other)
      first.signal()
      loop.run(mode: other, for: .milliseconds(5))  // `first` is not in it: kept aside
      second.signal()
      loop.run(mode: .default, for: .milliseconds(5))
    }
    #expect(log.snapshot == ["first", "second"])
  }

}
