import Glibc
import Testing

@testable import AsyncRunLoop

/// Custom ("version 0") input sources (SPEC §3): order, routines, signal + wake, coalescing,
/// invalidation and removal.
@Suite("InputSource (custom sources)")
struct InputSourceTests {
  /// Counts of each routine, and whether every call ran on the loop's thread.
  final class RoutineRecorder: Sendable {
    let schedules = Locked(0)
    let performs = Locked(0)
    let cancels = Locked(0)
    let offThread = Locked<[String]>([])

    /// A source whose routines record into this recorder; `loop` is the loop it will be on.
    func makeSource(for loop: RunLoopThread, order: Int = 0) -> InputSource {
      InputSource(
        order: order,
        schedule: { _, scheduledOn, _ in
          if !loop.isOnLoopThread || scheduledOn !== loop { self.offThread.withLock { $0.append("schedule") } }
          self.schedules.withLock { $0 += 1 }
        },
        cancel: { _, cancelledOn in
          if !loop.isOnLoopThread || cancelledOn !== loop { self.offThread.withLock { $0.append("cancel") } }
          self.cancels.withLock { $0 += 1 }
        },
        perform: { _ in
          if !loop.isOnLoopThread { self.offThread.withLock { $0.append("perform") } }
          self.performs.withLock { $0 += 1 }
        })
    }
  }

  @Test func lowerOrdersFireFirstAmongReadySources() throws {
    let loop = try RunLoopThread(name: "source-order")
    let log = EngineEventLog()
    let orders = [3, 1, -5, 2, 0]
    let sources = orders.map { order in InputSource(order: order) { _ in log("\(order)") } }
    try loop.performAndWait {
      for source in sources { loop.add(source, to: .default) }
      // Signalled in an order unrelated to either the orders or the adding order.
      for index in [2, 4, 0, 3, 1] { sources[index].signal() }
    }
    // All were signalled before any step 4 could run: they fire together, in one pass.
    waitUntil("the sources to fire") { log.entries.count == 5 }
    #expect(log.entries == ["-5", "0", "1", "2", "3"])
    sources.forEach { $0.invalidate() }
    loop.shutdownAndWait()
  }

  @Test func routinesRunOnTheLoopThread() throws {
    let loop = try RunLoopThread(name: "source-routines")
    let recorder = RoutineRecorder()
    let source = recorder.makeSource(for: loop)
    loop.add(source, to: .default)  // from this (test) thread: the loop applies it
    waitUntil("schedule") { recorder.schedules.withLock { $0 } == 1 }
    source.signal()
    waitUntil("perform") { recorder.performs.withLock { $0 } == 1 }
    source.invalidate()
    waitUntil("cancel") { recorder.cancels.withLock { $0 } == 1 }
    #expect(recorder.offThread.withLock { $0 }.isEmpty)
    loop.shutdownAndWait()
  }

  @Test func scheduleIsToldTheModeTheSourceFirstJoined() throws {
    let loop = try RunLoopThread(name: "source-schedule")
    let modes = Locked<[RunLoopMode]>([])
    let source = InputSource(schedule: { _, _, mode in modes.withLock { $0.append(mode) } }, perform: { _ in })
    try loop.performAndWait {
      loop.add(source, to: "tracking")
      loop.add(source, to: .default)  // already on the loop: schedule is not called again
    }
    #expect(modes.withLock { $0 } == ["tracking"])
    source.invalidate()
    loop.shutdownAndWait()
  }

  @Test func signalFromAnotherThreadWakesASleepingLoopInOneCall() throws {
    let loop = try RunLoopThread(name: "source-wake")
    let asleep = Locked(false)
    let observer = LoopObserver(activities: [.beforeWaiting, .afterWaiting]) { _, activity in
      asleep.withLock { $0 = activity == .beforeWaiting }
    }
    let performed = Locked(0)
    let source = InputSource { _ in performed.withLock { $0 += 1 } }
    loop.add(observer, to: .default)
    loop.add(source, to: .default)
    waitUntil("the loop to sleep") { asleep.withLock { $0 } }
    // Nothing else will ever wake this loop: only signal's own wake-up can get the source run.
    EngineTestThread.start { source.signal() }.join()
    waitUntil("the signalled source to fire") { performed.withLock { $0 } == 1 }
    observer.invalidate()
    source.invalidate()
    loop.shutdownAndWait()
  }

