import Glibc
import Testing

@_spi(Testing) @testable import AsyncRunLoop

// Review round 14 (surface): the async sequences (buffering, consumer cancellation, the member
// ending from another thread or by the loop's shutdown, leaks), the executor (actors pinned to a
// loop, sleeps, the fallback after termination, runModal, performAndWait cycles, LoopGroup) and
// runOnMain off the main thread. Blocking work runs on threads of the tests' own; results are
// checked after the watchdog returns.

private let r14sModeA: RunLoopMode = "r14s-a"
private let r14sModeB: RunLoopMode = "r14s-b"

/// An object to watch with a weak reference.
private final class R14SToken: Sendable {}

/// A weak reference readable from any thread (the runtime loads and zeroes weak references
/// atomically).
private final class R14SWeak: @unchecked Sendable {  // Safety: only a weak reference, set in init
  weak var value: AnyObject?
  init(_ value: AnyObject) { self.value = value }
  var isGone: Bool { value == nil }
}

/// One element of a multi-producer test.
private struct R14SItem: Sendable {
  let producer: Int
  let index: Int
}

/// Whether the single consumer of `storage` is suspended in `next()`.
private func r14sIsWaiting<S: SingleConsumerStorage>(_ storage: S) -> Bool {
  storage.lock.withLock {
    switch storage.machine.lifecycle.state {
    case .consumerWaiting, .closing(consumer: .some): return true
    default: return false
    }
  }
}

/// Polls `condition` every millisecond without blocking a pool thread; false after `timeout`.
private func r14sPoll(timeout: Duration = .seconds(10), _ condition: @Sendable () -> Bool) async -> Bool {
  let deadline = ContinuousClock.now.advanced(by: timeout * watchdogScale)
  while !condition() {
    if ContinuousClock.now >= deadline { return false }
    try? await Task.sleep(for: .milliseconds(1))
  }
  return true
}

// MARK: - Source sequences

@Suite("ReviewRound14Surface: source and signal sequences", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound14SurfaceSourceTests {
  /// Promised: every accepted element is delivered exactly once and in order per producer. Three
  /// async producers `send` into a `.bounded(3)` buffer (suspending while it is full) while two
  /// plain threads `post` (retrying on `.full`); the consumer prefers the loop. After everything
  /// was sent, `invalidate()` ends the sequence once the accepted elements are delivered.
  @Test func boundedSendAndPostFromManyProducersDeliverEachElementOnceInOrder() async throws {
    let perProducer = 400
    let outcome = try await withWatchdog(timeout: .seconds(40), "many producers") {
      () async throws -> (seen: [Int: [Int]], refused: Int) in
      let loop = try RunLoopThread(name: "r14s-mp")
      let sequence = loop.sourceSequence(of: R14SItem.self, buffering: .bounded(3))
      let consumer = Task(executorPreference: loop) { () -> [Int: [Int]] in
        var seen: [Int: [Int]] = [:]
        for await item in sequence { seen[item.producer, default: []].append(item.index) }
        return seen
      }
      let refused = AtomicCounter()
      async let posters: Void = withTaskGroup(of: Void.self) { group in
        for producer in 3..<5 {
          group.addTask {
            await execOnNewThread {
              for index in 0..<perProducer {
                while true {
                  let result = sequence.post(R14SItem(producer: producer, index: index))
                  if result == .full {
                    sched_yield()
                    continue
                  }
                  if result != .enqueued { refused.increment() }
                  break
                }
              }
            }
          }
        }
      }
      await withTaskGroup(of: Void.self) { group in
        for producer in 0..<3 {
          group.addTask {
            for index in 0..<perProducer {
              let result = await sequence.send(R14SItem(producer: producer, index: index))
              if result != .enqueued { refused.increment() }
            }
          }
        }
      }
      await posters
      sequence.invalidate()
      let seen = await consumer.value
      await execShutdown(loop)
      return (seen, refused.current)
    }
    guard let outcome else { return }
    #expect(outcome.refused == 0, "\(outcome.refused) elements were refused")
    for producer in 0..<5 {
      let indices = outcome.seen[producer] ?? []
      #expect(
        indices == Array(0..<perProducer), "producer \(producer): \(indices.count) elements, out of order or lost")
    }
  }

  /// Promised: `.dropOldest` keeps the newest `capacity` elements and `.dropNewest` the oldest,
  /// each dropped one counted, and the kept ones are delivered in order. The loop is held in a
  /// block while ten elements are posted, so none is released in between.
  @Test func dropPoliciesKeepTheRightElementsWhenTheLoopFallsBehind() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "drop policies") {
      () async throws -> (oldest: [Int], newest: [Int], dropped: [Int], results: [[SourcePostResult]]) in
      let loop = try RunLoopThread(name: "r14s-drop")
      let dropOldest = loop.sourceSequence(of: Int.self, buffering: .dropOldest(4))
      let dropNewest = loop.sourceSequence(of: Int.self, buffering: .dropNewest(4))
      let results = await execOnNewThread { () -> [[SourcePostResult]] in
        let release = blockLoop(loop)
        defer { release.open() }
        return [(0..<10).map { dropOldest.post($0) }, (0..<10).map { dropNewest.post($0) }]
      }
      let dropped = [dropOldest.droppedCount, dropNewest.droppedCount]
      dropOldest.invalidate()
      dropNewest.invalidate()
      var oldest: [Int] = []
      for await value in dropOldest { oldest.append(value) }
      var newest: [Int] = []
      for await value in dropNewest { newest.append(value) }
      await execShutdown(loop)
      return (oldest, newest, dropped, results)
    }
    guard let outcome else { return }
    #expect(outcome.oldest == [6, 7, 8, 9])
    #expect(outcome.newest == [0, 1, 2, 3])
    #expect(outcome.dropped == [6, 6])
    #expect(
      outcome.results[0] == Array(repeating: .enqueued, count: 4) + Array(repeating: .enqueuedDroppingOldest, count: 6))
    #expect(outcome.results[1] == Array(repeating: .enqueued, count: 4) + Array(repeating: .dropped, count: 6))
  }

  /// Promised: `invalidate()` from another thread while the consumer is suspended in `next()`
  /// delivers what was accepted, then `next()` returns nil; `onCancel` runs once, on the loop
  /// thread; later posts answer `.terminated`.
  @Test func invalidateFromAnotherThreadWhileTheConsumerWaitsDeliversThenEnds() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "invalidate while waiting") {
      () async throws -> (values: [Int], cancels: Int, onLoop: Bool, after: SourcePostResult) in
      let loop = try RunLoopThread(name: "r14s-inv")
      let cancels = AtomicCounter()
      let onLoop = Locked(true)
      let sequence = loop.sourceSequence(
        of: Int.self,
        onCancel: { cancelLoop in
          cancels.increment()
          if !cancelLoop.isOnLoopThread { onLoop.withLock { $0 = false } }
        })
      let consumer = Task { () -> [Int] in
        var values: [Int] = []
        for await value in sequence { values.append(value) }
        return values
      }
      _ = await r14sPoll { r14sIsWaiting(sequence) }
      await execOnNewThread {
        let release = blockLoop(loop)  // the posts and the invalidation reach the loop together
        for value in 0..<5 { _ = sequence.post(value) }
        sequence.invalidate()
        release.open()
      }
      let values = await consumer.value
      let after = sequence.post(99)
      _ = await r14sPoll { cancels.current > 0 }
      await execShutdown(loop)
      return (values, cancels.current, onLoop.withLock { $0 }, after)
    }
    guard let outcome else { return }
    #expect(outcome.values == [0, 1, 2, 3, 4])
    #expect(outcome.cancels == 1)
    #expect(outcome.onLoop)
    #expect(outcome.after == .terminated)
  }

  /// Promised: cancelling the consuming task while it is not suspended (it holds a batch) ends the
  /// sequence at once: the next `next()` returns nil, `onCancel` runs once, later posts answer
  /// `.terminated`, and a producer waiting in `send` is answered `.terminated`.
  @Test func cancellingTheConsumerBetweenElementsEndsTheSequence() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "cancel between elements") {
      () async throws -> (taken: [Int], cancels: Int, post: SourcePostResult, send: SourcePostResult) in
      let loop = try RunLoopThread(name: "r14s-cancel")
      let cancels = AtomicCounter()
      let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(3), onCancel: { _ in cancels.increment() })
      for value in 0..<3 { _ = sequence.post(value) }
      let sender = Task { await sequence.send(3) }  // waits: the buffer is full
      _ = await r14sPoll { sequence.waitingProducerCount == 1 }
      let consumer = Task { () -> [Int] in
        var taken: [Int] = []
        var iterator = sequence.makeAsyncIterator()
        while let value = await iterator.next() {
          taken.append(value)
          if taken.count == 1 { withUnsafeCurrentTask { $0?.cancel() } }
        }
        return taken
      }
      let taken = await consumer.value
      let send = await sender.value
      _ = await r14sPoll { cancels.current > 0 }
      let post = sequence.post(7)
      await execShutdown(loop)
      return (taken, cancels.current, post, send)
    }
    guard let outcome else { return }
    #expect(outcome.taken == [0], "after the cancellation the consumer still took \(outcome.taken)")
    #expect(outcome.cancels == 1)
    #expect(outcome.post == .terminated)
    // The sender's element joined the buffer when the consumer took its batch (it was then
    // discarded with the buffer), or it was still waiting and was answered `.terminated`.
    #expect(outcome.send == .enqueued || outcome.send == .terminated, "send answered \(outcome.send)")
  }

  /// Promised: cancelling the consuming task while it is suspended in `next()` ends it (nil);
  /// the source leaves its loop (`onCancel` once) and later posts answer `.terminated`.
  @Test func cancellingASuspendedConsumerEndsItAndDetachesTheSource() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "cancel suspended") {
      () async throws -> (count: Int, cancels: Int, post: SourcePostResult, records: Int?) in
      let loop = try RunLoopThread(name: "r14s-cancel2")
      let cancels = AtomicCounter()
      let sequence = loop.sourceSequence(of: Int.self, onCancel: { _ in cancels.increment() })
      let consumer = Task(executorPreference: loop) { () -> Int in
        var count = 0
        for await _ in sequence { count += 1 }
        return count
      }
      _ = await r14sPoll { r14sIsWaiting(sequence) }
      consumer.cancel()
      let count = await consumer.value
      _ = await r14sPoll { cancels.current > 0 }
      let post = sequence.post(1)
      let records = await execOnNewThread { try? loop.performAndWait { loop.core.modeTable.allRecords.count } }
      await execShutdown(loop)
      return (count, cancels.current, post, records)
    }
    guard let outcome else { return }
    #expect(outcome.count == 0)
    #expect(outcome.cancels == 1)
    #expect(outcome.post == .terminated)
    #expect(outcome.records == 0, "the loop still holds \(String(describing: outcome.records)) records")
  }

  /// Promised: a `SignalSequence` delivers, after `invalidate()`, every signal made before it:
  /// with four threads signalling 5,000 times each, the elements (each at least 1) add up to
  /// exactly 20,000.
  @Test func signalsFromManyThreadsAddUpExactlyAfterInvalidate() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "signal sums") {
      () async throws -> (sum: Int, smallest: Int, accepted: Int) in
      let loop = try RunLoopThread(name: "r14s-sig")
      let sequence = loop.signalSequence()
      let consumer = Task { () -> (Int, Int) in
        var sum = 0
        var smallest = Int.max
        for await count in sequence {
          sum += count
          smallest = min(smallest, count)
        }
        return (sum, smallest)
      }
      let accepted = AtomicCounter()
      await execOnNewThread {
        race(
          (0..<4).map { _ in
            {
              for _ in 0..<5_000 where sequence.signal() { accepted.increment() }
            }
          })
      }
      sequence.invalidate()
      let (sum, smallest) = await consumer.value
      await execShutdown(loop)
      return (sum, smallest, accepted.current)
    }
    guard let outcome else { return }
    #expect(outcome.accepted == 20_000)
    #expect(outcome.sum == 20_000, "the elements add up to \(outcome.sum)")
    #expect(outcome.smallest >= 1)
  }
}

