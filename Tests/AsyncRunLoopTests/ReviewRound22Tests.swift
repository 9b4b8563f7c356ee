import Glibc
import Testing

@testable import AsyncRunLoop

// Review round 22: observers kept in one bucket per order (`ModeContents`), a shutdown drain
// past its cap still taking invalidations (`LoopInbox.control`), and a refused add of a member
// already bound to that loop keeping the earlier add (`RunLoopThread.bind`).

/// Counts its own deinits: captured by a member's closures, it tells whether they were released.
private final class R22Token: Sendable {
  let freed: AtomicCounter
  init(_ freed: AtomicCounter) { self.freed = freed }
  deinit { freed.increment() }
}

/// The books of one `CommandSource<Int>` under test (holds nothing of the source).
/// Starts `loop`'s shutdown drain and holds it in a block (performed in a mode the loop never
/// runs, so only the drain runs it); returns the gate that ends the block once the drain is in it.
private func holdDrain(_ loop: RunLoopThread) -> TestGate {
  let inDrain = TestGate()
  let endDrain = TestGate()
  loop.perform(inModes: ["r22-never-run"]) {
    inDrain.open()
    _ = endDrain.wait(timeout: .seconds(20))
  }
  loop.shutdown()
  _ = inDrain.wait(timeout: .seconds(20))
  return endDrain
}

/// Waits until the drain of `loop` refuses changes (its cap, read from the loop).
private func waitForDrainCap(_ loop: RunLoopThread) {
  let cap = loop.shared.inboxLock.withLock { loop.shared.inbox.refusesChangesFrom }
  waitUntil(timeout: .seconds(5), "the drain's cap") { LoopClock.monotonicNanoseconds() > cap }
}

// MARK: - Observers

@Suite("ReviewRound22 observers")
struct ReviewRound22ObserverTests {
  /// What a callout does to other observers when it is told (scripted per notification).
  private enum Act {
    case remove(Int)
    case invalidate(Int)
    case add(Int)
  }

  /// Observers of few and extreme orders (Int.min, Int.max, a crowded order for compaction;
  /// with even seeds also 40 random ones), some one-shot, whose callouts remove, invalidate and add observers of the same and other
  /// orders (emptying buckets and refilling them, removing most of a 40-slot bucket) during the
  /// notification: each notification tells exactly what a model says: the observers in the mode
  /// when it began, by (order, join sequence), but not one that left the mode before its turn;
  /// one that joined during it (or left and joined again) waits for the next.
  @Test(arguments: [UInt64(11), 12, 13, 14])
  func observersAreToldAsTheModelSaysWhileCalloutsChurnThem(seed: UInt64) {
    let problems = EngineTestThread.run { () -> [String] in
      let loop = RunLoopThread.current
      let mode = RunLoopMode("r22-model")
      let keepAlive = LoopTimer(after: .seconds(3_600)) { _ in }
      loop.add(keepAlive, to: mode)
      defer { keepAlive.invalidate() }
      let count = 90
      var generator = IndexedTimerHeapTests.SplitMix64(state: seed)
      var palette = [Int.min, Int.min + 1, -1, 0, 7, 7, 7, 7, 7, 7, Int.max - 1, Int.max]
      if seed % 2 == 0 {  // many distinct orders too (many buckets for the binary search)
        palette += (0..<40).map { _ in Int.random(in: Int.min...Int.max, using: &generator) }
      }
      let told = Guarded<[Int]>([])
      let script = Guarded<[Int: [Act]]>([:])
      let pool = Guarded<[LoopObserver?]>(Array(repeating: nil, count: count))
      var order = [Int](repeating: 0, count: count)
      var oneShot = [Bool](repeating: false, count: count)
      var valid = [Bool](repeating: false, count: count)
      var joined: [Int: Int] = [:]  // the model: id -> join sequence
      var sequence = 0
      var problems: [String] = []

      func make(_ id: Int) {
        order[id] = palette.randomElement(using: &generator)!
        oneShot[id] = Int.random(in: 0..<8, using: &generator) == 0
        valid[id] = true
        let observer = LoopObserver(activities: .entry, repeats: !oneShot[id], order: order[id]) { _, _ in
          told.withLock { $0.append(id) }
          for act in script.withLock({ $0[id] ?? [] }) {
            let others = pool.snapshot
            switch act {
            case .remove(let other): if let target = others[other] { loop.remove(target, from: mode) }
            case .invalidate(let other): others[other]?.invalidate()
            case .add(let other): if let target = others[other] { loop.add(target, to: mode) }
            }
          }
        }
        pool.withLock { $0[id] = observer }
      }
      for id in 0..<count { make(id) }

      for step in 0..<120 {
        // Churn between notifications.
        for _ in 0..<12 {
          let id = Int.random(in: 0..<count, using: &generator)
          if !valid[id] { make(id) }
          guard let observer = pool.snapshot[id] else { continue }
          if joined[id] == nil {
            loop.add(observer, to: mode)
            sequence += 1
            joined[id] = sequence
          } else if Bool.random(using: &generator) {
            loop.remove(observer, from: mode)
            joined[id] = nil
          }
        }
        // This notification's script.
        var acts: [Int: [Act]] = [:]
        for id in joined.keys.sorted() where Int.random(in: 0..<4, using: &generator) == 0 {
          acts[id] = (0..<Int.random(in: 1...3, using: &generator)).map { _ -> Act in
            let other = Int.random(in: 0..<count, using: &generator)
            switch Int.random(in: 0..<5, using: &generator) {
            case 0, 1: return .remove(other)
            case 2: return .invalidate(other)
            default: return .add(other)
            }
          }
        }
        if step % 7 == 0, let first = joined.min(by: { (order[$0.key], $0.value) < (order[$1.key], $1.value) }) {
          // The first one told empties most of the crowded bucket and refills part of it.
          let crowded = joined.keys.filter { order[$0] == 7 && $0 != first.key }.sorted()
          acts[first.key] = crowded.dropLast(3).map { Act.remove($0) } + crowded.prefix(4).map { Act.add($0) }
        }
        // The model.
        var expected: [Int] = []
        let snapshot = joined.sorted { (order[$0.key], $0.value) < (order[$1.key], $1.value) }
        for (id, joinedAs) in snapshot {
          guard joined[id] == joinedAs, valid[id] else { continue }
          expected.append(id)
          for act in acts[id] ?? [] {
            switch act {
            case .remove(let other): joined[other] = nil
            case .invalidate(let other):
              joined[other] = nil
              valid[other] = false
            case .add(let other):
              if valid[other] && joined[other] == nil {
                sequence += 1
                joined[other] = sequence
              }
            }
          }
          if oneShot[id] {
            joined[id] = nil
            valid[id] = false
          }
        }
        script.withLock { $0 = acts }
        told.withLock { $0.removeAll() }
        _ = loop.run(mode: mode, until: .now)
        script.withLock { $0 = [:] }
        let got = told.snapshot
        if got != expected, problems.count < 3 {
          problems.append("step \(step): told \(got), expected \(expected)")
        }
        // Sync the model's validity with the members (an add of an invalidated one is a no-op).
        for id in 0..<count where valid[id] != (pool.snapshot[id]?.isValid ?? false) {
          if problems.count < 3 { problems.append("step \(step): observer \(id) validity differs from the model") }
          valid[id] = pool.snapshot[id]?.isValid ?? false
        }
      }
      for observer in pool.snapshot { observer?.invalidate() }
      return problems
    }
    #expect(problems == [])
  }