  @Test func signalBeforeAddingIsKeptUntilTheSourceIsScheduled() throws {
    let loop = try RunLoopThread(name: "source-early")
    let performed = Locked(0)
    let source = InputSource { _ in performed.withLock { $0 += 1 } }
    source.signal()
    #expect(source.isSignalled)
    loop.add(source, to: .default)
    waitUntil("the early signal to fire") { performed.withLock { $0 } == 1 }
    #expect(!source.isSignalled)
    source.invalidate()
    loop.shutdownAndWait()
  }

  /// Runs the calling thread's loop with a far-off timer (so the run would otherwise time out
  /// after 60 s) and returns why it ended.
  static func runUntilStopped(_ prepare: @escaping @Sendable (RunLoopThread) -> Void) -> RunLoopRunResult {
    EngineTestThread.run {
      let loop = RunLoopThread.current
      loop.add(LoopTimer(after: .seconds(3_600)) { _ in }, to: .default)
      prepare(loop)
      return loop.run(mode: .default, until: .now.advanced(by: .seconds(60)))
    }
  }

  @Test func aSignalledSourceAddedAfterStep4FiresWithoutAnotherWakeUp() {
    // Added by another source's perform (after step 4 took this pass's ready list): its signal
    // is not in the inbox, so the loop must not go to sleep on it.
    let result = Self.runUntilStopped { loop in
      let late = InputSource { _ in RunLoopThread.current.stop() }
      late.signal()
      let adder = InputSource { _ in RunLoopThread.current.add(late, to: .default) }
      loop.add(adder, to: .default)
      adder.signal()
    }
    #expect(result == .stopped)
  }

  @Test func aSourceSignalledInAnotherModeFiresWhenItJoinsTheRunningMode() {
    let result = Self.runUntilStopped { loop in
      let elsewhere = InputSource { _ in RunLoopThread.current.stop() }
      loop.add(elsewhere, to: "tracking")
      elsewhere.signal()
      let joiner = InputSource { _ in RunLoopThread.current.add(elsewhere, to: .default) }
      loop.add(joiner, to: .default)
      joiner.signal()
    }
    #expect(result == .stopped)
  }

  @Test func signalsBeforeThePassCoalesceIntoOnePerform() throws {
    let loop = try RunLoopThread(name: "source-coalesce")
    let performed = Locked(0)
    let source = InputSource { _ in performed.withLock { $0 += 1 } }
    try loop.performAndWait {
      loop.add(source, to: .default)
      for _ in 0..<100 { source.signal() }  // all before the loop can reach step 4
    }
    waitUntil("the perform") { performed.withLock { $0 } >= 1 }
    try loop.performAndWait {}
    try loop.performAndWait {}
    #expect(performed.withLock { $0 } == 1)
    source.invalidate()
    loop.shutdownAndWait()
  }

  @Test func manySignalsFromAnotherThreadEndWithAPerformAfterTheLast() throws {
    let loop = try RunLoopThread(name: "source-signals")
    let signals = 20_000 * stressFactor
    // `issued` is bumped before each signal; each perform records the largest value it saw. A
    // perform that starts after the last signal sees `signals`.
    let issued = Locked(0)
    let performs = Locked(0)
    let largestSeen = Locked(0)
    let source = InputSource { _ in
      performs.withLock { $0 += 1 }
      let seen = issued.withLock { $0 }
      largestSeen.withLock { $0 = max($0, seen) }
    }
    loop.add(source, to: .default)
    try loop.performAndWait {}
    EngineTestThread.start {
      for _ in 0..<signals {
        issued.withLock { $0 += 1 }
        source.signal()
      }
    }.join()
    waitUntil("a perform after the last signal") { largestSeen.withLock { $0 } == signals }
    let count = performs.withLock { $0 }
    #expect(count >= 1)
    #expect(count <= signals)
    source.invalidate()
    loop.shutdownAndWait()
  }