// MARK: - Every sequence kind: shutdown, leaks

@Suite("ReviewRound14Surface: every sequence kind", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound14SurfaceKindsTests {
  /// Promised: the loop's shutdown ends every sequence whose consumer is suspended (each
  /// `for await` ends; none hangs), consumers pinned to the loop included; afterwards posts answer
  /// `.terminated` and `signal()` false.
  @Test func shutdownEndsEveryKindOfSequenceWhileItsConsumerWaits() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "shutdown ends sequences") {
      () async throws -> (waited: [Bool], ended: [Int], post: SourcePostResult, signal: Bool) in
      let loop = try RunLoopThread(name: "r14s-sd")
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let source = loop.sourceSequence(of: Int.self)
      let signals = loop.signalSequence()
      let timer = loop.timer(every: .seconds(3600))
      let readiness = try loop.readiness(of: pipe.read)
      let activities = loop.activities(.exit)
      let ended = AtomicCounter()
      let tasks: [Task<Void, Never>] = [
        Task(executorPreference: loop) {
          for await _ in source {}
          ended.increment()
        },
        Task {
          for await _ in signals {}
          ended.increment()
        },
        Task(executorPreference: loop) {
          for await _ in timer {}
          ended.increment()
        },
        Task {
          for await _ in readiness {}
          ended.increment()
        },
        Task(executorPreference: loop) {
          for await _ in activities {}
          ended.increment()
        },
      ]
      let waited = [
        await r14sPoll { r14sIsWaiting(source) }, await r14sPoll { r14sIsWaiting(signals) },
        await r14sPoll { r14sIsWaiting(timer) }, await r14sPoll { r14sIsWaiting(readiness) },
        await r14sPoll { r14sIsWaiting(activities) },
      ]
      await execShutdown(loop)
      for task in tasks { await task.value }
      return (waited, [ended.current], source.post(1), signals.signal())
    }
    guard let outcome else { return }
    #expect(outcome.waited == [true, true, true, true, true])
    #expect(outcome.ended == [5])
    #expect(outcome.post == .terminated)
    #expect(!outcome.signal)
  }
}

extension ReviewRound14SurfaceKindsTests {
  /// Promised: a consumer that drops its iterator (`break`) ends the sequence and takes the
  /// member off its loop; once the sequence is dropped too, nothing keeps the sequence, its
  /// member or what the member's closures captured alive (checked with weak references), for
  /// every kind of sequence.
  @Test func breakingOutAndDroppingTheSequenceReleasesEverything() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "leaks") {
      () async throws -> (gone: [String: Bool], records: Int?) in
      let loop = try RunLoopThread(name: "r14s-leak")
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      var weak: [String: R14SWeak] = [:]
      do {
        let token = R14SToken()
        weak["token"] = R14SWeak(token)
        let source = loop.sourceSequence(of: Int.self, onCancel: { _ in _ = token })
        weak["source"] = R14SWeak(source)
        weak["source.member"] = R14SWeak(source.source)
        _ = source.post(1)
        for await _ in source { break }
      }
      do {
        let signals = loop.signalSequence()
        weak["signals"] = R14SWeak(signals)
        weak["signals.member"] = R14SWeak(signals.source)
        signals.signal()
        for await _ in signals { break }
      }
      do {
        let timer = loop.timer(every: .milliseconds(1))
        weak["timer"] = R14SWeak(timer)
        weak["timer.member"] = R14SWeak(timer.timer)
        for await _ in timer { break }
      }
      do {
        let readiness = try loop.readiness(of: pipe.read)
        weak["readiness"] = R14SWeak(readiness)
        weak["readiness.member"] = R14SWeak(readiness.source)
        writeByte(pipe.write)
        for await _ in readiness { break }
      }
      do {
        let activities = loop.activities(.beforeWaiting)
        weak["activities"] = R14SWeak(activities)
        weak["activities.member"] = R14SWeak(activities.observer)
        loop.wakeUp()
        for await _ in activities { break }
      }
      let all = weak
      _ = await r14sPoll(timeout: .seconds(5)) {
        _ = try? loop.performAndWait {}
        return all.values.allSatisfy(\.isGone)
      }
      let records = await execOnNewThread { try? loop.performAndWait { loop.core.modeTable.allRecords.count } }
      await execShutdown(loop)
      return (all.mapValues(\.isGone), records)
    }
    guard let outcome else { return }
    for (name, gone) in outcome.gone.sorted(by: { $0.key < $1.key }) {
      #expect(gone, "\(name) is still alive")
    }
    #expect(outcome.records == 0, "the loop still holds \(String(describing: outcome.records)) records")
  }

  /// Promised: a readiness sequence pauses its registration while an element waits for its
  /// consumer, so a consumer on another executor that does not read does not make the loop spin
  /// on a descriptor that stays readable; once it asks again the element comes at once (the
  /// descriptor is still ready), and after it drained, a new byte brings a new element.
  @Test func aStalledReadinessConsumerDoesNotMakeTheLoopSpinAndLosesNothing() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "readiness pause") {
      () async throws -> (passes: Int, first: Bool, again: Bool, afterDrain: Bool) in
      let loop = try RunLoopThread(name: "r14s-ready")
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let passes = AtomicCounter()
      loop.add(LoopObserver(activities: .afterWaiting) { _, _ in passes.increment() }, to: .common)
      let readiness = try loop.readiness(of: pipe.read)
      var iterator = readiness.makeAsyncIterator()
      writeByte(pipe.write)
      let first = await iterator.next()?.contains(.readable) == true
      // Stall without reading: the loop sees the descriptor ready again, keeps one element for
      // the consumer, and pauses.
      try await Task.sleep(for: .milliseconds(200))
      let stalledPasses = passes.current
      let again = await iterator.next()?.contains(.readable) == true
      drainDescriptor(pipe.read)
      // Whatever readiness was recorded before the drain may still come once; then a new byte.
      let gotNew = Locked(false)
      writeByte(pipe.write)
      let next = await iterator.next()
      gotNew.withLock { $0 = next?.contains(.readable) == true }
      readiness.invalidate()
      while await iterator.next() != nil {}
      await execShutdown(loop)
      return (stalledPasses, first, again, gotNew.withLock { $0 })
    }
    guard let outcome else { return }
    #expect(outcome.first)
    #expect(outcome.again)
    #expect(outcome.afterDrain)
    #expect(outcome.passes < 50, "the loop woke \(outcome.passes) times in 200 ms for a stalled consumer")
  }
}

// MARK: - Timer sequences

