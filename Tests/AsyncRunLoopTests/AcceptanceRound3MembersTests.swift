import Glibc
import Testing

@testable import AsyncRunLoop

/// Acceptance round 3 (members): the promises of the member doc comments (CommandSource,
/// InputSource, the member lifecycle, nested runs from every callout, async sequences, leaks),
/// each written as the interleaving that would break it. Public API only, except where a test
/// must name a constant.
@Suite("AcceptanceRound3Members", .timeLimit(.minutes(10)))
struct AcceptanceRound3Members {
  typealias Log = EventLog

  /// Lets the loop apply what was sent before and make one more pass.
  static func settle(_ loop: RunLoopThread) throws {
    _ = try loop.performAndWait { 0 }
    _ = try loop.performAndWait { 0 }
  }

  // MARK: - CommandSource: nothing accepted is lost

  /// CommandSource: "Commands posted while the source is on no loop (after its removal from its
  /// last mode) wait for its next add; if it is invalidated instead, the loop it was last on
  /// delivers them." An add refused by a terminated loop invalidates the source (documented in
  /// `RunLoopThread+Members`); the loop it was last *on* is still alive and must deliver.
  @Test func commandsPostedWhileUnboundSurviveARefusedAddToATerminatedLoop() throws {
    let alive = try RunLoopThread(name: "ar3-alive")
    defer { alive.shutdownAndWait() }
    let dead = try RunLoopThread(name: "ar3-dead")
    dead.shutdownAndWait()
    let log = Log()
    let command = CommandSource<Int>(cancel: { _, loop in log.add("cancel@\(loop.name)") }) { value in
      log.add("cmd\(value)")
    }
    alive.add(command.source)
    try Self.settle(alive)
    alive.remove(command.source)
    try Self.settle(alive)
    #expect(log.snapshot == ["cancel@ar3-alive"])
    #expect(command.post(1), "the source is valid and on no loop: the post is accepted")
    dead.add(command.source)  // refused: the loop terminated; the source is invalidated
    #expect(!command.source.isValid)
    #expect(!command.post(2))
    _ = waitUntil(timeout: .seconds(5), "the accepted command delivered") { log.count("cmd1") == 1 }
    try Self.settle(alive)
    #expect(log.snapshot == ["cancel@ar3-alive", "cmd1"], "pending: \(command.pendingCount)")
  }

  /// A source moved to another loop while its old loop is still delivering a batch: the old
  /// loop's handler call and the new loop's deliveries must not overlap (the handler runs once
  /// per command, in posting order; the buffer's delivery queue is loop-thread state that two
  /// threads must never share).
  @Test func aMovedCommandSourceIsNotDeliveredOnTwoThreadsAtOnce() async throws {
    let loopA = try RunLoopThread(name: "ar3-move-a")
    let loopB = try RunLoopThread(name: "ar3-move-b")
    defer {
      loopA.shutdownAndWait()
      loopB.shutdownAndWait()
    }
    let log = Log()
    let inFirst = TestGate()
    let releaseFirst = TestGate()
    let command = CommandSource<Int> { value in
      let here = RunLoopThread.currentIfExists?.name ?? "?"
      log.add("start\(value)@\(here)")
      if value == 1 {
        inFirst.open()
        _ = releaseFirst.wait(timeout: .seconds(20))
      }
      log.add("end\(value)")
    }
    #expect(command.post(1))
    #expect(command.post(2))  // one batch with 1 (both wait for the add)
    loopA.add(command.source)
    let observed = try await withWatchdogOnThread(timeout: .seconds(30), "moved source") { () -> [String] in
      _ = inFirst.wait(timeout: .seconds(20))
      loopA.remove(command.source)  // its last mode: free to move at once
      loopB.add(command.source)
      _ = command.post(3)
      try Self.settle(loopB)  // B applied the add and fired the source
      let duringFirst = log.snapshot
      releaseFirst.open()
      _ = waitUntil(timeout: .seconds(10), "every command") { log.snapshot.filter { $0.hasPrefix("end") }.count == 3 }
      try Self.settle(loopA)
      try Self.settle(loopB)
      return duringFirst
    }
    guard let observed else { return }
    #expect(observed == ["start1@ar3-move-a"], "nothing else may start while command 1's handler runs")
    let ends = log.snapshot.filter { $0.hasPrefix("end") }
    #expect(ends == ["end1", "end2", "end3"], "log: \(log.snapshot)")
    command.source.invalidate()
  }