  @Test func invalidateRemovesFromEveryModeAndCancelsExactlyOnce() throws {
    let loop = try RunLoopThread(name: "source-invalidate")
    let recorder = RoutineRecorder()
    let source = recorder.makeSource(for: loop)
    let tracking: RunLoopMode = "tracking"
    let modal: RunLoopMode = "modal"
    try loop.performAndWait {
      loop.addModeToCommonModes(modal)
      loop.add(source, to: .common)
      loop.add(source, to: tracking)
    }
    let modesHolding = { @Sendable () throws -> Int in
      try loop.performAndWait {
        [RunLoopMode.default, tracking, modal].filter { mode in
          loop.core.modes(of: source).contains(mode)
        }.count
      }
    }
    #expect(try modesHolding() == 3)

    source.invalidate()  // from another thread than the loop's
    #expect(!source.isValid)
    waitUntil("cancel") { recorder.cancels.withLock { $0 } == 1 }
    #expect(try modesHolding() == 0)
    #expect(try loop.performAndWait { loop.core.modeCount(of: source) == 0 })

    source.invalidate()  // again, from both sides
    try loop.performAndWait { source.invalidate() }
    try loop.performAndWait {}
    #expect(recorder.cancels.withLock { $0 } == 1)
    #expect(recorder.schedules.withLock { $0 } == 1)
    #expect(recorder.offThread.withLock { $0 }.isEmpty)

    // An invalidated source cannot be scheduled again.
    loop.add(source, to: .default)
    #expect(try loop.performAndWait { loop.core.modeCount(of: source) == 0 })
    #expect(recorder.schedules.withLock { $0 } == 1)
    loop.shutdownAndWait()
  }

  @Test func invalidatingOnTheLoopThreadCancelsBeforeReturning() throws {
    let loop = try RunLoopThread(name: "source-invalidate-here")
    let recorder = RoutineRecorder()
    let source = recorder.makeSource(for: loop)
    loop.add(source, to: .default)
    let cancelledBeforeReturn = try loop.performAndWait {
      source.invalidate()
      return recorder.cancels.withLock { $0 } == 1
    }
    #expect(cancelledBeforeReturn)
    loop.shutdownAndWait()
  }

  @Test func signallingAnInvalidatedSourceIsANoOp() throws {
    let loop = try RunLoopThread(name: "source-signal-invalid")
    let recorder = RoutineRecorder()
    let source = recorder.makeSource(for: loop)
    loop.add(source, to: .default)
    try loop.performAndWait {}
    source.invalidate()
    source.signal()
    #expect(!source.isSignalled)
    try loop.performAndWait { source.signal() }
    try loop.performAndWait {}
    #expect(recorder.performs.withLock { $0 } == 0)

    // Never scheduled, then invalidated: signalling stays a no-op and no cancel is owed.
    let loose = recorder.makeSource(for: loop)
    loose.invalidate()
    loose.signal()
    #expect(!loose.isSignalled)
    #expect(recorder.cancels.withLock { $0 } == 1)
    loop.shutdownAndWait()
  }

  @Test func invalidatingASignalledSourceDropsThePendingPerform() throws {
    let loop = try RunLoopThread(name: "source-invalidate-signalled")
    let recorder = RoutineRecorder()
    let source = recorder.makeSource(for: loop)
    try loop.performAndWait {
      loop.add(source, to: .default)
      source.signal()
      source.invalidate()  // before step 4 of this pass
    }
    try loop.performAndWait {}
    #expect(recorder.performs.withLock { $0 } == 0)
    #expect(recorder.cancels.withLock { $0 } == 1)
    loop.shutdownAndWait()
  }