@Suite("ReviewRound14Surface: timer sequences", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound14SurfaceTimerTests {
  /// Promised (`.burst`): one tick per missed due instant, back to back, then the grid goes on:
  /// after the loop was held for 40 ms, 25 ticks of a 2 ms timer are consecutive grid points
  /// (exactly one interval apart), none folded.
  @Test func burstTicksAreConsecutiveGridPointsAfterTheLoopWasHeld() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "burst") { () async throws -> [LoopTick] in
      let loop = try RunLoopThread(name: "r14s-burst")
      let sequence = loop.timer(every: .milliseconds(2), missedTicks: .burst)
      await execOnNewThread {
        let release = blockLoop(loop)
        usleep(40_000)
        release.open()
      }
      var ticks: [LoopTick] = []
      for await tick in sequence {
        ticks.append(tick)
        if ticks.count == 25 { break }
      }
      await execShutdown(loop)
      return ticks
    }
    guard let outcome else { return }
    #expect(outcome.count == 25)
    let gaps = zip(outcome.dropFirst(), outcome).map { $0.scheduled.nanoseconds - $1.scheduled.nanoseconds }
    #expect(gaps.allSatisfy { $0 == 2_000_000 }, "gaps between ticks: \(gaps)")
    #expect(outcome.allSatisfy { $0.skipped == 0 })
  }

  /// Promised (`.skip`): one tick stands for the missed due instants (`skipped` counts them) and
  /// the timer stays on its grid: each tick's successor is due exactly `1 + skipped` intervals
  /// after it, whatever the loop and the consumer did.
  @Test func skipTicksAccountForEveryGridPoint() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "skip") { () async throws -> [LoopTick] in
      let loop = try RunLoopThread(name: "r14s-skip")
      let sequence = loop.timer(every: .milliseconds(2), missedTicks: .skip)
      var ticks: [LoopTick] = []
      for await tick in sequence {
        ticks.append(tick)
        if ticks.count == 3 {
          await execOnNewThread {
            let release = blockLoop(loop)
            usleep(20_000)
            release.open()
          }
        }
        if ticks.count == 6 { try await Task.sleep(for: .milliseconds(15)) }  // the consumer falls behind
        if ticks.count == 10 { break }
      }
      await execShutdown(loop)
      return ticks
    }
    guard let outcome else { return }
    for (next, tick) in zip(outcome.dropFirst(), outcome) {
      #expect(
        next.scheduled.nanoseconds - tick.scheduled.nanoseconds == Int64(1 + tick.skipped) * 2_000_000,
        "\(tick) then \(next)")
    }
  }

  /// Promised: a one-shot timer at an instant already past ticks once, as soon as possible, then
  /// the sequence ends; its tick carries the instant asked for.
  @Test func aOneShotTimerInThePastTicksOnceThenEnds() async throws {
    let deadline = LoopClock.Instant.now.advanced(by: .milliseconds(-50))
    let outcome = try await withWatchdog(timeout: .seconds(20), "one-shot") { () async throws -> [LoopTick] in
      let loop = try RunLoopThread(name: "r14s-once")
      var ticks: [LoopTick] = []
      for await tick in loop.timer(at: deadline) { ticks.append(tick) }
      await execShutdown(loop)
      return ticks
    }
    guard let outcome else { return }
    #expect(outcome.map(\.scheduled) == [deadline])
  }

  /// Promised: `invalidate()` delivers the ticks the loop has already fired and the consumer has
  /// not taken, then the sequence ends: a burst run the loop fired while the consumer slept is
  /// delivered in full after the invalidation.
  @Test func invalidateDeliversTheBurstTicksAlreadyFired() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "burst then invalidate") {
      () async throws -> (count: Int, gaps: [Int64]) in
      let loop = try RunLoopThread(name: "r14s-binv")
      let sequence = loop.timer(every: .milliseconds(1), missedTicks: .burst)
      var iterator = sequence.makeAsyncIterator()
      guard let first = await iterator.next() else { return (0, []) }
      // The loop goes on firing while the consumer sleeps; the ticks pile up as one run.
      try await Task.sleep(for: .milliseconds(30))
      sequence.invalidate()
      var ticks = [first]
      while let tick = await iterator.next() { ticks.append(tick) }
      // Ended: the machine ignores fires from now on, so this is the due instant it stopped at.
      let ready = sequence.lock.withLock { sequence.machine.schedule.nextDue ?? 0 }
      await execShutdown(loop)
      let gaps = zip(ticks.dropFirst(), ticks).map { $0.scheduled.nanoseconds - $1.scheduled.nanoseconds }
      // Every grid point before the next due instant the machine had reached was delivered.
      let expected = Int((ready - first.scheduled.nanoseconds) / 1_000_000)
      return (ticks.count - expected, gaps)
    }
    guard let outcome else { return }
    #expect(outcome.count == 0, "\(outcome.count) ticks more (or fewer) than fired")
    #expect(outcome.gaps.allSatisfy { $0 == 1_000_000 }, "\(outcome.gaps)")
  }
}

// MARK: - Executor

/// Counts callers inside an actor method at once (more than one would break the serial contract).
private final class R14SOverlap: Sendable {
  let inside = AtomicCounter()
  let most = Locked(0)
  func enter() {
    let now = inside.value.add(1, ordering: .sequentiallyConsistent).newValue
    most.withLock { $0 = max($0, now) }
  }
  func leave() { inside.value.subtract(1, ordering: .sequentiallyConsistent) }
}

/// An actor pinned to a loop.
private actor R14SActor: LoopActor {
  nonisolated let loop: RunLoopThread
  let overlap = R14SOverlap()
  var calls = 0
  init(loop: RunLoopThread) { self.loop = loop }

  /// Where the call runs: (isolated to the loop, on the loop's thread).
  func whereAmI() -> (isolated: Bool?, onThread: Bool) { (loop.isIsolatingCurrentContext(), loop.isOnLoopThread) }

  /// A call that takes a while; counts overlapping callers.
  func slowCall() {
    overlap.enter()
    usleep(300)
    calls += 1
    overlap.leave()
  }

  /// `performAndWait` on the actor's own loop: inline.
  func performInline() throws -> Bool { try loop.performAndWait { self.loop.isOnLoopThread } }

  /// Waits (on this loop's thread) for `other` to run a block that waits for this loop.
  func waitInACycle(through other: RunLoopThread) -> String {
    do {
      return try other.performAndWait { () throws -> String in
        try self.loop.performAndWait { "ran" }
      }
    } catch RunLoopError.wouldDeadlock {
      return "wouldDeadlock"
    } catch {
      return "\(error)"
    }
  }

  /// A modal run in `mode` that ends when `source` fires (or after 10 s).
  func modalUntilSignalled() async throws -> RunLoopRunResult {
    try await loop.runModal(mode: r14sModeA, for: .seconds(10), returnAfterSourceHandled: true)
  }

  func ping(_ source: InputSource) { source.signal() }
}