  /// A moving source, stressed: one thread moves a CommandSource between two loops (removing it
  /// from its last mode first, as the docs require) while another posts. Every accepted command
  /// is delivered exactly once, in posting order, and the handler never runs on two threads at
  /// once; each loop calls cancel once per schedule.
  @Test func aCommandSourceMovedBackAndForthWhilePostedToDeliversEachCommandOnce() async throws {
    let loops = [try RunLoopThread(name: "ar3-pp-a"), try RunLoopThread(name: "ar3-pp-b")]
    defer { for loop in loops { loop.shutdownAndWait() } }
    let delivered = Guarded<[Int]>([])
    let inHandler = AtomicCounter()
    let overlaps = AtomicCounter()
    let schedules = Guarded<[String: Int]>([:])
    let cancels = Guarded<[String: Int]>([:])
    let command = CommandSource<Int>(
      schedule: { _, loop, _ in schedules.withLock { $0[loop.name, default: 0] += 1 } },
      cancel: { _, loop in cancels.withLock { $0[loop.name, default: 0] += 1 } }
    ) { value in
      if inHandler.increment() != 1 { overlaps.increment() }
      delivered.withLock { $0.append(value) }
      for _ in 0..<50 { sched_yield() }  // widen the window in which the source moves
      inHandler.value.subtract(1, ordering: .sequentiallyConsistent)
    }
    loops[0].add(command.source)
    let accepted = try await withWatchdogOnThread(timeout: .seconds(30), "move and post") { () -> Int in
      let posted = Guarded(0)
      race([
        {
          for round in 0..<200 {
            loops[round % 2].remove(command.source)
            loops[(round + 1) % 2].add(command.source)
            if round % 16 == 0 { usleep(200) }
          }
        },
        {
          for value in 0..<2_000 where command.post(value) { posted.withLock { $0 += 1 } }
        },
      ])
      command.source.invalidate()
      for loop in loops { try Self.settle(loop) }
      return posted.snapshot
    }
    guard let accepted else { return }
    #expect(accepted == 2_000)
    #expect(delivered.snapshot == Array(0..<2_000), "count \(delivered.snapshot.count)")
    #expect(overlaps.current == 0)
    #expect(schedules.snapshot == cancels.snapshot, "schedules \(schedules.snapshot), cancels \(cancels.snapshot)")
  }