  /// 40 observers of one order in two modes: a callout in mode A removes 30 of them from A (the
  /// bucket compacts mid-notification and renumbers A's slots only). Later removals from A and
  /// from B, by the slots each mode keeps, take out exactly those observers.
  @Test func compactionInOneModeLeavesTheOtherModesSlotsRight() {
    let result = EngineTestThread.run { () -> [[Int]] in
      let loop = RunLoopThread.current
      let (modeA, modeB) = (RunLoopMode("r22-a"), RunLoopMode("r22-b"))
      let keepAlive = LoopTimer(after: .seconds(3_600)) { _ in }
      loop.add(keepAlive, to: modeA)
      loop.add(keepAlive, to: modeB)
      let told = Guarded<[Int]>([])
      let pool = Guarded<[LoopObserver]>([])
      let firstTime = Guarded(true)
      let observers = (0..<40).map { id in
        LoopObserver(activities: .entry, order: 5) { _, _ in
          told.withLock { $0.append(id) }
          guard id == 0,
            firstTime.withLock({ value in
              defer { value = false }
              return value
            })
          else { return }
          for other in pool.snapshot[1...30] { loop.remove(other, from: modeA) }
        }
      }
      pool.withLock { $0 = observers }
      for observer in observers { loop.add(observer, to: modeA) }
      for observer in observers.reversed() { loop.add(observer, to: modeB) }
      var runs: [[Int]] = []
      func run(_ mode: RunLoopMode) {
        told.withLock { $0.removeAll() }
        _ = loop.run(mode: mode, until: .now)
        runs.append(told.snapshot)
      }
      run(modeA)  // 0 removes 1...30: told 0, 31...39
      run(modeB)  // every one, in B's join order
      for id in [31, 35, 39] { loop.remove(observers[id], from: modeA) }
      for id in [0, 2, 31, 38] { loop.remove(observers[id], from: modeB) }
      run(modeA)
      run(modeB)
      for observer in observers { observer.invalidate() }
      keepAlive.invalidate()
      return runs
    }
    #expect(result.count == 4)
    guard result.count == 4 else { return }
    #expect(result[0] == [0] + Array(31...39))
    #expect(result[1] == Array((0..<40).reversed()))
    #expect(result[2] == [0, 32, 33, 34, 36, 37, 38])
    #expect(result[3] == Array((0..<40).reversed()).filter { ![0, 2, 31, 38].contains($0) })
  }

