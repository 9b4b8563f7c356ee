import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

/// A sequence ends once, however it ends, and frees what it holds.
@Suite("A sequence ends once, however it ends, and frees what it holds", .timeLimit(.minutes(10)))
struct SequenceEndTests: MemberPromiseSettling, SequenceTestModes {
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
    let loopBox = Guarded<RunLoopThread?>(try RunLoopThread(name: "seq-\(kind.rawValue)"))
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

  /// A source sequence dropped (never iterated) with elements buffered: the elements and its
  /// `onSchedule`/`onCancel` closures are released and `onCancel` runs once.
  @Test func aDroppedSourceSequenceReleasesItsBufferAndRoutines() async throws {
    let loop = try RunLoopThread(name: "seq-drop")
    let deaths = AtomicCounter()
    let cancels = AtomicCounter()
    let scheduled = AtomicCounter()
    do {
      let canary = ReleaseCanary(deaths)
      let sequence = loop.sourceSequence(
        of: ReleaseCanary.self,
        onSchedule: { _, _ in
          canary.touch()
          scheduled.increment()
        },
        onCancel: { _ in
          canary.touch()
          cancels.increment()
        })
      for _ in 0..<3 { #expect(sequence.post(ReleaseCanary(deaths)).isEnqueued) }
      #expect(await eventuallyWithin { scheduled.current == 1 })
    }
    #expect(await eventuallyWithin { deaths.current == 4 }, "released \(deaths.current) of 4")
    #expect(await eventuallyWithin { cancels.current == 1 })
    await execShutdown(loop)
    #expect(cancels.current == 1)
  }

  /// A consumer of a source sequence cancelled while it waits in `next()` (and, in the other
  /// case, before its first `next()`): the sequence ends, `onCancel` runs once and everything it
  /// captured is released once the sequence itself is dropped.
  @Test(arguments: [false, true])
  func aCancelledConsumerLetsGoOfEverything(cancelWhileWaiting: Bool) async throws {
    let loop = try RunLoopThread(name: "seq-cancel")
    let deaths = AtomicCounter()
    let cancels = AtomicCounter()
    let received = AtomicCounter()
    let scheduled = AtomicCounter()
    let started = TestGate()
    let consumer: Task<Void, Never>
    do {
      let canary = ReleaseCanary(deaths)
      let sequence = loop.sourceSequence(
        of: ReleaseCanary.self,
        onSchedule: { _, _ in
          canary.touch()
          scheduled.increment()
        },
        onCancel: { _ in
          canary.touch()
          cancels.increment()
        })
      #expect(sequence.post(ReleaseCanary(deaths)).isEnqueued)
      consumer = Task(executorPreference: loop) {
        started.open()
        if !cancelWhileWaiting {
          while !Task.isCancelled { await Task.yield() }
        }
        for await element in sequence {
          element.touch()
          received.increment()
        }
      }
    }
    _ = await execOnNewThread { started.wait(timeout: .seconds(10)) }
    if cancelWhileWaiting { #expect(await eventuallyWithin { received.current == 1 }) }
    consumer.cancel()
    _ = try await withWatchdog(timeout: .seconds(20), "the cancelled consumer") { await consumer.value }
    #expect(await eventuallyWithin { cancels.current == 1 })
    #expect(await eventuallyWithin { deaths.current == 2 }, "released \(deaths.current) of 2")
    await execShutdown(loop)
    #expect(cancels.current == 1)
  }

  /// The test drops its loop while a consumer waits on one of the loop's source sequences, with
  /// elements buffered behind a busy loop. The sequence holds its loop (`SourceSequence.loop`), so
  /// the loop lives on: the consumer gets every accepted element once, in order. Cancelling the
  /// consumer then ends it, and with the sequence gone the loop goes too (its poller is released).
  @Test func aSequenceOfADroppedLoopDeliversThenLetsTheLoopGoWhenItsConsumerIsCancelled() async throws {
    var loop: RunLoopThread? = try RunLoopThread(name: "seq-loopdrop")
    weak let weakPoller = loop?.shared.poller
    let received = Guarded<[Int]>([])
    let consumer: Task<Void, Never>
    do {
      let sequence = loop!.sourceSequence(of: Int.self)
      consumer = Task {
        for await element in sequence { received.withLock { $0.append(element) } }
      }
      let release = await execOnNewThread { [loop] in blockLoop(loop!) }
      for index in 0..<20 { #expect(sequence.post(index).isEnqueued) }
      loop = nil
      release.open()
    }
    #expect(await eventuallyWithin { received.snapshot.count >= 20 })
    #expect(received.snapshot == Array(0..<20))
    consumer.cancel()
    _ = try await withWatchdog(timeout: .seconds(20), "the cancelled consumer") { await consumer.value }
    #expect(await eventuallyWithin { weakPoller == nil }, "the loop outlived its last sequence")
  }

  /// `SourceSequence`, "How it ends": "The consuming task is cancelled [...]: the sequence ends
  /// at once (`next()` returns nil), buffered elements are discarded". The producer side usually
  /// keeps the sequence (to post), so the discarded elements are released then, while it lives;
  /// `onCancel` runs once.
  @Test
  func aCancelledConsumersDiscardedBufferIsReleasedWhileTheSequenceLives() async throws {
    let loop = try RunLoopThread(name: "discard")
    let deaths = AtomicCounter()
    let cancels = AtomicCounter()
    var buffered: SourceSequence<ReleaseCanary>? = loop.sourceSequence(
      of: ReleaseCanary.self, onCancel: { _ in cancels.increment() })
    let started = TestGate()
    let consumer = Task { [buffered] in
      started.open()
      while !Task.isCancelled { await Task.yield() }
      for await element in buffered! { element.touch() }
    }
    for _ in 0..<3 { #expect(buffered?.post(ReleaseCanary(deaths)).isEnqueued == true) }
    _ = await execOnNewThread { started.wait(timeout: .seconds(10)) }
    consumer.cancel()
    _ = try await withWatchdog(timeout: .seconds(20), "the cancelled consumer") { await consumer.value }
    #expect(await eventuallyWithin { cancels.current == 1 })
    #expect(await eventuallyWithin(3) { deaths.current == 3 }, "the ended sequence kept \(3 - deaths.current) elements")
    buffered = nil
    await execShutdown(loop)
  }

  /// `.dropNewest` refuses the element that does not fit: the refused element is released at
  /// once (the sequence keeps only what it buffered).
  @Test func anElementRefusedByDropNewestIsReleased() async throws {
    let loop = try RunLoopThread(name: "drop-newest")
    let deaths = AtomicCounter()
    let sequence = loop.sourceSequence(of: ReleaseCanary.self, buffering: .dropNewest(2))
    for _ in 0..<5 { _ = sequence.post(ReleaseCanary(deaths)) }
    #expect(await eventuallyWithin { deaths.current == 3 }, "released \(deaths.current) of 3")
    #expect(sequence.droppedCount == 3)
    #expect(sequence.bufferedCount == 2)
    withExtendedLifetime(sequence) {}
    await execShutdown(loop)
  }

  /// Promise (TimerSequence): it ends on `invalidate()` or the loop's shutdown, also when both
  /// race each other and a fast repeating timer: `for await` never hangs.
  @Test func timerSequenceEndsWhenInvalidateRacesShutdown() async throws {
    let ended = try await withWatchdog(timeout: .seconds(60), "timer sequence vs end") { () -> Int in
      var ended = 0
      for round in 0..<80 {
        let loop = try RunLoopThread(name: "tick")
        let ticks = loop.timer(every: .microseconds(200), modes: [.common, RunLoopMode("tick-x")])
        let consumer = Task { () -> Int in
          var count = 0
          for await _ in ticks { count += 1 }
          return count
        }
        var bodies: [@Sendable () -> Void] = [{ loop.shutdownAndWait() }]
        if round % 2 == 0 { bodies.append { ticks.invalidate() } }
        if round % 3 == 0 { bodies.append { loop.addModeToCommonModes(RunLoopMode("tick-y")) } }
        await race(bodies)
        _ = await consumer.value
        ended += 1
      }
      return ended
    }
    #expect(ended == 80)
  }

  /// Promise (SourceSequence): a consumer running on the source's own loop (a task that prefers
  /// the loop) still ends its `for await`, with every accepted element delivered once, when the
  /// loop shuts down while producers post.
  @Test func aConsumerOnTheLoopItselfEndsAtShutdownWithEveryElement() async throws {
    let failures = try await withWatchdog(timeout: .seconds(60), "on-loop consumer vs shutdown") { () -> [String] in
      var failures: [String] = []
      for round in 0..<60 {
        let loop = try RunLoopThread(name: "onloop")
        let sequence = loop.sourceSequence(of: Int.self, modes: [.common])
        let consumer = Task(executorPreference: loop) { () -> [Int] in
          var got: [Int] = []
          for await value in sequence { got.append(value) }
          return got
        }
        let accepted = Guarded<[Int]>([])
        var bodies: [@Sendable () -> Void] = (0..<2).map { producer in
          {
            for index in 0..<50 {
              let value = producer * 1000 + index
              if sequence.post(value) == .enqueued { accepted.withLock { $0.append(value) } }
            }
          }
        }
        bodies.append { loop.shutdownAndWait() }
        await race(bodies)
        let got = await consumer.value
        if got.sorted() != accepted.snapshot.sorted() {
          failures.append("round \(round): accepted \(accepted.snapshot.count), delivered \(got.count)")
        }
        if failures.count > 5 { break }
      }
      return failures
    }
    #expect(failures == [])
  }

  /// Promise (Shutdown, and dropping a loop): async sequences made from a loop keep it alive;
  /// once the consumer is cancelled and the sequence dropped, nothing holds it: the loop is
  /// released (its thread drains and exits).
  @Test func aLoopIsReleasedOnceItsSequencesEnd() async throws {
    let leaked = try await withWatchdog(timeout: .seconds(40), "sequences keep the loop") { () -> Int in
      var leaked = 0
      for round in 0..<30 {
        weak var weakLoop: RunLoopThread?
        var consumers: [Task<Void, Never>] = []
        do {
          let loop = try RunLoopThread(name: "seqdrop")
          weakLoop = loop
          let ticks = loop.timer(every: .milliseconds(1))
          let events = loop.sourceSequence(of: Int.self, modes: [.common, RunLoopMode("sd")])
          consumers.append(Task { for await _ in ticks {} })
          consumers.append(Task { for await _ in events {} })
          for index in 0..<20 { _ = events.post(index) }
        }
        if round % 2 == 0 { await Task.yield() }
        for consumer in consumers { consumer.cancel() }
        for consumer in consumers { await consumer.value }
        consumers.removeAll()
        for _ in 0..<5_000 where weakLoop != nil { try await Task.sleep(for: .milliseconds(1)) }
        if weakLoop != nil { leaked += 1 }
      }
      return leaked
    }
    #expect(leaked == 0)
  }

  /// A task cancelled before its first `next()`: the sequence ends at once, the buffered elements
  /// are released, later posts answer `.terminated`, `onCancel` runs once on the loop thread.
  @Test func cancelledBeforeTheFirstNextEndsAndReleasesTheBuffer() async throws {
    let loop = try RunLoopThread(name: "cancel-first")
    defer { loop.shutdownAndWait() }
    let cancels = SequenceCallLog()
    let sequence = loop.sourceSequence(
      of: WeaklyObservedObject.self, onCancel: { cancelLoop in cancels.record(onLoopThread: cancelLoop.isOnLoopThread) }
    )
    let watchers = (0..<4).map { _ in WeakObservedObjectReference() }
    for watcher in watchers {
      let object = WeaklyObservedObject()
      watcher.object = object
      #expect(sequence.post(object) == .enqueued)
    }
    await loopBarrier(loop)  // released to the consumer side
    let count = try await withWatchdog(timeout: .seconds(30), "pre-cancelled consumer") { () async -> Int in
      await Task { () async -> Int in
        withUnsafeCurrentTask { $0?.cancel() }
        var count = 0
        for await _ in sequence { count += 1 }
        return count
      }.value
    }
    #expect(count == 0)
    #expect(watchers.allSatisfy { $0.object == nil })
    #expect(sequence.post(WeaklyObservedObject()) == .terminated)
    await eventually("cancel routine") { cancels.count == 1 }
    #expect(cancels.allOnLoopThread)
  }

  /// Cancelled between two elements of one batch: `next()` returns nil at once (the rest of the
  /// batch is not handed out), and every element is released once the task ends.
  @Test func cancelledBetweenElementsOfABatchEndsAtOnce() async throws {
    let loop = try RunLoopThread(name: "cancel-mid")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: WeaklyObservedObject.self)
    let watchers = (0..<5).map { _ in WeakObservedObjectReference() }
    let release = blockLoop(loop)
    for watcher in watchers {
      let object = WeaklyObservedObject()
      watcher.object = object
      _ = sequence.post(object)
    }
    release.open()
    await loopBarrier(loop)
    let count = try await withWatchdog(timeout: .seconds(30), "consumer cancelled mid-batch") { () async -> Int in
      await Task { () async -> Int in
        var count = 0
        for await _ in sequence {
          count += 1
          withUnsafeCurrentTask { $0?.cancel() }
        }
        return count
      }.value
    }
    #expect(count == 1)
    #expect(watchers.allSatisfy { $0.object == nil })
    #expect(sequence.post(WeaklyObservedObject()) == .terminated)
  }

  /// Cancelled while suspended, for every kind of sequence, from a task that prefers the
  /// sequence's loop and from one that does not: `next()` returns nil.
  @Test(arguments: [false, true]) func cancelledWhileSuspendedEndsEveryKind(onLoop: Bool) async throws {
    let loop = try RunLoopThread(name: "cancel-wait")
    defer { loop.shutdownAndWait() }
    let pipeEnds = makePipe()
    defer {
      close(pipeEnds.read)
      close(pipeEnds.write)
    }
    let source = loop.sourceSequence(of: Int.self)
    let signal = loop.signalSequence()
    let timer = loop.timer(every: .seconds(3600))
    let readiness = try loop.readiness(of: pipeEnds.read)
    let activity = loop.activities(.entry, modes: [modeA])
    let preference: RunLoopThread? = onLoop ? loop : nil
    let tasks: [Task<Int, Never>] = [
      Task(executorPreference: preference) { await countElements(source) },
      Task(executorPreference: preference) { await countElements(signal) },
      Task(executorPreference: preference) { await countElements(timer) },
      Task(executorPreference: preference) { await countElements(readiness) },
      Task(executorPreference: preference) { await countElements(activity) },
    ]
    try await Task.sleep(for: .milliseconds(20))  // let them suspend (not asserted on)
    for task in tasks { task.cancel() }
    let counts = try await withWatchdog(timeout: .seconds(30), "cancelled consumers") { () async -> [Int] in
      var counts: [Int] = []
      for task in tasks { counts.append(await task.value) }
      return counts
    }
    #expect(counts == [0, 0, 0, 0, 0])
    #expect(source.post(1) == .terminated)
    #expect(signal.signal() == false)
  }

  /// Cancelling the consumer, invalidating the sequence and shutting its loop down, all at once,
  /// while the consumer waits with elements in flight: the consumer ends, no element twice, the
  /// cancel routine runs exactly once, later posts are refused.
  @Test func cancelInvalidateAndShutdownRacingEndOnce() async throws {
    let rounds = 30 * stressFactor
    for round in 0..<rounds {
      let loop = try RunLoopThread(name: "triple")
      let cancels = SequenceCallLog()
      let sequence = loop.sourceSequence(
        of: Int.self, onCancel: { cancelLoop in cancels.record(onLoopThread: cancelLoop.isOnLoopThread) })
      await loopBarrier(loop)  // scheduled
      let consumer = Task(executorPreference: round.isMultiple(of: 2) ? loop : nil) { () async -> [Int] in
        var values: [Int] = []
        for await value in sequence { values.append(value) }
        return values
      }
      for value in 0..<(round % 4) { _ = sequence.post(value) }
      await race([
        { consumer.cancel() },
        { sequence.invalidate() },
        { loop.shutdown() },
        { for value in 100..<200 { _ = sequence.post(value) } },
      ])
      let values = try await withWatchdog(timeout: .seconds(30), "round \(round)") { await consumer.value }
      #expect(values.map { Set($0).count == $0.count } == true, "round \(round): an element twice")
      await execShutdown(loop)
      #expect(cancels.count == 1, "round \(round): cancel ran \(cancels.count) times")
      #expect(cancels.allOnLoopThread)
      #expect(sequence.post(-1) == .terminated)
    }
  }

  /// A loop dropped without `shutdown()` while sequences of every kind (not iterated) were made on
  /// it and then dropped: the loop is freed, its thread exits, the source sequence's `onCancel`
  /// runs once, and what its closures captured is released.
  @Test func aDroppedLoopWithDroppedSequencesIsReclaimed() async throws {
    let name = "dropped"
    let weakLoop = WeakLoopReference()
    let captured = WeakObservedObjectReference()
    let cancels = SequenceCallLog()
    let pipeEnds = makePipe()
    defer {
      close(pipeEnds.read)
      close(pipeEnds.write)
    }
    try await withWatchdogOnThread {
      let loop = try RunLoopThread(name: name)
      weakLoop.loop = loop
      let object = WeaklyObservedObject()
      captured.object = object
      do {
        let source = loop.sourceSequence(
          of: Int.self,
          onCancel: { cancelLoop in
            withExtendedLifetime(object) {}
            cancels.record(onLoopThread: cancelLoop.isOnLoopThread)
          })
        _ = source.post(1)
        _ = loop.signalSequence()
        _ = loop.timer(every: .milliseconds(1))
        _ = try loop.readiness(of: pipeEnds.read)
        _ = loop.activities()
      }
    }
    waitUntil("the dropped loop to be freed") { weakLoop.loop == nil }
    waitUntil("the dropped loop's thread to exit") { threadCount(named: name) == 0 }
    waitUntil("the cancel routine") { cancels.count == 1 }
    waitUntil("what onCancel captured to be released") { captured.object == nil }
    #expect(cancels.allOnLoopThread)
  }

  /// What a sequence's `onSchedule`/`onCancel` capture is released once the source has left its
  /// loop (`InputSource`: routines are "released once the source is invalidated"), even while the
  /// sequence itself is still held.
  @Test func aSequencesRoutinesAreReleasedAfterInvalidateWhileItIsStillHeld() async throws {
    let loop = try RunLoopThread(name: "routines")
    defer { loop.shutdownAndWait() }
    let captured = WeakObservedObjectReference()
    let cancels = SequenceCallLog()
    let sequence: SourceSequence<Int> = {
      let object = WeaklyObservedObject()
      captured.object = object
      return loop.sourceSequence(
        of: Int.self, onSchedule: { _, _ in withExtendedLifetime(object) {} },
        onCancel: { cancelLoop in
          withExtendedLifetime(object) {}
          cancels.record(onLoopThread: cancelLoop.isOnLoopThread)
        })
    }()
    await loopBarrier(loop)
    #expect(captured.object != nil)
    sequence.invalidate()
    await eventually("cancel") { cancels.count == 1 }
    await loopBarrier(loop)
    await eventually("the routines' captures to be released") { captured.object == nil }
    withExtendedLifetime(sequence) {}
  }

  /// `.dropOldest` keeps "at most `capacity` elements": what it drops does not accumulate while
  /// the consumer takes nothing (the loop runs, releasing each post to the consumer side). The
  /// storage keeps consumed slots until it compacts (64 at a time), so a few dozen dropped
  /// elements may linger; not hundreds.
  @Test func elementsDroppedByDropOldestDoNotAccumulate() async throws {
    let loop = try RunLoopThread(name: "dropped-release")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: WeaklyObservedObject.self, buffering: .dropOldest(2))
    let watchers = (0..<1000).map { _ in WeakObservedObjectReference() }
    for (index, watcher) in watchers.enumerated() {
      let object = WeaklyObservedObject()
      watcher.object = object
      _ = sequence.post(object)
      if index.isMultiple(of: 2) {
        await loopBarrier(loop)  // blocks run before sources in a pass: the source fires in this pass
        await loopBarrier(loop)  // … so after this one, the loop has released it to the consumer side
      } else {
        await loopBarrier(loop)  // here the next post may race the release
      }
    }
    #expect(sequence.droppedCount == 998)
    #expect(sequence.bufferedCount == 2)
    let alive = watchers.filter { $0.object != nil }.count
    #expect(alive <= 2 + 3 * 64, "\(alive) of 1000 posted elements are alive; the buffer holds 2")
    sequence.invalidate()
  }

  /// The same with every post released to the consumer side before the next one (as a loaded
  /// machine ordered them when this test was written): the oldest is then always a released
  /// element, and the released batch, never emptied nor compacted, kept 257 to all 1,000 of them
  /// (depending on how posts and releases interleaved) before it was compacted too.
  @Test func elementsDroppedFromTheReleasedSideDoNotAccumulate() async throws {
    let loop = try RunLoopThread(name: "dropped-released")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: WeaklyObservedObject.self, buffering: .dropOldest(2))
    let watchers = (0..<1000).map { _ in WeakObservedObjectReference() }
    for watcher in watchers {
      let object = WeaklyObservedObject()
      watcher.object = object
      _ = sequence.post(object)
      await loopBarrier(loop)  // blocks run before sources in a pass: the source fires in this pass
      await loopBarrier(loop)  // … so after this one, the loop has released the post
    }
    #expect(sequence.droppedCount == 998)
    #expect(sequence.bufferedCount == 2)
    let alive = watchers.filter { $0.object != nil }.count
    #expect(alive <= 2 + 2 * 64, "\(alive) of 1000 posted elements are alive; the buffer holds 2")
    sequence.invalidate()
  }

  /// Breaking out of `for await` in the middle of a batch: the iterator is dropped, the rest of the
  /// batch and the buffer are released, the source leaves its loop.
  @Test func breakingMidBatchReleasesEverything() async throws {
    let loop = try RunLoopThread(name: "break")
    defer { loop.shutdownAndWait() }
    let cancels = SequenceCallLog()
    let sequence = loop.sourceSequence(
      of: WeaklyObservedObject.self, onCancel: { cancelLoop in cancels.record(onLoopThread: cancelLoop.isOnLoopThread) }
    )
    let watchers = (0..<6).map { _ in WeakObservedObjectReference() }
    let release = blockLoop(loop)
    for watcher in watchers.prefix(4) {
      let object = WeaklyObservedObject()
      watcher.object = object
      _ = sequence.post(object)
    }
    release.open()
    await loopBarrier(loop)
    for watcher in watchers.suffix(2) {  // posted, not yet released
      let object = WeaklyObservedObject()
      watcher.object = object
      _ = sequence.post(object)
    }
    let first = try await withWatchdog(timeout: .seconds(30), "break") { () async -> Bool in
      for await object in sequence { return object === watchers[0].object }
      return false
    }
    #expect(first == true)
    await eventually("everything released") { watchers.allSatisfy { $0.object == nil } }
    await eventually("cancel") { cancels.count == 1 }
    #expect(sequence.post(WeaklyObservedObject()) == .terminated)
  }
}

@Suite("Sequences leave nothing behind when they end", .serialized, .timeLimit(.minutes(10)))
struct SequencesLeaveNothingBehindTests {
  /// Three producer threads post 2,000 elements each into a source sequence while the loop shuts
  /// down partway. Promised: every accepted element is delivered exactly once and in order per
  /// producer, then the sequence ends; `onCancel` runs once; afterwards the sequence and what its
  /// `onCancel` captured are released.
  @Test func producersRacingShutdownDeliverEachAcceptedElementOnceAndLeaveNothingBehind() async throws {
    var wrong: [String] = []
    for round in 0..<4 {
      let loop = try RunLoopThread(name: "seq")
      let cancels = AtomicCounter()
      weak var weakSequence: SourceSequence<Int>?
      weak var weakCapture: WeaklyObservedObject?
      var got: [[Int]] = []
      var sent: [[Int]] = []
      do {
        let capture = WeaklyObservedObject()
        weakCapture = capture
        let sequence = loop.sourceSequence(
          of: Int.self,
          onCancel: { _ in
            withExtendedLifetime(capture) {}
            cancels.increment()
          })
        weakSequence = sequence
        let consumer = Task { () -> [[Int]] in
          var got: [[Int]] = [[], [], []]
          for await element in sequence { got[element / 10_000].append(element % 10_000) }
          return got
        }
        sent = await execOnNewThread { () -> [[Int]] in
          let accepted = Locked<[[Int]]>([[], [], []])
          let producers: [@Sendable () -> Void] = (0..<3).map { producer in
            {
              for value in 0..<2_000 {
                switch sequence.post(producer * 10_000 + value) {
                case .enqueued, .enqueuedDroppingOldest: accepted.withLock { $0[producer].append(value) }
                default: break
                }
              }
            }
          }
          let delay = UInt32(100 + round * 400)
          race(
            producers + [
              {
                usleep(delay); loop.shutdown()
              }
            ])
          loop.shutdownAndWait()
          return accepted.withLock { $0 }
        }
        got = await consumer.value
      }
      if got != sent {
        wrong.append("round \(round): sent \(sent.map(\.count)), got \(got.map(\.count))")
      }
      if cancels.current != 1 { wrong.append("round \(round): onCancel ran \(cancels.current) times") }
      // The finished consumer task lets go of its closure shortly after handing its value over.
      for _ in 0..<2_000 where weakSequence != nil || weakCapture != nil { try await Task.sleep(for: .milliseconds(1)) }
      if weakSequence != nil || weakCapture != nil {
        wrong.append("round \(round): sequence held \(weakSequence != nil), capture held \(weakCapture != nil)")
      }
    }
    #expect(wrong == [])
  }