@Suite("ReviewRound14Surface: executor", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound14SurfaceExecutorTests {
  /// Promised: an actor pinned to a loop runs on the loop's thread, isolated to it; the loop
  /// answers false (never nil) off its thread; a task that prefers the loop runs there, also after
  /// a `Task.sleep`; `performAndWait` from the actor on its own loop runs inline.
  @Test func actorsAndPreferringTasksRunOnTheLoopIsolated() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "isolation") {
      () async throws -> (actor: (Bool?, Bool), off: Bool?, task: [Bool], inline: Bool) in
      let loop = try RunLoopThread(name: "r14s-iso")
      let actor = R14SActor(loop: loop)
      let place = await actor.whereAmI()
      let inline = try await actor.performInline()
      let task = await Task(executorPreference: loop) { () -> [Bool] in
        var seen = [loop.isOnLoopThread]
        try? await Task.sleep(for: .milliseconds(5))
        seen.append(loop.isOnLoopThread)
        await Task.yield()
        seen.append(loop.isIsolatingCurrentContext() == true)
        return seen
      }.value
      let off = await execOnNewThread { loop.isIsolatingCurrentContext() }
      await execShutdown(loop)
      return (place, off, task, inline)
    }
    guard let outcome else { return }
    #expect(outcome.actor.0 == true)
    #expect(outcome.actor.1)
    #expect(outcome.off == false)
    #expect(outcome.task == [true, true, true])
    #expect(outcome.inline)
  }

  /// Promised: `performAndWait` refuses a wait that closes a cycle: an actor on loop A waits for
  /// a block on loop B that waits for loop A; the inner call throws `wouldDeadlock` instead of
  /// hanging both loops.
  @Test func performAndWaitInACycleThroughAnActorThrowsInsteadOfHanging() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "cycle") { () async throws -> String in
      let loopA = try RunLoopThread(name: "r14s-cyc-a")
      let loopB = try RunLoopThread(name: "r14s-cyc-b")
      let actor = R14SActor(loop: loopA)
      let answer = await actor.waitInACycle(through: loopB)
      await execShutdown(loopA)
      await execShutdown(loopB)
      return answer
    }
    #expect(outcome == "wouldDeadlock")
  }

  /// Promised: after the loop terminated, an actor's calls still run, one at a time, on the
  /// fallback queue, isolated to the loop (`isIsolatingCurrentContext()` true there, and the
  /// loop's thread is not used); a task that prefers the terminated loop runs too.
  @Test func jobsAfterTerminationRunIsolatedOneAtATime() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "fallback") {
      () async throws -> (place: (Bool?, Bool), most: Int, calls: Int, task: Bool?) in
      let loop = try RunLoopThread(name: "r14s-fb")
      let actor = R14SActor(loop: loop)
      _ = await actor.whereAmI()
      await execShutdown(loop)
      let place = await actor.whereAmI()
      await withTaskGroup(of: Void.self) { group in
        for _ in 0..<8 {
          group.addTask {
            for _ in 0..<10 { await actor.slowCall() }
          }
        }
      }
      let calls = await actor.calls
      let task = await Task(executorPreference: loop) { loop.isIsolatingCurrentContext() }.value
      return (place, actor.overlap.most.withLock { $0 }, calls, task)
    }
    guard let outcome else { return }
    #expect(outcome.place.0 == true, "on the fallback the actor's call is not isolated to its loop")
    #expect(!outcome.place.1)
    #expect(outcome.most == 1, "\(outcome.most) calls of the actor overlapped")
    #expect(outcome.calls == 80)
    #expect(outcome.task == true)
  }

  /// Promised: at shutdown a `loop.clock` sleep throws `CancellationError`, and a `Task.sleep`
  /// under the loop's preference is not ended early: it completes at its deadline, elsewhere.
  /// Neither hangs.
  @Test func shutdownWithPendingSleepsResumesEverySleeper() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "sleeps at shutdown") {
      () async throws -> (clock: String, taskSleep: String, elapsed: Duration) in
      let loop = try RunLoopThread(name: "r14s-sleep")
      let clockSleep = Task { () -> String in
        do {
          try await loop.clock.sleep(until: .now.advanced(by: .seconds(60)))
          return "returned"
        } catch is CancellationError {
          return "cancelled"
        } catch {
          return "\(error)"
        }
      }
      let start = ContinuousClock.now
      let taskSleep = Task(executorPreference: loop) { () -> (String, Duration) in
        do {
          try await Task.sleep(for: .milliseconds(300))
          return ("returned", ContinuousClock.now - start)
        } catch {
          return ("\(error)", ContinuousClock.now - start)
        }
      }
      _ = await r14sPoll { loop.scheduledJobCount >= 1 }
      try await Task.sleep(for: .milliseconds(20))  // the clock sleep's timer reaches the loop
      await execShutdown(loop)
      let clock = await clockSleep.value
      let (slept, elapsed) = await taskSleep.value
      return (clock, slept, elapsed)
    }
    guard let outcome else { return }
    #expect(outcome.clock == "cancelled")
    #expect(outcome.taskSleep == "returned")
    #expect(outcome.elapsed >= .milliseconds(300), "Task.sleep ended early, after \(outcome.elapsed)")
  }

  /// Promised: `runModal` from an actor on the loop suspends the actor instead of blocking its
  /// executor, so the actor's other calls run during the modal run: one of them signals a source
  /// of the modal mode, which ends the run (`.handledSource`), well before its 10 s limit.
  @Test func anActorsOtherCallsRunDuringItsModalRun() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "modal from actor") {
      () async throws -> RunLoopRunResult in
      let loop = try RunLoopThread(name: "r14s-modal")
      let entered = TestGate()
      loop.add(LoopObserver(activities: .entry) { _, _ in entered.open() }, to: r14sModeA)
      let source = InputSource(perform: { _ in })
      loop.add(source, to: r14sModeA)
      let actor = R14SActor(loop: loop)
      async let result = actor.modalUntilSignalled()
      _ = await r14sPoll { entered.opened }
      await actor.ping(source)
      let value = try await result
      source.invalidate()
      await execShutdown(loop)
      return value
    }
    #expect(outcome == .handledSource)
  }

  /// Documented (`runModal`): modal runs from two tasks nest, and the outer one's cancellation
  /// takes effect when the inner one has returned, which is not cut short. Task A is in a modal
  /// run in mode A; task B's modal run in mode B (1 s) starts inside it; A is cancelled. B's run
  /// ends at its limit (`.timedOut`), then A's (`.stopped`), in that order. (Review round 14 took
  /// A waiting for B as a bug; it is how runs on one thread nest.)
  @Test func aCancelledModalRunEndsOnceTheModalRunNestedInItReturns() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "nested modal cancel") {
      () async throws -> (first: RunLoopRunResult, second: RunLoopRunResult, order: [String]) in
      let loop = try RunLoopThread(name: "r14s-modal2")
      let enteredA = TestGate()
      let enteredB = TestGate()
      // The runs' exits, in the order the loop thread makes them.
      let order = EventLog()
      loop.add(
        LoopObserver(activities: [.entry, .exit]) { _, activity in
          if activity == .entry { enteredA.open() } else { order.add("first") }
        }, to: r14sModeA)
      loop.add(
        LoopObserver(activities: [.entry, .exit]) { _, activity in
          if activity == .entry { enteredB.open() } else { order.add("second") }
        }, to: r14sModeB)
      let keepA = LoopTimer(after: .seconds(3600)) { _ in }
      let keepB = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepA, to: r14sModeA)
      loop.add(keepB, to: r14sModeB)
      let first = Task { () -> RunLoopRunResult in
        (try? await loop.runModal(mode: r14sModeA, for: .seconds(20))) ?? .finished
      }
      _ = await r14sPoll { enteredA.opened }
      let second = Task { () -> RunLoopRunResult in
        (try? await loop.runModal(mode: r14sModeB, for: .seconds(1))) ?? .finished
      }
      _ = await r14sPoll { enteredB.opened }
      first.cancel()
      let firstResult = await first.value
      let secondResult = await second.value
      keepA.invalidate()
      keepB.invalidate()
      await execShutdown(loop)
      return (firstResult, secondResult, order.snapshot)
    }
    guard let outcome else { return }
    #expect(outcome.first == .stopped)
    #expect(outcome.second == .timedOut, "the nested run was cut short: \(outcome.second)")
    #expect(outcome.order == ["second", "first"], "\(outcome.order)")
  }

  /// Promised: `runModal` on a loop that has shut down throws `RunLoopError.shutDown`.
  @Test func runModalAfterShutdownThrows() async throws {
    let loop = try RunLoopThread(name: "r14s-modal3")
    await execShutdown(loop)
    await #expect(throws: RunLoopError.self) { try await loop.runModal(mode: r14sModeA, for: .seconds(1)) }
  }

  /// Promised: `LoopGroup.next()` hands the loops out round-robin in creation order, and
  /// `shutdownAndWait()` shuts every one down.
  @Test func loopGroupHandsLoopsOutRoundRobinAndShutsThemAllDown() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "group") {
      () throws -> (names: [String], down: [Bool]) in
      let group = try LoopGroup(count: 3, name: "r14s-g")
      let names = (0..<7).map { _ in group.next().name }
      group.shutdownAndWait()
      return (names, group.loops.map(\.isShutDown))
    }
    guard let outcome else { return }
    #expect(outcome.names == ["r14s-g-0", "r14s-g-1", "r14s-g-2", "r14s-g-0", "r14s-g-1", "r14s-g-2", "r14s-g-0"])
    #expect(outcome.down == [true, true, true])
  }
}

// MARK: - runOnMain off the main thread

@Suite("ReviewRound14Surface: runOnMain off the main thread", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound14SurfaceMainTests {
  /// Promised: `runOnMainAndWait` and `RunLoopThread.main.performAndWait` from a loop thread,
  /// while the main loop is not running, throw `wouldDeadlock` at once instead of blocking the
  /// loop thread, and the body does not run.
  @Test func waitingForTheMainThreadFromALoopThreadThrowsWhenTheMainLoopIsNotRunning() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "main from loop") {
      () throws -> (running: Bool, answers: [String], ran: Bool) in
      let loop = try RunLoopThread(name: "r14s-main")
      defer { loop.shutdownAndWait() }
      let ran = Locked(false)
      let answers = try loop.performAndWait { () -> [String] in
        var answers: [String] = []
        do {
          try runOnMainAndWait { ran.withLock { $0 = true } }
          answers.append("ran")
        } catch RunLoopError.wouldDeadlock {
          answers.append("wouldDeadlock")
        } catch {
          answers.append("\(error)")
        }
        do {
          try RunLoopThread.main.performAndWait { ran.withLock { $0 = true } }
          answers.append("ran")
        } catch RunLoopError.wouldDeadlock {
          answers.append("wouldDeadlock")
        } catch {
          answers.append("\(error)")
        }
        return answers
      }
      return (RunLoopThread.isMainLoopRunning, answers, ran.withLock { $0 })
    }
    guard let outcome, !outcome.running else { return }
    #expect(outcome.answers == ["wouldDeadlock", "wouldDeadlock"])
    #expect(!outcome.ran)
  }
}

// MARK: - More sequence promises