  /// An order's bucket emptied by an earlier callout and refilled in the same notification (a
  /// new observer and a removed one added again): neither is told until the next notification,
  /// and later orders are still told.
  @Test func aBucketEmptiedAndRefilledMidNotificationWaitsForTheNext() {
    let runs = EngineTestThread.run { () -> [[String]] in
      let loop = RunLoopThread.current
      let mode = RunLoopMode("r22-refill")
      let keepAlive = LoopTimer(after: .seconds(3_600)) { _ in }
      loop.add(keepAlive, to: mode)
      let told = Guarded<[String]>([])
      let box = Guarded<[String: LoopObserver]>([:])
      func observer(_ name: String, _ order: Int, _ act: (@Sendable () -> Void)? = nil) -> LoopObserver {
        let acted = Guarded(false)
        let observer = LoopObserver(activities: .entry, order: order) { _, _ in
          told.withLock { $0.append(name) }
          if let act,
            !acted.withLock({ value in
              defer { value = true }
              return value
            })
          {
            act()
          }
        }
        box.withLock { $0[name] = observer }
        return observer
      }
      let late = observer("w", 1)
      let first = observer("c", Int.min) {
        let all = box.snapshot
        loop.remove(all["x1"]!, from: mode)
        loop.remove(all["x2"]!, from: mode)
        loop.add(late, to: mode)
        loop.add(all["x1"]!, to: mode)
      }
      let others = [observer("x1", 1), observer("x2", 1), observer("y", 2), observer("z", Int.max)]
      for member in [others[3], others[2], first, others[0], others[1]] { loop.add(member, to: mode) }
      var runs: [[String]] = []
      for _ in 0..<2 {
        told.withLock { $0.removeAll() }
        _ = loop.run(mode: mode, until: .now)
        runs.append(told.snapshot)
      }
      for member in box.snapshot.values { member.invalidate() }
      keepAlive.invalidate()
      return runs
    }
    #expect(runs == [["c", "y", "z"], ["c", "w", "x1", "y", "z"]])
  }

  /// "An observer removed by an earlier callout of the same notification is not told; one added
  /// during a notification is told from the next." An observer in two modes (so it stays on the
  /// loop, with the same record) is removed from the running mode and added to it again by an
  /// earlier callout of that mode's notification: it was removed before its turn and joined
  /// during the notification, so it must not be told in it.
  ///
  /// Failed every run before the fix (deterministic, 5 of 5): told [["c", "x"], ["c", "x"]].
  /// `notifyObservers` skipped only records no longer `isIn` the mode; this record rejoined (same
  /// record, new slot at the end of its bucket) and was told at its old slot of the
  /// notification's copy. (The flat list before the bucket change had the same check.) Now a
  /// record is told only at the slot it still holds, and slots keep their numbers while a
  /// notification runs.
  @Test
  func anObserverRemovedAndAddedAgainByAnEarlierCalloutIsNotToldInThatNotification() {
    let runs = EngineTestThread.run { () -> [[String]] in
      let loop = RunLoopThread.current
      let (mode, other) = (RunLoopMode("r22-readd"), RunLoopMode("r22-readd-other"))
      let keepAlive = LoopTimer(after: .seconds(3_600)) { _ in }
      loop.add(keepAlive, to: mode)
      let told = Guarded<[String]>([])
      let victim = LoopObserver(activities: .entry, order: 1) { _, _ in told.withLock { $0.append("x") } }
      let acted = Guarded(false)
      let first = LoopObserver(activities: .entry, order: 0) { _, _ in
        told.withLock { $0.append("c") }
        guard
          !acted.withLock({ value in
            defer { value = true }
            return value
          })
        else { return }
        loop.remove(victim, from: mode)
        loop.add(victim, to: mode)
      }
      loop.add(victim, to: other)
      loop.add(victim, to: mode)
      loop.add(first, to: mode)
      var runs: [[String]] = []
      for _ in 0..<2 {
        told.withLock { $0.removeAll() }
        _ = loop.run(mode: mode, until: .now)
        runs.append(told.snapshot)
      }
      victim.invalidate()
      first.invalidate()
      keepAlive.invalidate()
      return runs
    }
    #expect(runs == [["c"], ["c", "x"]])
  }

  /// Observers in `.common` (orders Int.min and Int.max) and one added to mode M by name (Int.max):
  /// a callout in M adds M to the common modes mid-notification. The common ones join M then:
  /// told from the next notification, the named one (which joined M first) before the common
  /// one of its order.
  @Test func commonObserversJoiningAModeMidNotificationAreToldFromTheNext() {
    let runs = EngineTestThread.run { () -> [[String]] in
      let loop = RunLoopThread.current
      let mode = RunLoopMode("r22-joins-common")
      let keepAlive = LoopTimer(after: .seconds(3_600)) { _ in }
      loop.add(keepAlive, to: mode)
      let told = Guarded<[String]>([])
      func observer(_ name: String, _ order: Int) -> LoopObserver {
        LoopObserver(activities: .entry, order: order) { _, _ in told.withLock { $0.append(name) } }
      }
      let (low, high, named) = (observer("p", Int.min), observer("q", Int.max), observer("r", Int.max))
      let acted = Guarded(false)
      let joiner = LoopObserver(activities: .entry, order: -1) { _, _ in
        told.withLock { $0.append("c") }
        if !acted.withLock({ value in
          defer { value = true }
          return value
        }) {
          loop.addModeToCommonModes(mode)
        }
      }
      loop.add(high, to: .common)
      loop.add(low, to: .common)
      loop.add(named, to: mode)
      loop.add(joiner, to: mode)
      var runs: [[String]] = []
      for _ in 0..<2 {
        told.withLock { $0.removeAll() }
        _ = loop.run(mode: mode, until: .now)
        runs.append(told.snapshot)
      }
      for member in [low, high, named, joiner] { member.invalidate() }
      keepAlive.invalidate()
      return runs
    }
    #expect(runs == [["c", "r"], ["p", "c", "r", "q"]])
  }

