import Glibc
import Testing

@testable import AsyncRunLoop

/// The timer heaps stay consistent through every membership change.
@Suite("The timer heaps stay consistent through every membership change")
struct TimerHeapConsistencyTests {
  /// SPEC §4: a timer "fires only while its loop runs in one of the timer's modes". A timer whose
  /// entry in mode X is an extra entry (its first mode is Y) is scheduled by a callout of the pass
  /// (so step 9 sets its entry aside), then removed from X and added back by a later callout of
  /// the same pass. The pass puts the old, set-aside entry back into X's heap next to the new one:
  /// an orphan entry that no membership owns. Removing the timer from X afterwards leaves the
  /// orphan in X's heap, and the next pass in X fires the timer although it is not in X.
  @Test
  func setAsideEntryOfReplacedMembershipIsNotPutBack() async throws {
    let loop = try RunLoopThread(name: "rrec-aside")
    defer { loop.shutdownAndWait() }
    let modeX = RunLoopMode("rrec-x")
    let modeY = RunLoopMode("rrec-y")
    let result = try await withWatchdogOnThread {
      try loop.performAndWait { () -> (inX: [RunLoopMode], fires: Int) in
        let fires = AtomicCounter()
        let made = Guarded<LoopTimer?>(nil)
        let start = LoopClock.Instant.now
        let first = LoopTimer(fireAt: start.advanced(by: .milliseconds(-30))) { _ in
          let timer = LoopTimer(fireAt: start.advanced(by: .milliseconds(-20)), repeatingEvery: .seconds(3600)) { _ in
            fires.increment()
          }
          loop.add(timer, to: modeY)  // its record is its entry in Y
          loop.add(timer, to: modeX)  // an extra entry in X, scheduled by this pass: set aside
          made.withLock { $0 = timer }
        }
        let second = LoopTimer(fireAt: start.advanced(by: .milliseconds(-10))) { _ in
          guard let timer = made.snapshot else { return }
          loop.remove(timer, from: modeX)  // still in Y: the binding stays bound
          loop.add(timer, to: modeX)  // a new extra entry in X
        }
        let keeper = InputSource(perform: { _ in })  // mode X is never empty (SPEC §1: no pass)
        loop.add(keeper, to: modeX)
        defer { keeper.invalidate() }
        loop.add(first, to: modeX)
        loop.add(second, to: modeX)
        loop.run(mode: modeX, until: .now)  // one pass
        guard let timer = made.snapshot else { return ([], -1) }
        loop.remove(timer, from: modeX)  // the timer is in Y only now
        let modes = loop.core.modes(of: timer)
        let before = fires.current
        loop.run(mode: modeX, until: .now)  // one more pass in X
        loop.run(mode: modeX, until: .now)
        let inX = fires.current - before
        timer.invalidate()
        return (modes, inX)
      }
    }
    #expect(result?.inX == [modeY])
    #expect(result?.fires == 0, "the timer fired in a mode it is not in (an orphan entry stayed in the heap)")
  }

  /// The same set-aside path with the timer invalidated by a later callout of the pass: its
  /// record is freed (its binding and the registry let go), and the set-aside extra entry's
  /// `unowned(unsafe)` record is read afterwards (`entry.element.record.isIn(contents)`):
  /// a use after free (AddressSanitizer: heap-use-after-free).
  @Test
  func setAsideEntryOfInvalidatedTimerIsNotReadAfterFree() async throws {
    let loop = try RunLoopThread(name: "rrec-aside-uaf")
    defer { loop.shutdownAndWait() }
    let modeX = RunLoopMode("rrec-x")
    let modeY = RunLoopMode("rrec-y")
    let fires = try await withWatchdogOnThread {
      try loop.performAndWait { () -> Int in
        let fires = AtomicCounter()
        let made = Guarded<LoopTimer?>(nil)
        let start = LoopClock.Instant.now
        let first = LoopTimer(fireAt: start.advanced(by: .milliseconds(-30))) { _ in
          let timer = LoopTimer(fireAt: start.advanced(by: .milliseconds(-20))) { _ in fires.increment() }
          loop.add(timer, to: modeY)
          loop.add(timer, to: modeX)
          made.withLock { $0 = timer }
        }
        let second = LoopTimer(fireAt: start.advanced(by: .milliseconds(-10))) { _ in
          made.snapshot?.invalidate()
        }
        let keeper = InputSource(perform: { _ in })  // mode X is never empty (SPEC §1: no pass)
        loop.add(keeper, to: modeX)
        defer { keeper.invalidate() }
        loop.add(first, to: modeX)
        loop.add(second, to: modeX)
        for _ in 0..<3 { loop.run(mode: modeX, until: .now) }
        return fires.current
      }
    }
    #expect(fires == 0)
  }

  /// A repeating timer in `.default` and two other modes; other threads remove it from and add it
  /// back to the other modes and move its fire date to the past: the timer (in `.default` all
  /// along, which the loop runs) fires, and the loop never traps on a stale heap entry. After the
  /// churn, one one-shot fire date fires exactly once.
  @Test func multiModeTimerChurnKeepsHeapsConsistent() async throws {
    let loop = try RunLoopThread(name: "rrec-timer-churn")
    defer { loop.shutdownAndWait() }
    let modeX = RunLoopMode("rrec-tx")
    let modeY = RunLoopMode("rrec-ty")
    let outcome = try await withWatchdogOnThread(timeout: .seconds(60)) { () -> [String] in
      var problems: [String] = []
      repeatRounds(200) { round in
        let fires = AtomicCounter()
        let timer = LoopTimer(after: .seconds(3600)) { _ in fires.increment() }
        let first = round % 2 == 0 ? modeX : .default
        loop.add(timer, to: first)  // the record's own entry in `first`
        loop.add(timer, to: .default)
        loop.add(timer, to: modeY)
        race([
          {
            for _ in 0..<5 {
              loop.remove(timer, from: modeX)
              loop.add(timer, to: modeX)
            }
          },
          {
            for _ in 0..<5 {
              loop.remove(timer, from: modeY)
              loop.add(timer, to: modeY)
            }
          },
          { for _ in 0..<5 { timer.setFireDate(.now.advanced(by: .seconds(3600))) } },
        ])
        timer.setFireDate(.now.advanced(by: .milliseconds(-1)))
        let fired = waitUntil(timeout: .seconds(5), "the one-shot fire") { fires.current >= 1 }
        // One pass in each of the other modes: the one-shot timer is invalid now.
        _ = try? loop.performAndWait { () in
          loop.run(mode: modeX, until: .now)
          loop.run(mode: modeY, until: .now)
        }
        if !fired || fires.current != 1 { problems.append("round \(round): \(fires.current) fires") }
        if timer.isValid { problems.append("round \(round): a one-shot timer is still valid after firing") }
        timer.invalidate()
      }
      return problems
    }
    #expect(outcome == [])
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
}