@Suite("ReviewRound14Surface: sequence edges", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound14SurfaceEdgeTests {
  /// Promised: every factory on a loop that has shut down returns a sequence that has ended
  /// (`for await` ends at once; posts answer `.terminated`, `signal()` false).
  @Test func sequencesMadeAfterShutdownEndAtOnce() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "after shutdown") {
      () async throws -> (counts: [Int], post: SourcePostResult, signal: Bool) in
      let loop = try RunLoopThread(name: "r14s-late")
      await execShutdown(loop)
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      writeByte(pipe.write)
      let source = loop.sourceSequence(of: Int.self)
      let post = source.post(1)
      let signals = loop.signalSequence()
      let signal = signals.signal()
      var counts: [Int] = []
      var count = 0
      for await _ in source { count += 1 }
      counts.append(count)
      count = 0
      for await _ in signals { count += 1 }
      counts.append(count)
      count = 0
      for await _ in loop.timer(every: .milliseconds(1)) { count += 1 }
      counts.append(count)
      count = 0
      for await _ in loop.timer(after: .zero) { count += 1 }
      counts.append(count)
      count = 0
      if let readiness = try? loop.readiness(of: pipe.read) {
        for await _ in readiness { count += 1 }
      } else {
        count = -1
      }
      counts.append(count)
      count = 0
      for await _ in loop.activities() { count += 1 }
      counts.append(count)
      return (counts, post, signal)
    }
    guard let outcome else { return }
    #expect(outcome.counts == [0, 0, 0, 0, 0, 0])
    #expect(outcome.post == .terminated)
    #expect(!outcome.signal)
  }

  /// Promised: `invalidate()` delivers what was accepted even when the loop never ran one of the
  /// source's modes (nothing was released yet): posts to a sequence scheduled only in a mode the
  /// loop does not run arrive, in order, after the invalidation.
  @Test func invalidateReleasesElementsOfAModeTheLoopNeverRan() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "unrun mode") {
      () async throws -> (values: [Int], signals: Int) in
      let loop = try RunLoopThread(name: "r14s-unrun")
      let sequence = loop.sourceSequence(of: Int.self, modes: [r14sModeA])
      let signals = loop.signalSequence(modes: [r14sModeA])
      for value in 0..<5 { _ = sequence.post(value) }
      for _ in 0..<3 { signals.signal() }
      _ = await execOnNewThread { try? loop.performAndWait {} }
      sequence.invalidate()
      signals.invalidate()
      var values: [Int] = []
      for await value in sequence { values.append(value) }
      var total = 0
      for await count in signals { total += count }
      await execShutdown(loop)
      return (values, total)
    }
    guard let outcome else { return }
    #expect(outcome.values == [0, 1, 2, 3, 4])
    #expect(outcome.signals == 3)
  }

  /// Promised: the loop's shutdown answers a producer waiting in `send` (`.bounded` buffer full)
  /// with `.terminated`, delivers the accepted elements and ends the consumer.
  @Test func shutdownAnswersAWaitingSenderAndDeliversTheBuffer() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "sender at shutdown") {
      () async throws -> (send: SourcePostResult, values: [Int]) in
      let loop = try RunLoopThread(name: "r14s-sendsd")
      let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(2))
      _ = sequence.post(0)
      _ = sequence.post(1)
      let sender = Task { await sequence.send(2) }
      _ = await r14sPoll { sequence.waitingProducerCount == 1 }
      await execShutdown(loop)
      let send = await sender.value
      var values: [Int] = []
      for await value in sequence { values.append(value) }
      return (send, values)
    }
    guard let outcome else { return }
    #expect(outcome.send == .terminated)
    #expect(outcome.values == [0, 1])
  }

  /// Promised: with `.dropOldest` / `.dropNewest` buffering under two posting threads and a
  /// consumer that keeps up as it can, every post is either delivered once or counted as dropped
  /// (delivered + dropped = posted), and each producer's delivered elements keep their order.
  @Test(arguments: [SourceBuffering.dropOldest(8), .dropNewest(8)])
  func droppingBuffersAccountForEveryPost(buffering: SourceBuffering) async throws {
    let perThread = 20_000
    let outcome = try await withWatchdog(timeout: .seconds(30), "drop accounting") {
      () async throws -> (delivered: Int, dropped: Int, ordered: Bool, results: [SourcePostResult: Int]) in
      let loop = try RunLoopThread(name: "r14s-dacc")
      let sequence = loop.sourceSequence(of: R14SItem.self, buffering: buffering)
      let consumer = Task { () -> (Int, Bool) in
        var last = [-1, -1]
        var ordered = true
        var delivered = 0
        for await item in sequence {
          if item.index <= last[item.producer] { ordered = false }
          last[item.producer] = item.index
          delivered += 1
        }
        return (delivered, ordered)
      }
      let results = Locked([SourcePostResult: Int]())
      await execOnNewThread {
        race(
          (0..<2).map { producer in
            {
              var local: [SourcePostResult: Int] = [:]
              for index in 0..<perThread {
                local[sequence.post(R14SItem(producer: producer, index: index)), default: 0] += 1
              }
              results.withLock { $0.merge(local, uniquingKeysWith: +) }
            }
          })
      }
      sequence.invalidate()
      let (delivered, ordered) = await consumer.value
      let dropped = sequence.droppedCount
      await execShutdown(loop)
      return (delivered, dropped, ordered, results.withLock { $0 })
    }
    guard let outcome else { return }
    #expect(
      outcome.delivered + outcome.dropped == 2 * perThread, "delivered \(outcome.delivered), dropped \(outcome.dropped)"
    )
    #expect(outcome.ordered)
    let refused = (outcome.results[.dropped] ?? 0)
    let takenDropping = outcome.results[.enqueuedDroppingOldest] ?? 0
    #expect(refused + takenDropping == outcome.dropped, "\(outcome.results)")
  }

  /// Promised: an activity sequence whose consumer falls behind drops its oldest events and counts
  /// them: delivered + dropped equals what the loop reached (counted by a second observer of the
  /// same activity in the same passes), and the newest `bufferLimit` events are kept.
  @Test func anActivitySequenceAccountsForEveryEventItDropped() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "activity drops") {
      () async throws -> (delivered: Int, dropped: Int, seen: Int) in
      let loop = try RunLoopThread(name: "r14s-act")
      let seen = AtomicCounter()
      // Both observers join in one loop-thread call: they are told in the same passes.
      let sequence = try await execOnNewThread {
        Result {
          try loop.performAndWait { () -> ActivitySequence in
            loop.add(LoopObserver(activities: .beforeWaiting) { _, _ in seen.increment() }, to: .common)
            return loop.activities(.beforeWaiting, bufferLimit: 4)
          }
        }
      }.get()
      let counted = await execOnNewThread { () -> Int in
        for _ in 0..<50 { _ = try? loop.performAndWait {} }
        // Between passes: both observers were told in the same passes.
        return
          (try? loop.performAndWait { () -> Int in
            sequence.invalidate()
            return seen.current
          }) ?? -1
      }
      var delivered = 0
      for await _ in sequence { delivered += 1 }
      await execShutdown(loop)
      return (delivered, sequence.droppedCount, counted)
    }
    guard let outcome else { return }
    #expect(outcome.delivered == min(4, outcome.seen), "\(outcome)")
    #expect(outcome.delivered + outcome.dropped == outcome.seen, "\(outcome)")
  }
}

// MARK: - More executor promises

@Suite("ReviewRound14Surface: sleeps and the drain", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound14SurfaceSleepTests {
  /// Promised: cancelling a `loop.clock` sleep ends it with `CancellationError` and takes its
  /// timer off the loop; cancelling a `Task.sleep` under the loop's preference ends it too.
  @Test func cancelledSleepsEndPromptlyAndLeaveNoTimerBehind() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "cancel sleeps") {
      () async throws -> (clock: Bool, task: Bool, records: Int?) in
      let loop = try RunLoopThread(name: "r14s-csleep")
      let clockSleep = Task { () -> Bool in
        do {
          try await loop.clock.sleep(until: .now.advanced(by: .seconds(60)))
          return false
        } catch { return error is CancellationError }
      }
      let taskSleep = Task(executorPreference: loop) { () -> Bool in
        do {
          try await Task.sleep(for: .seconds(60))
          return false
        } catch { return error is CancellationError }
      }
      _ = await r14sPoll { loop.scheduledJobCount >= 1 }
      _ = await r14sPoll {
        (try? loop.performAndWait { loop.core.modeTable.allRecords.count }) ?? 0 >= 2
      }
      clockSleep.cancel()
      taskSleep.cancel()
      let clock = await clockSleep.value
      let task = await taskSleep.value
      _ = await r14sPoll { (try? loop.performAndWait { loop.core.modeTable.allRecords.count }) ?? 0 <= 1 }
      let records = await execOnNewThread { try? loop.performAndWait { loop.core.modeTable.allRecords.count } }
      await execShutdown(loop)
      return (clock, task, records)
    }
    guard let outcome else { return }
    #expect(outcome.clock)
    #expect(outcome.task)
    // The Task.sleep's job stays on its timer until its deadline (the runtime's): at most one.
    #expect((outcome.records ?? 99) <= 1, "the loop holds \(String(describing: outcome.records)) records")
  }

  /// Promised: a `LoopClock()` sleep made on a loop's thread is not ended by that loop's
  /// shutdown: it sleeps the rest on the shared timer loop and returns at its deadline, never
  /// early.
  @Test func aDefaultClockSleepOnALoopOutlivesTheLoopsShutdown() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "default clock") {
      () async throws -> (result: String, early: Bool) in
      let loop = try RunLoopThread(name: "r14s-dclock")
      let deadline = LoopClock.Instant.now.advanced(by: .milliseconds(300))
      let sleeper = Task(executorPreference: loop) { () -> String in
        do {
          try await LoopClock().sleep(until: deadline)
          return "returned"
        } catch {
          return "\(error)"
        }
      }
      _ = await r14sPoll { (try? loop.performAndWait { loop.core.modeTable.allRecords.count }) ?? 0 >= 1 }
      await execShutdown(loop)
      let result = await sleeper.value
      return (result, LoopClock.Instant.now < deadline)
    }
    guard let outcome else { return }
    #expect(outcome.result == "returned")
    #expect(!outcome.early)
  }

  /// Promised: the drain runs jobs that arrive while it drains: a task started from a source's
  /// cancel routine (which the shutdown runs) that calls an actor on the loop completes, and so
  /// does a `performAndWait` on the loop made from the fallback (it throws `shutDown`).
  @Test func jobsStartedByCancelRoutinesDuringTheDrainComplete() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "drain jobs") {
      () async throws -> (calls: Int, late: String) in
      let loop = try RunLoopThread(name: "r14s-drain")
      let actor = R14SActor(loop: loop)
      let done = Locked<Task<String, Never>?>(nil)
      let source = InputSource(
        cancel: { _, _ in
          let task = Task { () -> String in
            await actor.slowCall()
            do {
              _ = try await actor.performInlineOrThrow()
              return "ran"
            } catch RunLoopError.shutDown {
              return "shutDown"
            } catch {
              return "\(error)"
            }
          }
          done.withLock { $0 = task }
        }, perform: { _ in })
      loop.add(source)
      _ = await execOnNewThread { try? loop.performAndWait {} }
      await execShutdown(loop)
      guard let task = done.withLock({ $0 }) else { return (-1, "no task") }
      let late = await task.value
      return (await actor.calls, late)
    }
    guard let outcome else { return }
    #expect(outcome.calls == 1)
    #expect(outcome.late == "ran" || outcome.late == "shutDown", "\(outcome.late)")
  }
}