  /// 50 one-shot observers of one order (each invalidates itself after its callout: the bucket
  /// compacts while the notification iterates it) and two repeating ones: each one-shot is told
  /// exactly once, the repeating ones every time, in order.
  @Test func oneShotObserversCompactingTheirBucketMidNotificationAreEachToldOnce() {
    let runs = EngineTestThread.run { () -> [[Int]] in
      let loop = RunLoopThread.current
      let mode = RunLoopMode("r22-oneshots")
      let keepAlive = LoopTimer(after: .seconds(3_600)) { _ in }
      loop.add(keepAlive, to: mode)
      let told = Guarded<[Int]>([])
      var members: [LoopObserver] = []
      for id in 0..<50 {
        members.append(
          LoopObserver(activities: .entry, repeats: false, order: 3) { _, _ in told.withLock { $0.append(id) } })
      }
      members.append(LoopObserver(activities: .entry, order: 3) { _, _ in told.withLock { $0.append(100) } })
      members.append(LoopObserver(activities: .entry, order: Int.max) { _, _ in told.withLock { $0.append(200) } })
      for member in members { loop.add(member, to: mode) }
      var runs: [[Int]] = []
      for _ in 0..<3 {
        told.withLock { $0.removeAll() }
        _ = loop.run(mode: mode, until: .now)
        runs.append(told.snapshot)
      }
      runs.append([members.filter(\.isValid).count])
      for member in members { member.invalidate() }
      keepAlive.invalidate()
      return runs
    }
    #expect(runs == [Array(0..<50) + [100, 200], [100, 200], [100, 200], [2]])
  }

  /// A callout runs the loop nested in the same mode: the nested notification tells the others
  /// but not the caller; an observer that a nested callout removed is not told by the outer
  /// notification either.
  @Test func aRunNestedInACalloutTellsTheOthersAndItsRemovalsHoldOutside() {
    let runs = EngineTestThread.run { () -> [[String]] in
      let loop = RunLoopThread.current
      let mode = RunLoopMode("r22-nested")
      let keepAlive = LoopTimer(after: .seconds(3_600)) { _ in }
      loop.add(keepAlive, to: mode)
      let told = Guarded<[String]>([])
      let victim = LoopObserver(activities: .entry, order: 2) { _, _ in told.withLock { $0.append("d") } }
      let removerActed = Guarded(false)
      let remover = LoopObserver(activities: .entry, order: 1) { _, _ in
        told.withLock { $0.append("b") }
        if !removerActed.withLock({ value in
          defer { value = true }
          return value
        }) {
          loop.remove(victim, from: mode)
        }
      }
      let nesterActed = Guarded(false)
      let nester = LoopObserver(activities: .entry, order: 0) { _, _ in
        told.withLock { $0.append("a") }
        if !nesterActed.withLock({ value in
          defer { value = true }
          return value
        }) {
          _ = loop.run(mode: mode, until: .now)
        }
      }
      for member in [victim, remover, nester] { loop.add(member, to: mode) }
      var runs: [[String]] = []
      for _ in 0..<2 {
        told.withLock { $0.removeAll() }
        _ = loop.run(mode: mode, until: .now)
        runs.append(told.snapshot)
      }
      for member in [victim, remover, nester] { member.invalidate() }
      keepAlive.invalidate()
      return runs
    }
    #expect(runs == [["a", "b", "b"], ["a", "b"]])
  }

  /// A callout moves a later observer to another loop: it is not told here in this notification
  /// (nor later), and is told on the other loop's thread.
  @Test func anObserverMovedToAnotherLoopByAnEarlierCalloutIsToldThereOnly() async throws {
    let other = try RunLoopThread(name: "r22-obs-move")
    let result = try await withWatchdogOnThread(timeout: .seconds(20), "observer moved") { () -> (Int, Bool) in
      defer { other.shutdownAndWait() }
      return EngineTestThread.run { () -> (Int, Bool) in
        let loop = RunLoopThread.current
        let mode = RunLoopMode("r22-move")
        let keepAlive = LoopTimer(after: .seconds(3_600)) { _ in }
        loop.add(keepAlive, to: mode)
        let toldHere = AtomicCounter()
        let toldThere = AtomicCounter()
        let moved = LoopObserver(activities: [.entry, .beforeTimers, .afterWaiting], order: 5) { _, _ in
          if other.isOnLoopThread { toldThere.increment() } else { toldHere.increment() }
        }
        let mover = LoopObserver(activities: .entry, order: 4) { _, _ in
          guard moved.isBound(to: loop.shared) else { return }
          loop.remove(moved, from: mode)
          other.add(moved, to: .default)
        }
        loop.add(mover, to: mode)
        loop.add(moved, to: mode)
        _ = loop.run(mode: mode, until: .now)
        _ = loop.run(mode: mode, until: .now)
        other.wakeUp()
        let toldOnOther = waitUntil(timeout: .seconds(10), "told on the other loop") {
          other.wakeUp()
          return toldThere.current > 0
        }
        moved.invalidate()
        mover.invalidate()
        keepAlive.invalidate()
        return (toldHere.current, toldOnOther)
      }
    }
    guard let (toldHere, toldOnOther) = result else { return }
    #expect(toldHere == 0)
    #expect(toldOnOther)
  }
}