  @Test func removingTwiceOrRemovingANeverAddedSourceIsANoOp() throws {
    let loop = try RunLoopThread(name: "source-remove")
    let recorder = RoutineRecorder()
    let neverAdded = recorder.makeSource(for: loop)
    loop.remove(neverAdded, from: .default)
    loop.remove(neverAdded, from: .common)
    try loop.performAndWait { loop.remove(neverAdded, from: "tracking") }
    #expect(recorder.cancels.withLock { $0 } == 0)
    #expect(neverAdded.isValid)

    let source = recorder.makeSource(for: loop)
    try loop.performAndWait {
      loop.add(source, to: .default)
      loop.add(source, to: "tracking")
      loop.remove(source, from: "elsewhere")  // not in that mode: nothing happens
      loop.remove(source, from: .default)  // still in "tracking": no cancel yet
    }
    #expect(recorder.cancels.withLock { $0 } == 0)
    try loop.performAndWait {
      loop.remove(source, from: "tracking")  // last mode: cancel
      loop.remove(source, from: "tracking")
    }
    loop.remove(source, from: "tracking")  // and once more from another thread
    try loop.performAndWait {}
    #expect(recorder.cancels.withLock { $0 } == 1)
    #expect(recorder.schedules.withLock { $0 } == 1)
    // Removal is not invalidation: the source is still valid.
    #expect(source.isValid)
    #expect(recorder.offThread.withLock { $0 }.isEmpty)
    source.invalidate()
    loop.shutdownAndWait()
  }
}

/// `CommandSource`: the command-buffer pattern as one type (SPEC §3).
@Suite("CommandSource")
struct CommandSourceTests {
  struct Command: Sendable {
    var producer: Int
    var sequence: Int
  }

  /// What the handler saw, per producer: checked as it arrives, on the loop thread.
  struct Tally {
    var nextSequence: [Int]
    var outOfOrder = 0
    var delivered = 0
  }