extension R14SActor {
  /// `performAndWait` on the actor's loop from the actor (inline on the loop thread; on the
  /// fallback after termination, where it must throw rather than wait).
  func performInlineOrThrow() throws -> Bool { try loop.performAndWait { true } }
}

extension R14SActor {
  /// The actor's state read through a dynamic isolation check (`assumeIsolated`): traps unless
  /// the caller runs isolated to the actor's loop.
  nonisolated func callsAssumingIsolation() -> Int { assumeIsolated { $0.calls } }

  /// The same from inside an isolated call (on the fallback after termination).
  func callsThroughDynamicCheck() -> Int { callsAssumingIsolation() }
}

extension ReviewRound14SurfaceSleepTests {
  /// Promised: `assumeIsolated` of an actor on the loop works in performed blocks and timer and
  /// observer callouts on that loop, and in the actor's calls that run on the fallback after the
  /// loop terminated.
  @Test func assumeIsolatedHoldsInCalloutsAndOnTheFallback() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "assumeIsolated") {
      () async throws -> [Int] in
      let loop = try RunLoopThread(name: "r14s-assume")
      let actor = R14SActor(loop: loop)
      await actor.slowCall()
      let seen = Locked<[Int]>([])
      let fired = TestGate()
      loop.add(
        LoopTimer(after: .zero) { _ in
          seen.withLock { $0.append(actor.callsAssumingIsolation()) }
          fired.open()
        }, to: .common)
      let observed = TestGate()
      let observer = LoopObserver(activities: .beforeWaiting, repeats: false) { _, _ in
        seen.withLock { $0.append(actor.callsAssumingIsolation()) }
        observed.open()
      }
      loop.add(observer, to: .common)
      let inBlock = await execOnNewThread { try? loop.performAndWait { actor.callsAssumingIsolation() } }
      _ = await r14sPoll { fired.opened && observed.opened }
      await execShutdown(loop)
      let onFallback = await actor.callsThroughDynamicCheck()
      return [inBlock ?? -1] + seen.withLock { $0 } + [onFallback]
    }
    guard let outcome else { return }
    #expect(outcome == [1, 1, 1, 1])
  }

  /// Promised: a `Task.sleep` under the preference of a loop that has already terminated is
  /// never dropped and never early: it completes at its deadline and the task goes on (on the
  /// fallback queue).
  @Test func taskSleepUnderATerminatedLoopsPreferenceCompletesAtItsDeadline() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "sleep on dead loop") {
      () async throws -> (slept: Duration, isolated: Bool?) in
      let loop = try RunLoopThread(name: "r14s-deadsleep")
      await execShutdown(loop)
      return await Task(executorPreference: loop) { () -> (Duration, Bool?) in
        let start = ContinuousClock.now
        try? await Task.sleep(for: .milliseconds(100))
        return (ContinuousClock.now - start, loop.isIsolatingCurrentContext())
      }.value
    }
    guard let outcome else { return }
    #expect(outcome.slept >= .milliseconds(100))
    #expect(outcome.isolated == true)
  }
}

extension ReviewRound14SurfaceEdgeTests {
  /// Promised: dropping a sequence invalidates its source, also when the drop races the add
  /// that schedules it: `onSchedule` and `onCancel` come in pairs (each at most once), and the
  /// loop keeps no record. Four threads make and drop 300 sequences each.
  @Test func sequencesDroppedAsTheyAreMadePairScheduleAndCancel() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "made and dropped") {
      () async throws -> (schedules: Int, cancels: Int, records: Int?) in
      let loop = try RunLoopThread(name: "r14s-drop2")
      let schedules = AtomicCounter()
      let cancels = AtomicCounter()
      await execOnNewThread {
        race(
          (0..<4).map { thread in
            {
              for index in 0..<300 {
                if (index + thread) % 2 == 0 {
                  _ = loop.sourceSequence(
                    of: Int.self, onSchedule: { _, _ in schedules.increment() }, onCancel: { _ in cancels.increment() })
                } else {
                  let signals = loop.signalSequence(
                    onSchedule: { _, _ in schedules.increment() }, onCancel: { _ in cancels.increment() })
                  signals.signal()
                }
              }
            }
          })
      }
      _ = await r14sPoll {
        (try? loop.performAndWait { loop.core.modeTable.allRecords.count }) == 0
      }
      let records = await execOnNewThread { try? loop.performAndWait { loop.core.modeTable.allRecords.count } }
      let counts = (schedules.current, cancels.current)
      await execShutdown(loop)
      return (counts.0, counts.1, records)
    }
    guard let outcome else { return }
    #expect(outcome.schedules == outcome.cancels, "\(outcome.schedules) schedules, \(outcome.cancels) cancels")
    #expect(outcome.schedules <= 1200)
    #expect(outcome.records == 0)
  }

  /// Promised: a producer and a consumer that both run on the source's own loop (a `.bounded(1)`
  /// buffer, the producer suspending in `send`) pass 2,000 elements in order without deadlocking.
  @Test func aProducerAndAConsumerOnTheSameLoopPassEveryElement() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "same loop") { () async throws -> (Bool, Int) in
      let loop = try RunLoopThread(name: "r14s-same")
      let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(1))
      let consumer = Task(executorPreference: loop) { () -> [Int] in
        var values: [Int] = []
        for await value in sequence { values.append(value) }
        return values
      }
      let refused = await Task(executorPreference: loop) { () -> Int in
        var refused = 0
        for value in 0..<2_000 where await sequence.send(value) != .enqueued { refused += 1 }
        sequence.invalidate()
        return refused
      }.value
      let values = await consumer.value
      await execShutdown(loop)
      return (values == Array(0..<2_000), refused)
    }
    guard let outcome else { return }
    #expect(outcome.0)
    #expect(outcome.1 == 0)
  }

  /// Promised: `invalidate()` from another thread while the consumer waits ends a timer, a
  /// readiness and an activity sequence (their `for await` ends; none hangs).
  @Test func invalidatingFromAnotherThreadEndsEveryKindWhileItsConsumerWaits() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "invalidate kinds") {
      () async throws -> (waited: [Bool], ended: Int) in
      let loop = try RunLoopThread(name: "r14s-invk")
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let timer = loop.timer(every: .seconds(3600))
      let readiness = try loop.readiness(of: pipe.read)
      let activities = loop.activities(.exit)
      let ended = AtomicCounter()
      let tasks = [
        Task(executorPreference: loop) {
          for await _ in timer {}
          ended.increment()
        },
        Task {
          for await _ in readiness {}
          ended.increment()
        },
        Task(executorPreference: loop) {
          for await _ in activities {}
          ended.increment()
        },
      ]
      let waited = [
        await r14sPoll { r14sIsWaiting(timer) }, await r14sPoll { r14sIsWaiting(readiness) },
        await r14sPoll { r14sIsWaiting(activities) },
      ]
      await execOnNewThread {
        timer.invalidate()
        readiness.invalidate()
        activities.invalidate()
      }
      for task in tasks { await task.value }
      let count = ended.current
      await execShutdown(loop)
      return (waited, count)
    }
    guard let outcome else { return }
    #expect(outcome.waited == [true, true, true])
    #expect(outcome.ended == 3)
  }
}

extension ReviewRound14SurfaceExecutorTests {
  /// Promised: a `runModal` whose block the loop accepted is never stranded by the shutdown: the
  /// block (queued behind a busy loop when `shutdown()` comes) runs in the drain, or the call is
  /// refused; either way the caller resumes (a run in the drain ends at once: the loop is
  /// shutting down).
  @Test func aModalRunQueuedWhenTheLoopShutsDownStillResumesItsCaller() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "modal at shutdown") { () async throws -> String in
      let loop = try RunLoopThread(name: "r14s-modal4")
      loop.add(LoopTimer(after: .seconds(3600)) { _ in }, to: r14sModeA)
      let release = await execOnNewThread { blockLoop(loop) }
      let modal = Task { () -> String in
        do {
          return "\(try await loop.runModal(mode: r14sModeA, for: .seconds(20)))"
        } catch {
          return "\(error)"
        }
      }
      // The modal run's block waits in the inbox behind the blocked loop.
      try await Task.sleep(for: .milliseconds(50))
      loop.shutdown()
      release.open()
      let answer = await modal.value
      await execShutdown(loop)
      return answer
    }
    guard let outcome else { return }
    #expect(outcome != "", "\(outcome)")
  }
}