// MARK: - Shutdown drain past its cap

@Suite("ReviewRound22 drain")
struct ReviewRound22DrainTests {
  /// 24 command sources removed from L (holding commands posted since) and 12 added to L during
  /// its drain (accepted, waiting for the next round), all invalidated from 6 threads at once
  /// past the drain's cap while a drain block runs: every invalidation is taken, each source
  /// schedules and cancels once, every command is delivered once, nothing is dropped, and
  /// `shutdownAndWait` returns.
  @Test func invalidationsFromManyThreadsPastTheCapAreAllDelivered() async throws {
    let loop = try RunLoopThread(name: "r22-many")
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "many invalidations") {
      () -> (addsAccepted: Bool, tallies: [CommandTally]) in
      let books = (0..<36).map { _ in CommandBooks() }
      let sources = books.map { $0.makeSource() }
      for index in 0..<24 { loop.add(sources[index].source) }
      waitUntil { books[0..<24].allSatisfy { $0.schedules.current == 1 } }
      for index in 0..<24 { loop.remove(sources[index].source) }
      waitUntil { books[0..<24].allSatisfy { $0.cancels.current == 1 } }
      for index in 0..<36 {
        for command in 0..<3 { books[index].post(sources[index], command) }
      }
      let endDrain = holdDrain(loop)
      for index in 24..<36 { loop.add(sources[index].source, to: .default) }
      let addsAccepted = sources[24...].allSatisfy { $0.source.isValid }
      waitForDrainCap(loop)
      let invalidators: [@Sendable () -> Void] = (0..<6).map { thread in
        { for index in stride(from: thread, to: 36, by: 6) { sources[index].source.invalidate() } }
      }
      race(invalidators)
      endDrain.open()
      loop.shutdownAndWait()
      return (addsAccepted, (0..<36).map { CommandTally(books[$0], sources[$0]) })
    }
    guard let outcome else { return }
    #expect(outcome.addsAccepted, "setup: the adds in the drain were refused")
    for (index, tally) in outcome.tallies.enumerated() {
      #expect(tally.delivered == [0, 1, 2] && tally.dropped == 0 && tally.pending == 0, "source \(index): \(tally)")
      #expect(tally.schedules == 1 && tally.cancels == 1, "source \(index): \(tally)")
    }
  }

  /// Invalidations racing the end of the drain (no held block: the drain ends as soon as it is
  /// idle). A source removed from L before may be delivered there (invalidation taken) or
  /// dropped (refused: L terminated), never both, never twice; a source added to L during the
  /// drain is either scheduled, delivered and cancelled, or (its add refused) never scheduled and
  /// dropped; one added, removed and invalidated meanwhile delivers or drops each command once.
  @Test func invalidationsRacingTheEndOfTheDrainNeitherLoseNorDuplicate() async throws {
    let failures = try await withWatchdogOnThread(timeout: .seconds(30), "end-of-drain races") { () -> [String] in
      var failures: [String] = []
      repeatRounds(60 * stressFactor, budget: .milliseconds(1500)) { round in
        guard let loop = try? RunLoopThread(name: "r22-end") else { return }
        let removedBooks = CommandBooks()
        let removed = removedBooks.makeSource()
        loop.add(removed.source)
        waitUntil { removedBooks.schedules.current == 1 }
        loop.remove(removed.source)
        waitUntil { removedBooks.cancels.current == 1 }
        let addedBooks = CommandBooks()
        let added = addedBooks.makeSource()
        let bouncedBooks = CommandBooks()
        let bounced = bouncedBooks.makeSource()
        for command in 0..<3 {
          removedBooks.post(removed, command)
          addedBooks.post(added, command)
          bouncedBooks.post(bounced, command)
        }
        race([
          { loop.shutdown() },
          {
            usleep(UInt32(round % 6) * 40)
            loop.add(added.source)
            added.source.invalidate()
          },
          {
            usleep(UInt32(round % 4) * 60)
            removed.source.invalidate()
          },
          {
            usleep(UInt32(round % 5) * 50)
            loop.add(bounced.source)
            loop.remove(bounced.source)
            bounced.source.invalidate()
          },
        ])
        loop.shutdownAndWait()
        let (removedTally, addedTally) = (CommandTally(removedBooks, removed), CommandTally(addedBooks, added))
        let removedOK =
          removedTally.balances && removedTally.pending == 0
          && (removedTally.delivered == [0, 1, 2] || removedTally.dropped == 3)
        let addedOK =
          addedTally.balances && addedTally.pending == 0
          && ((addedTally.delivered == [0, 1, 2] && addedTally.schedules == 1)
            || (addedTally.dropped == 3 && addedTally.schedules == 0))
        if !removedOK, failures.count < 3 { failures.append("round \(round) removed: \(removedTally)") }
        if !addedOK, failures.count < 3 { failures.append("round \(round) added: \(addedTally)") }
        let bouncedTally = CommandTally(bouncedBooks, bounced)
        if !(bouncedTally.balances && bouncedTally.pending == 0), failures.count < 3 {
          failures.append("round \(round) bounced: \(bouncedTally)")
        }
      }
      return failures
    }
    #expect(failures == [])
  }

  /// Past the cap, while a drain block runs, 4 threads keep adding new command sources to L
  /// (refused: each is invalidated with nothing to deliver on) and invalidating 200 sources that
  /// were on L; they go on after the block ends, until `shutdownAndWait` returned: the drain is
  /// not held open, the sources that were on L are delivered, and the refused ones drop exactly
  /// what they held.
  @Test func threadsHammeringPastTheCapCannotHoldTheDrainOpen() async throws {
    let loop = try RunLoopThread(name: "r22-hammer")
    let result = try await withWatchdogOnThread(timeout: .seconds(20), "hammered drain") {
      () -> (onLoop: [CommandTally], refusedBalance: Bool, refusedScheduled: Int) in
      let books = (0..<200).map { _ in CommandBooks() }
      let sources = books.map { $0.makeSource() }
      for source in sources { loop.add(source.source) }
      waitUntil { books.allSatisfy { $0.schedules.current == 1 } }
      for source in sources { loop.remove(source.source) }
      waitUntil { books.allSatisfy { $0.cancels.current == 1 } }
      for (index, source) in sources.enumerated() { books[index].post(source, 0) }
      let endDrain = holdDrain(loop)
      waitForDrainCap(loop)
      let done = TestGate()
      let next = AtomicCounter()
      let invalidated = AtomicCounter()
      let refusedBooks = CommandBooks()
      let refusedDropped = AtomicCounter()
      let threads = (0..<4).map { _ in
        startThread {
          while !done.opened {
            let index = next.increment() - 1
            if index < 200 {
              sources[index].source.invalidate()
              invalidated.increment()
            }
            let fresh = refusedBooks.makeSource()
            refusedBooks.post(fresh, 0)
            loop.add(fresh.source, to: index % 2 == 0 ? RunLoopMode.default : RunLoopMode("r22-other"))
            fresh.source.invalidate()
            for _ in 0..<fresh.droppedCount { refusedDropped.increment() }
            usleep(20)
          }
        }
      }
      waitUntil(timeout: .seconds(5), "the hammer's invalidations") { invalidated.current == 200 }
      endDrain.open()
      loop.shutdownAndWait()
      done.open()
      for thread in threads { joinThread(thread) }
      for source in sources { source.source.invalidate() }
      return (
        (0..<200).map { CommandTally(books[$0], sources[$0]) },
        refusedBooks.accepted.current == refusedDropped.current, refusedBooks.schedules.current
      )
    }
    guard let result else { return }
    let wrong = result.onLoop.enumerated().filter { !($0.element.delivered == [0] && $0.element.balances) }
    #expect(wrong.isEmpty, "\(wrong.prefix(3).map { "source \($0.offset): \($0.element)" })")
    #expect(result.refusedBalance)
    #expect(result.refusedScheduled == 0)
  }

  /// A command source added to L during its drain (accepted, waiting) and removed past the cap
  /// (refused: the binding lets go at once, L still applies the add), then added to an active
  /// loop L2 with commands posted before and after: L schedules and cancels it once, L2 delivers
  /// every command once, in order, and after its invalidation on L2 schedules and cancels pair up.
  @Test func aRemovalRefusedPastTheCapThenAMoveDeliversEverythingOnTheNewLoop() async throws {
    let loop = try RunLoopThread(name: "r22-refrm")
    let next = try RunLoopThread(name: "r22-refrm2")
    let result = try await withWatchdogOnThread(timeout: .seconds(20), "refused removal, then move") {
      () -> (addAccepted: Bool, beforeInvalidation: CommandTally, atEnd: CommandTally) in
      let books = CommandBooks()
      let commands = books.makeSource()
      let endDrain = holdDrain(loop)
      loop.add(commands.source, to: .default)
      let addAccepted = commands.source.isValid
      waitForDrainCap(loop)
      loop.remove(commands.source, from: .default)
      for command in 0..<3 { books.post(commands, command) }
      next.add(commands.source, to: .default)
      for command in 3..<6 { books.post(commands, command) }
      endDrain.open()
      loop.shutdownAndWait()
      waitUntil(timeout: .seconds(10), "delivery on the new loop") { books.delivered.snapshot.count >= 6 }
      let before = CommandTally(books, commands)
      commands.source.invalidate()
      next.shutdownAndWait()
      return (addAccepted, before, CommandTally(books, commands))
    }
    guard let result else { return }
    #expect(result.addAccepted, "setup: the add in the drain was refused")
    #expect(result.beforeInvalidation.delivered == Array(0..<6), "\(result.beforeInvalidation)")
    #expect(result.atEnd.delivered == Array(0..<6) && result.atEnd.dropped == 0, "\(result.atEnd)")
    #expect(result.atEnd.schedules == 2 && result.atEnd.cancels == 2, "\(result.atEnd)")
  }
}