  /// CommandSource: "every command that post accepted is delivered exactly once", also when the
  /// invalidation races the posts, and all of them before `cancel`.
  @Test func postsRacingInvalidateAreDeliveredExactlyOnceBeforeCancel() async throws {
    let loop = try RunLoopThread(name: "ar3-post-inv")
    defer { loop.shutdownAndWait() }
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "posts vs invalidate") {
      () -> [(accepted: Int, delivered: Int, afterCancel: Int, cancels: Int)] in
      var results: [(Int, Int, Int, Int)] = []
      repeatRounds(40, budget: .milliseconds(600)) { _ in
        let delivered = Guarded(0)
        let cancelled = Guarded(0)
        let afterCancel = Guarded(0)
        let command = CommandSource<Int>(cancel: { _, _ in cancelled.withLock { $0 += 1 } }) { _ in
          delivered.withLock { $0 += 1 }
          if cancelled.snapshot > 0 { afterCancel.withLock { $0 += 1 } }
        }
        loop.add(command.source)
        let accepted = Guarded(0)
        let producer: @Sendable () -> Void = {
          for value in 0..<300 where command.post(value) { accepted.withLock { $0 += 1 } }
        }
        race([
          producer, producer,
          {
            usleep(50); command.source.invalidate()
          },
        ])
        _ = waitUntil(timeout: .seconds(10), "cancel") { cancelled.snapshot == 1 }
        results.append((accepted.snapshot, delivered.snapshot, afterCancel.snapshot, cancelled.snapshot))
      }
      return results
    }
    for result in outcome ?? [] {
      #expect(result.delivered == result.accepted)
      #expect(result.afterCancel == 0)
      #expect(result.cancels == 1)
    }
  }

  /// The same, with the loop's shutdown (or the drop of its last reference) racing the posts.
  @Test(arguments: [false, true])
  func postsRacingTheEndOfTheLoopAreDeliveredExactlyOnce(dropInsteadOfShutdown: Bool) async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "posts vs end of loop") {
      () -> [(accepted: Int, delivered: Int, cancels: Int, freed: Bool)] in
      var results: [(Int, Int, Int, Bool)] = []
      try repeatRounds(20, budget: .milliseconds(600)) { _ in
        let delivered = Guarded(0)
        let cancelled = Guarded(0)
        let weak = ExecWeakLoop()
        let command = CommandSource<Int>(cancel: { _, _ in cancelled.withLock { $0 += 1 } }) { _ in
          delivered.withLock { $0 += 1 }
        }
        let accepted = Guarded(0)
        let producer: @Sendable () -> Void = {
          for value in 0..<300 where command.post(value) { accepted.withLock { $0 += 1 } }
        }
        try Self.endLoopWhilePosting(
          weak: weak, command: command, drop: dropInsteadOfShutdown, producers: [producer, producer])
        _ = waitUntil(timeout: .seconds(10), "cancel") { cancelled.snapshot == 1 }
        _ = waitUntil(timeout: .seconds(10), "loop freed") { weak.isGone }
        results.append((accepted.snapshot, delivered.snapshot, cancelled.snapshot, weak.isGone))
      }
      return results
    }
    for result in outcome ?? [] {
      #expect(result.delivered == result.accepted)
      #expect(result.cancels == 1)
      #expect(result.freed)
    }
  }

  private static func endLoopWhilePosting(
    weak: ExecWeakLoop, command: CommandSource<Int>, drop: Bool, producers: [@Sendable () -> Void]
  ) throws {
    let holder = Guarded<RunLoopThread?>(try RunLoopThread(name: "ar3-end"))
    guard let loop = holder.snapshot else { return }
    weak.set(loop)
    loop.add(command.source, to: .common)
    _ = try loop.performAndWait { 0 }
    let ender: @Sendable () -> Void = {
      usleep(50)
      if drop {
        holder.withLock { $0 = nil }  // the last reference: the loop shuts itself down
      } else {
        holder.snapshot?.shutdown()
        holder.withLock { $0 = nil }
      }
    }
    race(producers + [ender])
  }

  // MARK: - Nested runs

  /// "A timer never fires inside its own callout (a nested run in another of its modes skips
  /// it)". Skipping must not make the nested run spin: the timer is due but cannot fire, so a
  /// nested run of 100 ms in that other mode, with nothing else to do, should sleep, not make a
  /// pass per wake-up of an immediately expiring timerfd. (A bound on passes, not on time: a
  /// slower machine makes fewer passes, not more.)
  @Test
  func aRunNestedInATimerCalloutInAnotherOfItsModesDoesNotSpinOnTheSkippedTimer() async throws {
    let loop = try RunLoopThread(name: "ar3-timer-spin")
    defer { loop.shutdownAndWait() }
    let other: RunLoopMode = "ar3-other"
    let passes = AtomicCounter()
    let nested = Guarded<RunLoopRunResult?>(nil)
    let counter = LoopObserver(activities: .beforeTimers) { _, _ in passes.increment() }
    let timer = LoopTimer(after: .zero, repeatingEvery: .seconds(3600)) { _ in
      guard nested.snapshot == nil else { return }
      let result = loop.run(mode: other, for: .milliseconds(100))
      nested.withLock { $0 = result }
    }
    try loop.performAndWait {
      loop.add(counter, to: other)
      loop.add(timer, to: .default)
      loop.add(timer, to: other)
    }
    #expect(await eventually("the nested run ended") { nested.snapshot != nil })
    #expect(nested.snapshot == .timedOut)
    #expect(passes.current < 50, "the nested run made \(passes.current) passes in 100 ms")
    timer.invalidate()
    counter.invalidate()
  }

  /// A run nested in a timer's callout takes the timer's entry in the nested mode out of that
  /// mode's heap while the callout runs; when the callout then removes the timer from the mode it
  /// fired in, the timer still fires in its other mode afterwards (the entry comes back).
  @Test func aTimerSkippedByANestedRunAndRemovedByItsCalloutStillFiresInItsOtherMode() throws {
    let loop = try RunLoopThread(name: "ar3-timer-parked")
    defer { loop.shutdownAndWait() }
    let other: RunLoopMode = "ar3-parked-other"
    let fires = AtomicCounter()
    let timer = LoopTimer(after: .zero, repeatingEvery: .milliseconds(20)) { timer in
      fires.increment()
      guard fires.current == 1 else { return }
      loop.run(mode: other, for: .milliseconds(30))  // skips this timer (its callout is running)
      loop.remove(timer, from: .default)
    }
    try loop.performAndWait {
      loop.add(timer, to: .default)
      loop.add(timer, to: other)
    }
    #expect(waitUntil(timeout: .seconds(5)) { fires.current >= 1 })
    let result = try loop.performAndWait { () -> Int in
      let before = fires.current
      loop.run(mode: other, for: .milliseconds(300))
      return fires.current - before
    }
    #expect(result >= 1, "the timer never fired in its other mode again")
    timer.invalidate()
  }

  // MARK: - Async sequences: endings, and nothing left behind

  /// A weak reference, readable from any thread.
  final class WeakBox<Object: AnyObject>: @unchecked Sendable {
    // Safety: written once before it is shared; Swift's weak references are safe to read while
    // another thread releases the object.
    weak var object: Object?
    init(_ object: Object?) { self.object = object }
    var isGone: Bool { object == nil }
  }

  enum SequenceKind: String, CaseIterable, Sendable {
    case source, signal, timer, readiness, activity
  }

  enum Ending: String, CaseIterable, Sendable {
    case breakAfterFirst, cancelWhileWaiting, invalidateWhileWaiting, shutdownWhileWaiting
  }

  /// Makes a sequence of `kind` on `loop`, starts its consumer (which records every element and
  /// breaks after the first when asked), and returns a weak reference to the sequence, a way to
  /// make it produce, a way to invalidate it, and the consumer task. The sequence itself is only
  /// held by the consumer (the closures hold it weakly).
  static func startConsumer(
    _ kind: SequenceKind, on loop: RunLoopThread, pipe: (read: Int32, write: Int32), breakAfterFirst: Bool,
    cancels: AtomicCounter, elements: AtomicCounter
  ) throws -> (
    weak: WeakBox<AnyObject>, produce: @Sendable () -> Void, invalidate: @Sendable () -> Void, task: Task<Void, Never>
  ) {
    func consume<S: AsyncSequence & Sendable>(_ sequence: S) -> Task<Void, Never> where S.Failure == Never {
      Task {
        for await _ in sequence {
          elements.increment()
          if breakAfterFirst { break }
        }
      }
    }
    switch kind {
    case .source:
      let sequence = loop.sourceSequence(of: Int.self, onCancel: { _ in cancels.increment() })
      return (
        WeakBox(sequence), { [weak sequence] in _ = sequence?.post(1) }, { [weak sequence] in sequence?.invalidate() },
        consume(sequence)
      )
    case .signal:
      let sequence = loop.signalSequence(onCancel: { _ in cancels.increment() })
      return (
        WeakBox(sequence), { [weak sequence] in sequence?.signal() }, { [weak sequence] in sequence?.invalidate() },
        consume(sequence)
      )
    case .timer:
      let sequence = loop.timer(every: .milliseconds(1))
      return (WeakBox(sequence), {}, { [weak sequence] in sequence?.invalidate() }, consume(sequence))
    case .readiness:
      let sequence = try loop.readiness(of: pipe.read)
      return (
        WeakBox(sequence), { writeByte(pipe.write) }, { [weak sequence] in sequence?.invalidate() }, consume(sequence)
      )
    case .activity:
      let sequence = loop.activities([.afterWaiting])
      return (
        WeakBox(sequence), { [weak loop] in loop?.wakeUp() }, { [weak sequence] in sequence?.invalidate() },
        consume(sequence)
      )
    }
  }

  /// Every kind of sequence, ended every way while its consumer iterates: the consumer ends (no
  /// hung task), a source's `onCancel` runs once, and the sequence, its member and the loop are
  /// freed once the consumer is gone.
  @Test(arguments: SequenceKind.allCases, Ending.allCases)
  func everySequenceEndsAndIsFreedHoweverItsConsumerStops(_ kind: SequenceKind, _ ending: Ending) async throws {
    let pipe = makePipe()
    defer {
      close(pipe.read)
      close(pipe.write)
    }
    let cancels = AtomicCounter()
    let elements = AtomicCounter()
    let loopBox = Guarded<RunLoopThread?>(try RunLoopThread(name: "ar3-seq-\(kind.rawValue)"))
    let weakLoop = WeakBox<RunLoopThread>(loopBox.snapshot)
    let (weak, produce, invalidate, task) = try Self.startConsumer(
      kind, on: loopBox.snapshot!, pipe: pipe, breakAfterFirst: ending == .breakAfterFirst, cancels: cancels,
      elements: elements)
    let ended = try await withWatchdog(timeout: .seconds(20), "\(kind) consumer, \(ending)") { () -> Bool in
      switch ending {
      case .breakAfterFirst:
        while elements.current == 0 {
          produce()
          try? await Task.sleep(for: .milliseconds(2))
        }
      case .cancelWhileWaiting:
        try? await Task.sleep(for: .milliseconds(5))
        task.cancel()
      case .invalidateWhileWaiting:
        try? await Task.sleep(for: .milliseconds(5))
        invalidate()
      case .shutdownWhileWaiting:
        try? await Task.sleep(for: .milliseconds(5))
        loopBox.snapshot?.shutdown()
      }
      await task.value
      return true
    }
    #expect(ended == true)
    if kind == .source || kind == .signal {
      #expect(await eventually("onCancel") { cancels.current == 1 })
      #expect(cancels.current == 1)
    }
    #expect(await eventually("the sequence freed") { weak.isGone })
    loopBox.snapshot?.shutdownAndWait()
    loopBox.withLock { $0 = nil }
    #expect(await eventually("the loop freed") { weakLoop.isGone })
  }

  /// LoopObserver: "a one-shot observer invalidates itself after its first callout". A callout
  /// that runs the loop nested (any callout may) must not be told again by that nested run: a
  /// one-shot observer is told once. (CF does not tell an observer inside its own callout.)
  @Test func aOneShotObserverWhoseCalloutRunsTheLoopNestedIsToldOnce() async throws {
    let loop = try RunLoopThread(name: "ar3-oneshot-obs")
    defer { loop.shutdownAndWait() }
    let keeper = LoopTimer(after: .seconds(3600)) { _ in }  // the nested run has something to watch
    let calls = AtomicCounter()
    let results = Guarded<[RunLoopRunResult]>([])
    let observer = LoopObserver(activities: [.entry, .beforeWaiting], repeats: false) { _, _ in
      guard calls.increment() <= 3 else { return }  // bounded, should it be told again
      let result = loop.run(mode: .default, for: .milliseconds(20))
      results.withLock { $0.append(result) }
    }
    try loop.performAndWait {
      loop.add(keeper)
      loop.add(observer)
    }
    loop.wakeUp()
    #expect(await eventually("the callout's nested run ended") { !results.snapshot.isEmpty && !observer.isValid })
    try Self.settle(loop)
    #expect(calls.current == 1, "told \(calls.current) times; nested results \(results.snapshot)")
    #expect(!observer.isValid)
    keeper.invalidate()
  }

  /// A repeating observer is never told inside its own callout either: a run nested in it tells
  /// the other observers, not this one; and after the callout it is told again as usual.
  @Test func aRepeatingObserverIsNotToldInsideItsOwnCalloutButOtherObserversAre() throws {
    let loop = try RunLoopThread(name: "ar3-repeat-obs")
    defer { loop.shutdownAndWait() }
    let other: RunLoopMode = "ar3-repeat-obs-other"
    let depth = Guarded(0)
    let reentered = AtomicCounter()
    let calls = AtomicCounter()
    let othersTold = AtomicCounter()
    let observer = LoopObserver(activities: .entry) { _, _ in
      if depth.withLock({
        $0 += 1; return $0
      }) > 1 {
        reentered.increment()
      }
      if calls.increment() == 1 { loop.run(mode: other, for: .milliseconds(5)) }
      depth.withLock { $0 -= 1 }
    }
    let bystander = LoopObserver(activities: .entry) { _, _ in othersTold.increment() }
    try loop.performAndWait {
      loop.add(LoopTimer(after: .seconds(3600)) { _ in }, to: other)
      loop.add(observer, to: other)
      loop.add(bystander, to: other)
      loop.run(mode: other, for: .milliseconds(5))  // tells both; the observer's callout nests
      loop.run(mode: other, for: .milliseconds(5))  // and again, after its callout
    }
    #expect(reentered.current == 0)
    #expect(calls.current == 2, "told \(calls.current) times")
    #expect(othersTold.current == 3, "the bystander was told \(othersTold.current) times")
    observer.invalidate()
    bystander.invalidate()
  }

  // MARK: - The end of a thread's own loop

  /// `RunLoopThread.current`: "when the thread exits, the loop terminates". A CommandSource on
  /// such a loop still delivers what `post` accepted (the loop's drain, on the exiting thread),
  /// calls cancel exactly once, on that loop, and refuses later posts; the loop is freed.
  @Test func aThreadsOwnLoopDeliversAcceptedCommandsWhenTheThreadExits() throws {
    let delivered = Guarded<[Int]>([])
    let cancels = Guarded<[String]>([])
    let onLoopThread = Guarded<[Bool]>([])
    let ready = TestGate()
    let exit = TestGate()
    let weakLoop = WeakBox<RunLoopThread>(nil)
    let command = CommandSource<Int>(cancel: { _, loop in cancels.withLock { $0.append(loop.name) } }) { value in
      delivered.withLock { $0.append(value) }
      onLoopThread.withLock { $0.append(weakLoop.object?.isOnLoopThread ?? false) }
    }
    let name = Guarded("")
    let thread = startThread {
      let loop = RunLoopThread.current
      weakLoop.object = loop
      name.withLock { $0 = loop.name }
      loop.add(command.source)
      loop.run(mode: .default, for: .milliseconds(1))
      ready.open()
      _ = exit.wait(timeout: .seconds(20))
    }  // the thread exits without running its loop again
    _ = ready.wait(timeout: .seconds(20))
    var accepted = 0
    for value in 0..<10 where command.post(value) { accepted += 1 }
    exit.open()
    joinThread(thread)
    _ = waitUntil(timeout: .seconds(10), "cancel") { cancels.snapshot.count == 1 }
    #expect(accepted == 10)
    #expect(delivered.snapshot == Array(0..<10))
    #expect(cancels.snapshot == [name.snapshot])
    #expect(onLoopThread.snapshot == Array(repeating: true, count: 10), "delivered on the loop's thread")
    #expect(!command.post(99))
    #expect(waitUntil(timeout: .seconds(10), "the loop freed") { weakLoop.isGone })
  }

  /// InputSource: "schedule and cancel always come in pairs", cancel "exactly once per
  /// schedule", also when a move to another loop races the invalidation and the old loop's
  /// shutdown (or the drop of its last reference). Commands accepted are delivered once.
  @Test(arguments: [false, true])
  func scheduleAndCancelPairUpWhenAMoveRacesInvalidationAndTheOldLoopsEnd(drop: Bool) async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(40), "move vs invalidate vs end") {
      () -> [(schedules: [String: Int], cancels: [String: Int], accepted: Int, delivered: Int)] in
      var results: [([String: Int], [String: Int], Int, Int)] = []
      try repeatRounds(30, budget: .milliseconds(800)) { round in
        let schedules = Guarded<[String: Int]>([:])
        let cancels = Guarded<[String: Int]>([:])
        let delivered = Guarded(0)
        let accepted = Guarded(0)
        let command = CommandSource<Int>(
          schedule: { _, loop, _ in schedules.withLock { $0[loop.name, default: 0] += 1 } },
          cancel: { _, loop in cancels.withLock { $0[loop.name, default: 0] += 1 } }
        ) { _ in delivered.withLock { $0 += 1 } }
        let oldLoop = Guarded<RunLoopThread?>(try RunLoopThread(name: "ar3-old"))
        let newLoop = try RunLoopThread(name: "ar3-new")
        oldLoop.snapshot?.add(command.source)
        for value in 0..<20 where command.post(value) { accepted.withLock { $0 += 1 } }
        let mover: @Sendable () -> Void = {
          guard let old = oldLoop.snapshot else { return }
          old.remove(command.source)
          newLoop.add(command.source)
        }
        let invalidator: @Sendable () -> Void = {
          for _ in 0..<(round % 5) { sched_yield() }
          command.source.invalidate()
        }
        let ender: @Sendable () -> Void = {
          if drop { oldLoop.withLock { $0 = nil } } else { oldLoop.snapshot?.shutdown() }
        }
        let poster: @Sendable () -> Void = {
          for value in 0..<50 where command.post(value) { accepted.withLock { $0 += 1 } }
        }
        race([mover, invalidator, ender, poster])
        oldLoop.snapshot?.shutdownAndWait()
        oldLoop.withLock { $0 = nil }
        try Self.settle(newLoop)
        newLoop.shutdownAndWait()
        // A dropped loop drains on its own thread, without anyone waiting for it (it may not even
        // have scheduled the source yet): wait for its deliveries too, not only for the pairs.
        _ = waitUntil(timeout: .seconds(10), "cancels match schedules, every accepted command delivered") {
          cancels.snapshot == schedules.snapshot && delivered.snapshot == accepted.snapshot
        }
        results.append((schedules.snapshot, cancels.snapshot, accepted.snapshot, delivered.snapshot))
      }
      return results
    }
    for result in outcome ?? [] {
      #expect(result.schedules == result.cancels)
      #expect(result.delivered == result.accepted)
    }
  }

  /// InputSource: "An add made before an invalidation is still scheduled (and then cancelled)".
  /// Here the add to the old loop waits in its inbox while the source moves on: the new loop
  /// applies its add and the invalidation first, and, being the only loop holding the source at
  /// that moment, releases the routines. The old loop then applies the add it was sent first and
  /// finds no schedule routine (nor a cancel routine): the pairs still match (0 and 0), but that
  /// add was never scheduled.
  @Test
  func anAddStillInTheOldLoopsInboxIsScheduledAfterTheSourceMovedAndWasInvalidated() throws {
    let oldLoop = try RunLoopThread(name: "ar3-inbox-old")
    let newLoop = try RunLoopThread(name: "ar3-inbox-new")
    defer {
      oldLoop.shutdownAndWait()
      newLoop.shutdownAndWait()
    }
    let log = Log()
    let source = InputSource(
      schedule: { _, loop, _ in log.add("schedule@\(loop.name)") },
      cancel: { _, loop in log.add("cancel@\(loop.name)") }, perform: { _ in })
    let release = blockLoop(oldLoop)
    oldLoop.add(source)  // waits in the old loop's inbox
    oldLoop.remove(source)
    newLoop.add(source)
    source.invalidate()
    try Self.settle(newLoop)
    release.open()
    try Self.settle(oldLoop)
    #expect(log.count("schedule@ar3-inbox-new") == 1)
    #expect(log.count("cancel@ar3-inbox-new") == 1)
    #expect(log.count("schedule@ar3-inbox-old") == 1, "log: \(log.snapshot)")
    #expect(log.count("cancel@ar3-inbox-old") == 1, "log: \(log.snapshot)")
  }

  // MARK: - .common and named modes

  /// The binding and the loop agree on when a member has left its loop, through `.common` too:
  /// removing `.default` by name from a member added to `.common` leaves it on the loop (no
  /// cancel; a mode joining the common set later still receives it), removing `.common` from a
  /// member added to `.default` by name leaves it in `.default`, and only removing the last name
  /// ends it there (cancel once) and lets it move.
  @Test(arguments: [true, false])
  func aMemberLeavesItsLoopWhenItsLastModeNameIsRemovedCommonIncluded(addedToCommon: Bool) throws {
    let loopA = try RunLoopThread(name: "ar3-common-a")
    let loopB = try RunLoopThread(name: "ar3-common-b")
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
      loopA.addModeToCommonModes("ar3-late")
      #expect(command.post(1))
      let result = try loopA.performAndWait {
        loopA.run(mode: "ar3-late", for: .milliseconds(200), returnAfterSourceHandled: true)
      }
      #expect(result == .handledSource)
    } else {
      #expect(command.post(1))  // still in .default, where the owned loop runs
    }
    #expect(waitUntil(timeout: .seconds(5)) { log.count("cmd1@ar3-common-a") == 1 })
    loopA.remove(command.source, from: first)  // its last name: it leaves the loop
    try Self.settle(loopA)
    #expect(log.snapshot == ["cmd1@ar3-common-a", "cancel@ar3-common-a"])
    loopB.add(command.source)  // free to move
    #expect(command.post(2))
    #expect(waitUntil(timeout: .seconds(5)) { log.count("cmd2@ar3-common-b") == 1 })
    #expect(log.snapshot == ["cmd1@ar3-common-a", "cancel@ar3-common-a", "cmd2@ar3-common-b"])
  }

}