extension ReviewRound14SurfaceSleepTests {
  /// Promised: an actor on a `RunLoopThread.current` loop, whose plain thread runs the loop in
  /// short slices, keeps its one-at-a-time guarantee across the shutdown: the calls running on
  /// the thread and those moved to the fallback once the thread is out of a run never overlap,
  /// every call completes, and the thread is no longer isolated to the loop afterwards.
  @Test func aCurrentLoopsActorNeverOverlapsAcrossTheMoveToTheFallback() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "current loop actor") {
      () async throws -> (most: Int, calls: Int, isolatedAfter: Bool?) in
      let made = Locked<RunLoopThread?>(nil)
      let stop = TestGate()
      let isolatedAfter = Locked<Bool?>(nil)
      let exited = TestGate()
      startThread(detached: true) {
        let loop = RunLoopThread.current
        loop.add(LoopTimer(after: .seconds(3600)) { _ in }, to: .default)  // something to watch
        made.withLock { $0 = loop }
        while !stop.opened {
          _ = loop.run(mode: .default, for: .milliseconds(3))
        }
        isolatedAfter.withLock { $0 = loop.isIsolatingCurrentContext() }
        exited.open()
      }
      _ = await r14sPoll { made.withLock { $0 } != nil }
      guard let loop = made.withLock({ $0 }) else { return (-1, -1, nil) }
      let actor = R14SActor(loop: loop)
      await withTaskGroup(of: Void.self) { group in
        for _ in 0..<8 {
          group.addTask {
            for _ in 0..<20 { await actor.slowCall() }
          }
        }
        group.addTask {
          _ = await r14sPoll { actor.overlap.inside.current > 0 }
          try? await Task.sleep(for: .milliseconds(5))
          loop.shutdown()
        }
      }
      let calls = await actor.calls
      stop.open()
      _ = await execOnNewThread { exited.wait(timeout: .seconds(10)) }
      return (actor.overlap.most.withLock { $0 }, calls, isolatedAfter.withLock { $0 })
    }
    guard let outcome else { return }
    #expect(outcome.most == 1, "\(outcome.most) calls of the actor overlapped")
    #expect(outcome.calls == 160)
    #expect(outcome.isolatedAfter == false)
  }
}

extension ReviewRound14SurfaceExecutorTests {
  /// Promised: jobs are interleaved with the loop's sources and timers (a bounded number per
  /// pass): a task on the loop that yields in a tight loop does not starve a performed block, a
  /// timer, or a signal sequence's consumer (another task on the loop).
  @Test func aYieldingTaskOnTheLoopDoesNotStarveSourcesTimersOrBlocks() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "busy loop") {
      () async throws -> (block: Bool, timer: Bool, signal: Int, spins: Int) in
      let loop = try RunLoopThread(name: "r14s-busy")
      let stop = TestGate()
      let spins = AtomicCounter()
      let spinner = Task(executorPreference: loop) {
        while !stop.opened {
          spins.increment()
          await Task.yield()
        }
      }
      _ = await r14sPoll { spins.current > 100 }
      let block = await execOnNewThread { (try? loop.performAndWait { true }) ?? false }
      let fired = TestGate()
      loop.add(LoopTimer(after: .milliseconds(1)) { _ in fired.open() }, to: .common)
      let timer = await r14sPoll(timeout: .seconds(5)) { fired.opened }
      let signals = loop.signalSequence()
      let consumer = Task(executorPreference: loop) { () -> Int in
        for await count in signals { return count }
        return 0
      }
      signals.signal()
      let signal = await consumer.value
      stop.open()
      await spinner.value
      await execShutdown(loop)
      return (block, timer, signal, spins.current)
    }
    guard let outcome else { return }
    #expect(outcome.block)
    #expect(outcome.timer)
    #expect(outcome.signal == 1)
  }
}

extension ReviewRound14SurfaceExecutorTests {
  /// Promised: each run has its own state: a modal run asked to return after a source fired
  /// (`returnAfterSourceHandled`) does not return `.handledSource` because a source fired in
  /// another task's modal run that the loop nested inside it; it runs to its own limit
  /// (`.timedOut`).
  @Test func aSourceHandledInANestedModalRunDoesNotEndTheOuterOne() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "nested handled source") {
      () async throws -> (outer: String, inner: String) in
      let loop = try RunLoopThread(name: "r14s-modal5")
      let enteredA = TestGate()
      loop.add(LoopObserver(activities: .entry) { _, _ in enteredA.open() }, to: r14sModeA)
      let keepA = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepA, to: r14sModeA)
      let sourceB = InputSource(perform: { _ in })
      loop.add(sourceB, to: r14sModeB)
      let outer = Task { () -> String in
        do {
          return "\(try await loop.runModal(mode: r14sModeA, for: .milliseconds(600), returnAfterSourceHandled: true))"
        } catch { return "\(error)" }
      }
      _ = await r14sPoll { enteredA.opened }
      sourceB.signal()
      let inner = Task { () -> String in
        do {
          return "\(try await loop.runModal(mode: r14sModeB, for: .milliseconds(100), returnAfterSourceHandled: true))"
        } catch { return "\(error)" }
      }
      let innerResult = await inner.value
      let outerResult = await outer.value
      keepA.invalidate()
      sourceB.invalidate()
      await execShutdown(loop)
      return (outerResult, innerResult)
    }
    guard let outcome else { return }
    #expect(outcome.inner == "\(RunLoopRunResult.handledSource)")
    #expect(outcome.outer == "\(RunLoopRunResult.timedOut)")
  }
}

extension R14SActor {
  /// Sleeps (the actor's executor schedules the job on the loop's timers); returns the time slept.
  func sleep(for duration: Duration) async -> Duration {
    let start = ContinuousClock.now
    try? await Task.sleep(for: duration)
    return ContinuousClock.now - start
  }
}

extension ReviewRound14SurfaceExecutorTests {
  /// Promised: jobs run in every mode ("so actors on the loop keep working during a nested modal
  /// run"), and a `Task.sleep` under the loop's preference is one of its jobs, scheduled on its
  /// timers. So a 10 ms `Task.sleep` of a task that prefers the loop, made while another task
  /// holds the loop in a 3 s modal run of a mode outside the common set, completes long before
  /// that run ends (other jobs of the loop do run meanwhile). It does not: the sleep's timer is
  /// added to `.common` only, so the sleeper waits for the whole modal run (for an unlimited
  /// modal run, forever). An actor's sleep on the same loop (the runtime does not schedule it on
  /// the loop's timers) completes on time. (A `loop.clock` sleep is documented to use the common
  /// modes.) Fails every run.
  @Test
  func taskSleepsOnTheLoopCompleteDuringAModalRunOfAnotherMode() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "sleep during modal") {
      () async throws -> (task: Duration, actor: Duration, modalEnded: Bool, yielded: Bool) in
      let loop = try RunLoopThread(name: "r14s-modal6")
      let enteredA = TestGate()
      loop.add(LoopObserver(activities: .entry) { _, _ in enteredA.open() }, to: r14sModeA)
      let keepA = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepA, to: r14sModeA)
      let modalEnded = TestGate()
      let modal = Task {
        _ = try? await loop.runModal(mode: r14sModeA, for: .seconds(3))
        modalEnded.open()
      }
      _ = await r14sPoll { enteredA.opened }
      let yielded = await Task(executorPreference: loop) { () -> Bool in
        await Task.yield()  // a job of the loop runs during the modal run
        return loop.isOnLoopThread
      }.value
      let actor = R14SActor(loop: loop)
      async let actorSlept = actor.sleep(for: .milliseconds(10))
      let taskSlept = await Task(executorPreference: loop) { () -> Duration in
        let start = ContinuousClock.now
        try? await Task.sleep(for: .milliseconds(10))
        return ContinuousClock.now - start
      }.value
      let actorDuration = await actorSlept
      let endedFirst = modalEnded.opened
      await modal.value
      keepA.invalidate()
      await execShutdown(loop)
      return (taskSlept, actorDuration, endedFirst, yielded)
    }
    guard let outcome else { return }
    #expect(outcome.yielded, "no job ran during the modal run")
    #expect(!outcome.modalEnded, "the sleeps ended only after the modal run")
    #expect(outcome.task < .seconds(2), "a 10 ms Task.sleep took \(outcome.task)")
    #expect(outcome.actor < .seconds(2), "an actor's 10 ms Task.sleep took \(outcome.actor)")
  }
}