// MARK: - Refused adds of members bound to that loop

@Suite("ReviewRound22 refused adds")
struct ReviewRound22RefusedAddTests {
  /// One member of every kind, with books of its callouts and a token its closures hold.
  private final class Members: Sendable {
    let freed: AtomicCounter
    let books: CommandBooks
    let plainSchedules: AtomicCounter
    let plainCancels: AtomicCounter
    let commands: CommandSource<Int>
    let plain: InputSource
    let timer: LoopTimer
    let observer: LoopObserver
    let readiness: DescriptorSource
    let pipe: (read: Int32, write: Int32)

    init() {
      let (freed, plainSchedules, plainCancels) = (AtomicCounter(), AtomicCounter(), AtomicCounter())
      let books = CommandBooks()
      self.freed = freed
      self.plainSchedules = plainSchedules
      self.plainCancels = plainCancels
      self.books = books
      pipe = makePipe()
      commands = books.makeSource(token: R22Token(freed))
      let plainToken = R22Token(freed)
      plain = InputSource(
        schedule: { _, _, _ in
          withExtendedLifetime(plainToken) {}
          plainSchedules.increment()
        },
        cancel: { _, _ in plainCancels.increment() }, perform: { _ in })
      let timerToken = R22Token(freed)
      timer = LoopTimer(after: .seconds(3_600)) { _ in withExtendedLifetime(timerToken) {} }
      let observerToken = R22Token(freed)
      observer = LoopObserver(activities: .all) { _, _ in withExtendedLifetime(observerToken) {} }
      let readinessToken = R22Token(freed)
      readiness = DescriptorSource(descriptor: pipe.read) { _, _ in withExtendedLifetime(readinessToken) {} }
      for command in 0..<3 { books.post(commands, command) }
    }