  /// Its waits are off the cooperative pool: blocking there for seconds (two such tests at once
  /// held both of a 2-core machine's pool threads) stalled every async test past its watchdog.
  @Test func fourProducersDeliverEveryCommandOnceInPerProducerOrder() async throws {
    let producers = 4
    let perProducer = 100_000 * stressFactor
    let loop = try RunLoopThread(name: "command-stress")
    let tally = Locked(Tally(nextSequence: Array(repeating: 0, count: producers)))
    let offThread = Locked(0)
    let source = CommandSource<Command> { command in
      if !loop.isOnLoopThread { offThread.withLock { $0 += 1 } }
      tally.withLock { tally in
        if tally.nextSequence[command.producer] != command.sequence { tally.outOfOrder += 1 }
        tally.nextSequence[command.producer] = command.sequence + 1
        tally.delivered += 1
      }
    }
    loop.add(source.source, to: .default)
    let refused = Locked(0)
    let threads = (0..<producers).map { producer in
      EngineTestThread.start {
        var refusedHere = 0
        for sequence in 0..<perProducer where !source.post(Command(producer: producer, sequence: sequence)) {
          refusedHere += 1
        }
        refused.withLock { $0 += refusedHere }
      }
    }
    await execOnNewThread { threads.forEach { $0.join() } }
    #expect(
      await pollAsync(timeout: .seconds(600)) { tally.withLock { $0.delivered } >= producers * perProducer },
      "every command to be delivered")
    #expect(await execOnNewThread { (try? loop.performAndWait {}) != nil })
    let final = tally.withLock { $0 }
    #expect(refused.withLock { $0 } == 0)
    #expect(final.delivered == producers * perProducer)
    #expect(final.outOfOrder == 0)
    #expect(final.nextSequence == Array(repeating: perProducer, count: producers))
    #expect(offThread.withLock { $0 } == 0)
    #expect(source.pendingCount == 0)
    source.source.invalidate()
    await execShutdown(loop)
  }

  @Test func commandsPostedBeforeTheSourceIsAddedAreDeliveredOnceItIs() throws {
    let loop = try RunLoopThread(name: "command-early")
    let received = Locked<[Int]>([])
    let source = CommandSource<Int> { value in received.withLock { $0.append(value) } }
    for value in 0..<10 { #expect(source.post(value)) }
    #expect(source.pendingCount == 10)
    loop.add(source.source, to: .default)
    waitUntil("delivery") { received.withLock { $0.count } == 10 }
    #expect(received.withLock { $0 } == Array(0..<10))
    source.source.invalidate()
    loop.shutdownAndWait()
  }

  @Test func postAfterInvalidateReturnsFalse() throws {
    let loop = try RunLoopThread(name: "command-closed")
    let received = Locked<[Int]>([])
    let source = CommandSource<Int> { value in received.withLock { $0.append(value) } }
    loop.add(source.source, to: .default)
    try loop.performAndWait {}
    source.source.invalidate()  // from a thread other than the loop's
    #expect(!source.post(1))
    #expect(try loop.performAndWait { source.post(2) } == false)

    // Invalidated on the loop thread.
    let other = CommandSource<Int> { value in received.withLock { $0.append(value) } }
    loop.add(other.source, to: .default)
    try loop.performAndWait { other.source.invalidate() }
    #expect(!other.post(3))

    // Invalidated before it was ever scheduled: no loop will ever deliver, so nothing is accepted.
    let loose = CommandSource<Int> { value in received.withLock { $0.append(value) } }
    loose.source.invalidate()
    #expect(!loose.post(4))
    #expect(loose.pendingCount == 0)

    try loop.performAndWait {}
    #expect(received.withLock { $0 }.isEmpty)
    loop.shutdownAndWait()
  }

  @Test func commandsAcceptedBeforeInvalidationAreDeliveredBeforeCancel() throws {
    let loop = try RunLoopThread(name: "command-drain")
    let log = EngineEventLog()
    let source = CommandSource<Int>(cancel: { _, _ in log("cancel") }) { value in log("\(value)") }
    loop.add(source.source, to: .default)
    try loop.performAndWait {}
    // Hold the loop in a block so that every command is still buffered when the source is
    // invalidated.
    let release = Locked(false)
    let holding = Locked(false)
    loop.perform {
      holding.withLock { $0 = true }
      while !release.withLock({ $0 }) { usleep(1_000) }
    }
    waitUntil("the loop to be held") { holding.withLock { $0 } }
    var accepted: [String] = []
    for value in 0..<100 where source.post(value) { accepted.append("\(value)") }
    source.source.invalidate()
    let lateAccepted = source.post(100)
    release.withLock { $0 = true }
    waitUntil("cancel") { log.count(of: "cancel") == 1 }
    #expect(accepted.count == 100)
    #expect(!lateAccepted)
    #expect(log.entries == accepted + ["cancel"])
    loop.shutdownAndWait()
  }

  /// Invalidated while on no loop, the source's commands go to the loop that lets go of it last:
  /// the loop it was last on, or, when the loop it was on before that has not applied its removal
  /// yet (its thread is held in a block here), that loop once it has. Each command once, in order,
  /// after everything delivered before; each loop calls cancel once.
  @Test func invalidatedOffLoopTheLoopLettingGoLastDeliversInOrder() throws {
    let loops = [try RunLoopThread(name: "command-let-go-a"), try RunLoopThread(name: "command-let-go-b")]
    let log = EngineEventLog()
    let source = CommandSource<Int>(cancel: { _, loop in log("cancel \(loop.name)") }) { value in
      let name = loops.first(where: { $0.isOnLoopThread })?.name ?? "elsewhere"
      log("\(value) \(name)")
    }
    loops[0].add(source.source, to: .default)
    for value in 0..<3 { #expect(source.post(value)) }
    waitUntil("A delivers") { log.entries.count == 3 }
    // Hold A's thread: its removal waits in its inbox.
    let release = Locked(false)
    let holding = Locked(false)
    loops[0].perform {
      holding.withLock { $0 = true }
      while !release.withLock({ $0 }) { usleep(1_000) }
    }
    waitUntil("A to be held") { holding.withLock { $0 } }
    loops[0].remove(source.source, from: .default)
    loops[1].add(source.source, to: .default)
    for value in 3..<6 { #expect(source.post(value)) }
    waitUntil("B delivers while A still holds the source") { log.entries.count == 6 }
    loops[1].remove(source.source, from: .default)
    try loops[1].performAndWait {}  // B has applied its removal (and called cancel)
    for value in 6..<9 { #expect(source.post(value)) }
    source.source.invalidate()
    #expect(!source.post(9))
    try loops[1].performAndWait {}  // B was told of the invalidation; A still holds the source
    #expect(source.pendingCount == 3)
    release.withLock { $0 = true }
    waitUntil("A lets go and delivers") { log.entries.count == 11 }
    for loop in loops { loop.shutdownAndWait() }
    let a = "command-let-go-a"
    let b = "command-let-go-b"
    #expect(
      log.entries == (0..<3).map { "\($0) \(a)" } + (3..<6).map { "\($0) \(b)" } + ["cancel \(b)"]
        + (6..<9).map { "\($0) \(a)" } + ["cancel \(a)"])
  }

  /// A command source with 1 and 2 posted (delivered as one batch once it is added); its handler
  /// gets the source and the value, and -1 for the cancel routine.
  static func twoCommandBatch(
    _ handler: @escaping @Sendable (_ source: CommandSource<Int>?, _ value: Int) -> Void
  ) -> CommandSource<Int> {
    let box = Locked<CommandSource<Int>?>(nil)
    let source = CommandSource<Int>(cancel: { _, _ in handler(nil, -1) }) { value in
      handler(box.withLock { $0 }, value)
    }
    box.withLock { $0 = source }
    #expect(source.post(1) && source.post(2))
    return source
  }

  @Test func aHandlerThatRunsTheLoopNestedGetsEveryCommandOnceInPostingOrder() {
    let (delivered, pendingAfter, lateDelivered) = EngineTestThread.run { () -> ([Int], Int, [Int]) in
      let loop = RunLoopThread.current
      loop.addModeToCommonModes("modal")
      let log = Locked<[Int]>([])
      let source = Self.twoCommandBatch { source, value in
        guard value >= 0 else { return }
        log.withLock { $0.append(value) }
        if value == 1, let source {
          source.post(100)
          _ = RunLoopThread.current.run(mode: "modal", until: .now)  // the source fires again here
        }
      }
      loop.add(source.source, to: .common)
      _ = loop.run(mode: .default, until: .now)
      let delivered = log.withLock { $0 }
      let pendingAfter = source.pendingCount
      // Nothing was left behind in the buffer: a new post signals the source again.
      source.post(3)
      _ = loop.run(mode: .default, until: .now)
      let late = log.withLock { $0 }
      source.source.invalidate()
      return (delivered, pendingAfter, late)
    }
    #expect(delivered == [1, 2, 100])
    #expect(pendingAfter == 0)
    #expect(lateDelivered == [1, 2, 100, 3])
  }

  @Test func aHandlerThatInvalidatesItsSourceGetsTheRestOfTheBatchBeforeCancel() {
    let events = EngineTestThread.run { () -> [String] in
      let loop = RunLoopThread.current
      let log = EngineEventLog()
      let source = Self.twoCommandBatch { source, value in
        guard value >= 0 else { return log("cancel") }
        log("\(value)")
        if value == 1 { source?.source.invalidate() }  // the closing drain runs in here
      }
      #expect(source.post(3))
      loop.add(source.source, to: .default)
      _ = loop.run(mode: .default, until: .now)
      return log.entries
    }
    #expect(events == ["1", "2", "3", "cancel"])
  }
}