extension ReviewRound14SurfaceExecutorTests {
  /// Promised: `shutdown()` ends every run of the loop at every nesting level: two tasks' modal
  /// runs (the second nested in the first) both return `.stopped` at the shutdown, long before
  /// their 20 s limits.
  @Test func shutdownEndsNestedModalRunsOfTwoTasks() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "shutdown ends modal runs") {
      () async throws -> [String] in
      let loop = try RunLoopThread(name: "r14s-modal7")
      let enteredA = TestGate()
      let enteredB = TestGate()
      loop.add(LoopObserver(activities: .entry) { _, _ in enteredA.open() }, to: r14sModeA)
      loop.add(LoopObserver(activities: .entry) { _, _ in enteredB.open() }, to: r14sModeB)
      loop.add(LoopTimer(after: .seconds(3600)) { _ in }, to: r14sModeA)
      loop.add(LoopTimer(after: .seconds(3600)) { _ in }, to: r14sModeB)
      let first = Task { () -> String in
        do { return "\(try await loop.runModal(mode: r14sModeA, for: .seconds(20)))" } catch { return "\(error)" }
      }
      _ = await r14sPoll { enteredA.opened }
      let second = Task { () -> String in
        do { return "\(try await loop.runModal(mode: r14sModeB, for: .seconds(20)))" } catch { return "\(error)" }
      }
      _ = await r14sPoll { enteredB.opened }
      await execShutdown(loop)
      return [await first.value, await second.value]
    }
    guard let outcome else { return }
    #expect(outcome == ["\(RunLoopRunResult.stopped)", "\(RunLoopRunResult.stopped)"])
  }
}

extension ReviewRound14SurfaceSleepTests {
  /// Promised: a `loop.clock` sleep never returns before its deadline, whatever its tolerance;
  /// on a loop that has shut down it throws `CancellationError` at once; in a task cancelled
  /// before it sleeps it throws `CancellationError` without waiting.
  @Test func loopClockSleepsAreNeverEarlyAndEndOnShutdownOrCancellation() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "clock sleeps") {
      () async throws -> (early: Int, dead: Bool, precancelled: Bool) in
      let loop = try RunLoopThread(name: "r14s-clock")
      var early = 0
      for index in 0..<20 {
        let deadline = LoopClock.Instant.now.advanced(by: .microseconds(500 + 100 * index))
        try await loop.clock.sleep(until: deadline, tolerance: .milliseconds(index % 3 == 0 ? 0 : 20))
        if LoopClock.Instant.now < deadline { early += 1 }
      }
      let precancelled = await Task { () -> Bool in
        withUnsafeCurrentTask { $0?.cancel() }
        do {
          try await loop.clock.sleep(until: .now.advanced(by: .seconds(60)))
          return false
        } catch { return error is CancellationError }
      }.value
      await execShutdown(loop)
      var dead = false
      do { try await loop.clock.sleep(until: .now.advanced(by: .seconds(60))) } catch {
        dead = error is CancellationError
      }
      return (early, dead, precancelled)
    }
    guard let outcome else { return }
    #expect(outcome.early == 0)
    #expect(outcome.dead)
    #expect(outcome.precancelled)
  }
}

@Suite("ReviewRound14Surface: cancellation races", .serialized, .timeLimit(.minutes(10)))
struct ReviewRound14SurfaceRaceTests {
  /// Promised: a `loop.clock` sleep cancelled at any moment (before it starts, while its timer is
  /// on its way to the loop, or while it waits) throws `CancellationError`, once, and leaves no
  /// timer on the loop: 400 sleeps cancelled right after they start all end, and the loop ends up
  /// holding no record.
  @Test func clockSleepsCancelledAtAnyMomentAllEndAndLeaveNothing() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(40), "cancelled sleeps") {
      () async throws -> (cancelled: Int, total: Int, records: Int?) in
      let loop = try RunLoopThread(name: "r14s-csl")
      var tasks: [Task<Bool, Never>] = []
      for index in 0..<400 {
        let task = Task { () -> Bool in
          do {
            try await loop.clock.sleep(until: .now.advanced(by: .seconds(60)))
            return false
          } catch { return error is CancellationError }
        }
        if index % 4 == 0 { await Task.yield() }
        task.cancel()
        tasks.append(task)
      }
      var cancelled = 0
      for task in tasks where await task.value { cancelled += 1 }
      _ = await r14sPoll(timeout: .seconds(5)) {
        (try? loop.performAndWait { loop.core.modeTable.allRecords.count }) == 0
      }
      let records = await execOnNewThread { try? loop.performAndWait { loop.core.modeTable.allRecords.count } }
      await execShutdown(loop)
      return (cancelled, tasks.count, records)
    }
    guard let outcome else { return }
    #expect(outcome.cancelled == outcome.total)
    #expect(outcome.records == 0, "the loop still holds \(String(describing: outcome.records)) records")
  }

  /// Promised: a consumer cancelled at any moment (before its first `next()`, while it registers,
  /// while it waits) ends, and its source leaves the loop: `onSchedule` and `onCancel` pair up and
  /// the loop holds no record. 300 sequences, each with a consumer cancelled right away while a
  /// thread posts to it.
  @Test func consumersCancelledAtAnyMomentEndAndDetachTheirSources() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(40), "cancelled consumers") {
      () async throws -> (schedules: Int, cancels: Int, records: Int?) in
      let loop = try RunLoopThread(name: "r14s-ccons")
      let schedules = AtomicCounter()
      let cancels = AtomicCounter()
      for round in 0..<300 {
        let sequence = loop.sourceSequence(
          of: Int.self, onSchedule: { _, _ in schedules.increment() }, onCancel: { _ in cancels.increment() })
        let consumer = Task(executorPreference: round % 2 == 0 ? loop : nil) { () -> Int in
          var count = 0
          for await _ in sequence { count += 1 }
          return count
        }
        _ = sequence.post(round)
        if round % 3 == 0 { await Task.yield() }
        consumer.cancel()
        _ = sequence.post(round)
        _ = await consumer.value
      }
      _ = await r14sPoll(timeout: .seconds(5)) {
        (try? loop.performAndWait { loop.core.modeTable.allRecords.count }) == 0
      }
      let records = await execOnNewThread { try? loop.performAndWait { loop.core.modeTable.allRecords.count } }
      let counts = (schedules.current, cancels.current)
      await execShutdown(loop)
      return (counts.0, counts.1, records)
    }
    guard let outcome else { return }
    #expect(outcome.schedules == outcome.cancels, "\(outcome.schedules) schedules, \(outcome.cancels) cancels")
    #expect(outcome.records == 0, "the loop still holds \(String(describing: outcome.records)) records")
  }
}

extension ReviewRound14SurfaceRaceTests {
  /// Promised: a `send` whose task is cancelled while it waits for room answers `.full` and its
  /// element is not taken; the other waiting producers are admitted oldest first, so the
  /// consumer sees the first element, then the remaining senders' elements in the order they
  /// started waiting.
  @Test func aCancelledSenderIsSkippedAndTheOthersKeepTheirOrder() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "cancelled sender") {
      () async throws -> (results: [SourcePostResult], values: [Int]) in
      let loop = try RunLoopThread(name: "r14s-csend")
      let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(1))
      _ = sequence.post(0)
      var senders: [Task<SourcePostResult, Never>] = []
      for value in 1...4 {
        senders.append(Task { await sequence.send(value) })
        _ = await r14sPoll { sequence.waitingProducerCount == value }
      }
      senders[1].cancel()  // the producer of 2
      _ = await r14sPoll { sequence.waitingProducerCount == 3 }
      var values: [Int] = []
      var iterator = sequence.makeAsyncIterator()
      while values.count < 4, let value = await iterator.next() { values.append(value) }
      var results: [SourcePostResult] = []
      for sender in senders { results.append(await sender.value) }
      sequence.invalidate()
      while let value = await iterator.next() { values.append(value) }
      await execShutdown(loop)
      return (results, values)
    }
    guard let outcome else { return }
    #expect(outcome.results == [.enqueued, .full, .enqueued, .enqueued])
    #expect(outcome.values == [0, 1, 3, 4])
  }
}

extension ReviewRound14SurfaceRaceTests {
  /// Promised: after the last signal at least one element is always delivered: a consumer that
  /// signals, then waits for the next element, 2,000 times (on the loop, and off it), while a
  /// thread signals in bursts, is never left waiting; the elements add up to every signal made.
  @Test(arguments: [true, false])
  func everySignalIsFollowedByAnElement(consumerOnLoop: Bool) async throws {
    let outcome = try await withWatchdog(timeout: .seconds(40), "signal then element") {
      () async throws -> (received: Int, sent: Int) in
      let loop = try RunLoopThread(name: "r14s-sigel")
      let signals = loop.signalSequence()
      let sent = AtomicCounter()
      let stop = TestGate()
      let noiseDone = TestGate()
      startThread(detached: true) {
        while !stop.opened {
          for _ in 0..<10 where signals.signal() { sent.increment() }
          usleep(50)
        }
        noiseDone.open()
      }
      let received = await Task(executorPreference: consumerOnLoop ? loop : nil) { () -> Int in
        var received = 0
        var iterator = signals.makeAsyncIterator()
        for _ in 0..<2_000 {
          if signals.signal() { sent.increment() }
          guard let count = await iterator.next() else { return -1 }
          received += count
        }
        stop.open()
        _ = await r14sPoll { noiseDone.opened }
        // The rest, after the invalidation: every signal made is delivered.
        signals.invalidate()
        while let count = await iterator.next() { received += count }
        return received
      }.value
      await execShutdown(loop)
      return (received, sent.current)
    }
    guard let outcome else { return }
    #expect(outcome.received == outcome.sent, "received \(outcome.received) of \(outcome.sent) signals")
  }
}