    static let tokens = 5

    func add(to loop: RunLoopThread, _ mode: RunLoopMode) {
      loop.add(commands.source, to: mode)
      loop.add(plain, to: mode)
      loop.add(timer, to: mode)
      loop.add(observer, to: mode)
      try? loop.add(readiness, to: mode)
    }

    var validity: [Bool] {
      [commands.source.isValid, plain.isValid, timer.isValid, observer.isValid, readiness.isValid]
    }

    func closePipe() {
      close(pipe.read)
      close(pipe.write)
    }
  }

  /// What the refused-add tests check, as plain values.
  private struct Outcome: Sendable {
    /// The first adds were accepted (the members still valid after them): the setup worked.
    var firstAddsAccepted: Bool
    var validAfterRefusal: [Bool]
    var commands: CommandTally
    var plainSchedules: Int
    var plainCancels: Int
    var onOtherLoop: Int
    var leakedMembers: Int
    var leakedLoop: Bool
    var tokensFreed: Int
  }

  /// Adds the members to another loop (a no-op for invalidated members), checks how many modes
  /// hold them there, then drops every strong reference and reports what is still alive.
  private static func finish(_ members: Members, firstAccepted: Bool, validAfterRefusal: [Bool]) -> Outcome {
    var outcome = Outcome(
      firstAddsAccepted: firstAccepted, validAfterRefusal: validAfterRefusal,
      commands: CommandTally(members.books, members.commands),
      plainSchedules: members.plainSchedules.current, plainCancels: members.plainCancels.current,
      onOtherLoop: -1, leakedMembers: 0, leakedLoop: false, tokensFreed: 0)
    if let other = try? RunLoopThread(name: "r22-other-loop") {
      members.add(to: other, .default)
      outcome.onOtherLoop =
        (try? other.performAndWait {
          other.core.modeCount(of: members.commands.source) + other.core.modeCount(of: members.plain)
            + other.core.modeCount(of: members.timer) + other.core.modeCount(of: members.observer)
            + other.core.modeCount(of: members.readiness)
        }) ?? -1
      other.shutdownAndWait()
    }
    return outcome
  }

  /// Runs `scenario` (which makes the loop and the members and returns its outcome with the
  /// members), then drops them and counts what survived.
  private static func measure(
    _ scenario: () -> (Outcome, Members, RunLoopThread)
  ) -> Outcome {
    weak var weakLoop: RunLoopThread?
    weak var weakCommands: CommandSource<Int>?
    weak var weakPlain: InputSource?
    weak var weakTimer: LoopTimer?
    weak var weakObserver: LoopObserver?
    weak var weakReadiness: DescriptorSource?
    let freed: AtomicCounter
    var outcome: Outcome
    do {
      let (result, members, loop) = scenario()
      outcome = result
      freed = members.freed
      weakLoop = loop
      weakCommands = members.commands
      weakPlain = members.plain
      weakTimer = members.timer
      weakObserver = members.observer
      weakReadiness = members.readiness
      members.closePipe()
    }
    outcome.leakedLoop = weakLoop != nil
    outcome.leakedMembers =
      [
        weakCommands != nil, weakPlain != nil, weakTimer != nil, weakObserver != nil, weakReadiness != nil,
      ].filter { $0 }.count
    outcome.tokensFreed = freed.current
    return outcome
  }