  /// Members removed or invalidated from another thread while the loop is blocked (more than a
  /// chunk and a pass of changes), and members left on a loop that shuts down: once the loop has
  /// applied the changes (or finished), every member and every closure it held is released.
  @Test func membersAndTheirClosuresAreReleasedAfterBurstsOfRemovalsAndShutdown() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "released members") {
      () throws -> (members: Int, captures: Int, cancels: Int, schedules: Int) in
      let loop = try RunLoopThread(name: "leak")
      let cancels = AtomicCounter()
      let schedules = AtomicCounter()
      let weakMembers = Locked<[() -> Bool]>([])
      let weakCaptures = Locked<[() -> Bool]>([])
      do {
        var keep: [InputSource] = []
        var timers: [LoopTimer] = []
        let release = blockLoop(loop)
        for index in 0..<1_200 {
          let capture = WeaklyObservedObject()
          weak let weakCapture = capture
          let source = InputSource(
            schedule: { _, _, _ in schedules.increment() },
            cancel: { _, _ in
              withExtendedLifetime(capture) {}
              cancels.increment()
            }
          ) { _ in }
          weak let weakSource = source
          weakMembers.withLock { $0.append { weakSource == nil } }
          weakCaptures.withLock { $0.append { weakCapture == nil } }
          loop.add(source, to: index % 2 == 0 ? .default : barrierModeA)
          switch index % 3 {
          case 0: loop.remove(source, from: index % 2 == 0 ? .default : barrierModeA)
          case 1: source.invalidate()
          default: keep.append(source)  // left for the shutdown
          }
          if index % 4 == 0 {
            let timerCapture = WeaklyObservedObject()
            weak let weakTimerCapture = timerCapture
            let timer = LoopTimer(after: .seconds(3600)) { _ in withExtendedLifetime(timerCapture) {} }
            weak let weakTimer = timer
            weakMembers.withLock { $0.append { weakTimer == nil } }
            weakCaptures.withLock { $0.append { weakTimerCapture == nil } }
            loop.add(timer, to: .common)
            if index % 8 == 0 { timer.invalidate() } else { timers.append(timer) }
          }
        }
        release.open()
        _ = try? loop.performAndWait {}
        loop.shutdownAndWait()
        withExtendedLifetime((keep, timers)) {}
      }
      let members = weakMembers.withLock { $0 }.filter { !$0() }.count
      let captures = weakCaptures.withLock { $0 }.filter { !$0() }.count
      return (members, captures, cancels.current, schedules.current)
    }
    #expect(outcome?.members == 0, "members still held")
    #expect(outcome?.captures == 0, "closures' captures still held")
    #expect(outcome?.schedules == 1_200)
    #expect(outcome?.cancels == 1_200)
  }
}