  private static func check(_ outcome: Outcome, sourceLocation: SourceLocation = #_sourceLocation) {
    #expect(outcome.firstAddsAccepted, "setup: the first adds were refused", sourceLocation: sourceLocation)
    #expect(outcome.validAfterRefusal == [false, false, false, false, false], sourceLocation: sourceLocation)
    #expect(
      outcome.commands.delivered == [0, 1, 2] && outcome.commands.dropped == 0 && outcome.commands.pending == 0,
      "\(outcome.commands)", sourceLocation: sourceLocation)
    #expect(
      outcome.commands.schedules == 1 && outcome.commands.cancels == 1, "\(outcome.commands)",
      sourceLocation: sourceLocation)
    #expect(outcome.plainSchedules == 1 && outcome.plainCancels == 1, sourceLocation: sourceLocation)
    #expect(outcome.onOtherLoop == 0, sourceLocation: sourceLocation)
    #expect(outcome.leakedMembers == 0 && !outcome.leakedLoop, sourceLocation: sourceLocation)
    #expect(outcome.tokensFreed == Members.tokens, sourceLocation: sourceLocation)
  }

  /// Every kind is added to mode A of L during its drain (accepted, applied in the next round),
  /// then, past the drain's cap, to mode B (refused): each ends invalidated at once; the accepted
  /// add still schedules and cancels the sources (the command source delivers what it held,
  /// drops nothing); afterwards an add to another loop is a no-op; once the test lets go, no
  /// member, closure or loop is left alive.
  @Test func aSecondModeAddPastTheCapInvalidatesEveryKindAndKeepsTheFirstAdd() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "second-mode adds past the cap") {
      () -> Outcome in
      Self.measure { () -> (Outcome, Members, RunLoopThread) in
        let loop = try! RunLoopThread(name: "r22-refused")
        let members = Members()
        let endDrain = holdDrain(loop)
        members.add(to: loop, "r22-a")
        let firstAccepted = members.validity.allSatisfy { $0 }
        waitForDrainCap(loop)
        members.add(to: loop, "r22-b")
        let valid = members.validity
        endDrain.open()
        loop.shutdownAndWait()
        return (Self.finish(members, firstAccepted: firstAccepted, validAfterRefusal: valid), members, loop)
      }
    }
    guard let outcome else { return }
    Self.check(outcome)
  }

  /// The terminated case: L's drain has terminated and its last application of changes is
  /// applying the adds it accepted (a first source's schedule routine holds it there). Every
  /// kind, accepted into mode A before, is now added to mode B: refused (terminated), but the
  /// member is still bound to L with that add on its way. Each ends invalidated; the accepted add
  /// is applied afterwards with the routines intact: the command source is scheduled, delivers
  /// its commands and is cancelled; nothing leaks.
  @Test func aSecondModeAddToATerminatedLoopStillApplyingTheFirstKeepsIt() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "second-mode adds at termination") {
      () -> (Outcome, Int, Int) in
      let holderSchedules = AtomicCounter()
      let holderCancels = AtomicCounter()
      let outcome = Self.measure { () -> (Outcome, Members, RunLoopThread) in
        let loop = try! RunLoopThread(name: "r22-terminated")
        let members = Members()
        let heldAfterTermination = TestGate()
        let release = TestGate()
        let holder = InputSource(
          schedule: { _, loop, _ in
            holderSchedules.increment()
            let terminated = loop.shared.inboxLock.withLock { loop.shared.inbox.lifecycle == .terminated }
            guard terminated else { return }
            heldAfterTermination.open()
            _ = release.wait(timeout: .seconds(10))
          },
          cancel: { _, _ in holderCancels.increment() }, perform: { _ in })
        // Held in a job of the drain round's second batch (a job the first batch enqueued):
        // what arrives meanwhile is collected only after the loop terminated.
        let inJob = TestGate()
        let endJob = TestGate()
        loop.perform(inModes: ["r22-never-run"]) {
          Task(executorPreference: loop) {
            Task(executorPreference: loop) {
              inJob.open()
              _ = endJob.wait(timeout: .seconds(20))
            }
          }
        }
        loop.shutdown()
        _ = inJob.wait(timeout: .seconds(20))
        loop.add(holder, to: "r22-a")
        members.add(to: loop, "r22-a")
        let firstAccepted = holder.isValid && members.validity.allSatisfy { $0 }
        waitForDrainCap(loop)
        endJob.open()
        var valid: [Bool] = []
        if heldAfterTermination.wait(timeout: .seconds(10)) {
          members.add(to: loop, "r22-b")
          valid = members.validity
        }
        release.open()
        loop.shutdownAndWait()
        holder.invalidate()
        return (Self.finish(members, firstAccepted: firstAccepted, validAfterRefusal: valid), members, loop)
      }
      return (outcome, holderSchedules.current, holderCancels.current)
    }
    guard let (outcome, holderSchedules, holderCancels) = outcome else { return }
    #expect(holderSchedules == 1 && holderCancels == 1)
    Self.check(outcome)
  }
}
