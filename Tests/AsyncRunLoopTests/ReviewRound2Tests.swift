import Glibc
import Testing

@testable import AsyncRunLoop

/// Review round 2: bounded registration changes per pass, dropped handles, main-loop performAndWait.
@Suite("ReviewRound2", .timeLimit(.minutes(10)))
struct ReviewRound2 {
  typealias Log = EventLog

  /// `count` cross-thread registration changes (an observer added and removed in turn).
  static func sendChanges(_ loop: RunLoopThread, count: Int) -> LoopObserver {
    let observer = LoopObserver(activities: .exit) { _, _ in }
    for index in 0..<count {
      if index % 2 == 0 { loop.add(observer, to: .default) } else { loop.remove(observer, from: .default) }
    }
    return observer
  }

  // MARK: 1. Bounded changes: order

  /// A loop-thread add made inside a change (a schedule routine) must come after a cross-thread
  /// removal that happened before it. The inline `applyControls()` at depth 2 stops at the end of
  /// the collected batch and never looks at the inbox, so the later inline add overtakes the
  /// earlier removal: the source ends up bound but detached (its signals never fire).
  @Test func inlineAddInsideScheduleRoutineDoesNotOvertakeEarlierRemoval() async throws {
    let loop = try RunLoopThread(name: "rr2-overtake")
    defer { loop.shutdownAndWait() }
    let log = Log()
    let target = InputSource(
      schedule: { _, _, _ in log.add("schedule") }, cancel: { _, _ in log.add("cancel") },
      perform: { _ in log.add("perform") })
    loop.add(target, to: .default)
    _ = try loop.performAndWait { () }
    #expect(log.snapshot == ["schedule"])

    let inSchedule = TestGate()
    let removalSent = TestGate()
    let trigger = InputSource(
      schedule: { _, runLoop, _ in
        inSchedule.open()
        _ = removalSent.wait(timeout: .seconds(10))
        runLoop.add(target, to: .default)  // after the removal (it happened before removalSent)
        log.add("inline-add")
      }, perform: { _ in })
    let follower = InputSource(perform: { _ in })
    let release = blockLoop(loop)
    loop.add(trigger, to: .default)
    loop.add(follower, to: .default)  // a change that still waits behind the trigger
    release.open()
    _ = try await withWatchdogOnThread(timeout: .seconds(20), "schedule routine") {
      _ = inSchedule.wait(timeout: .seconds(10))
      loop.remove(target, from: .default)
      removalSent.open()
    }
    _ = try loop.performAndWait { () }
    let modes = try loop.performAndWait { loop.core.modeCount(of: target) }
    target.signal()
    let fired = waitUntil(timeout: .seconds(3), "perform of the re-added source") { log.count("perform") == 1 }
    #expect(modes == 1, "target must be in default (remove, then add); log: \(log.snapshot)")
    #expect(fired)
    #expect(log.snapshot.prefix(4) == ["schedule", "cancel", "schedule", "inline-add"])
    trigger.invalidate()
    follower.invalidate()
    target.invalidate()
  }

  /// The same with the inline call made from a cancel routine that a cross-thread removal runs.
  @Test func inlineAddInsideCancelRoutineDoesNotOvertakeEarlierRemoval() async throws {
    let loop = try RunLoopThread(name: "rr2-overtake-c")
    defer { loop.shutdownAndWait() }
    let log = Log()
    let timer = LoopTimer(after: .seconds(3600)) { _ in }
    loop.add(timer, to: .default)
    let inCancel = TestGate()
    let removalSent = TestGate()
    let trigger = InputSource(
      cancel: { _, runLoop in
        inCancel.open()
        _ = removalSent.wait(timeout: .seconds(10))
        runLoop.add(timer, to: .default)
        log.add("inline-add")
      }, perform: { _ in })
    loop.add(trigger, to: .default)
    let follower = InputSource(perform: { _ in })
    _ = try loop.performAndWait { () }
    let release = blockLoop(loop)
    loop.remove(trigger, from: .default)  // its cancel routine runs as a change
    loop.add(follower, to: .default)
    release.open()
    _ = try await withWatchdogOnThread(timeout: .seconds(20), "cancel routine") {
      _ = inCancel.wait(timeout: .seconds(10))
      loop.remove(timer, from: .default)
      removalSent.open()
    }
    _ = try loop.performAndWait { () }
    let modes = try loop.performAndWait { loop.core.modeCount(of: timer) }
    #expect(log.snapshot == ["inline-add"])
    #expect(modes == 1, "the timer was removed, then added again on the loop thread")
    follower.invalidate()
    timer.invalidate()
  }

  /// A signal sent after a removal and re-add must not fire the source before the removal is
  /// applied: with more than a pass's worth of changes waiting in front, the signal is collected
  /// (signals are always taken) and step 4 fires the old registration.
  @Test func signalDoesNotOvertakeWaitingRemoval() async throws {
    let loop = try RunLoopThread(name: "rr2-sigorder")
    defer { loop.shutdownAndWait() }
    let log = Log()
    let source = InputSource(
      schedule: { _, _, _ in log.add("schedule") }, cancel: { _, _ in log.add("cancel") },
      perform: { _ in log.add("perform") })
    loop.add(source, to: .default)
    _ = try loop.performAndWait { () }
    let release = blockLoop(loop)
    let observer = Self.sendChanges(loop, count: 4 * LoopCore.controlsPerPass + 1)
    loop.remove(source, from: .default)
    loop.add(source, to: .default)
    source.signal()
    release.open()
    let fired = waitUntil(timeout: .seconds(10), "perform") { log.count("perform") == 1 }
    #expect(fired)
    _ = try loop.performAndWait { () }
    #expect(log.snapshot == ["schedule", "cancel", "schedule", "perform"])
    source.invalidate()
    observer.invalidate()
  }

  /// A signal for a source whose add still waits (behind many changes) is kept and fires once the
  /// add is applied; blocks and jobs sent after the changes see them applied.
  @Test func signalForWaitingAddAndWorkAfterManyChanges() async throws {
    let loop = try RunLoopThread(name: "rr2-waitadd")
    defer { loop.shutdownAndWait() }
    let log = Log()
    let source = InputSource(perform: { _ in log.add("perform") })
    let other = InputSource(perform: { _ in log.add("other") })
    loop.add(other, to: RunLoopMode("rr2-a"))
    _ = try loop.performAndWait { () }
    let timers = (0..<(3 * LoopCore.controlsPerPass + 7)).map { _ in LoopTimer(after: .seconds(3600)) { _ in } }
    let release = blockLoop(loop)
    for timer in timers { loop.add(timer, to: .default) }
    loop.add(source, to: .default)
    loop.add(other, to: .default)  // already on the loop in another mode
    source.signal()
    other.signal()
    let blockSaw = Guarded<(Int, Int)?>(nil)
    loop.perform { blockSaw.withLock { $0 = (loop.core.modeCount(of: timers.last!), loop.core.modeCount(of: source)) } }
    let jobSaw = Guarded<Int?>(nil)
    let jobRan = TestGate()
    Task(executorPreference: loop) {
      jobSaw.withLock { $0 = loop.core.modeCount(of: source) }
      jobRan.open()
    }
    release.open()
    let fired = waitUntil(timeout: .seconds(10), "both performs") {
      log.count("perform") == 1 && log.count("other") == 1
    }
    #expect(fired)
    _ = jobRan.wait(timeout: .seconds(10))
    _ = try loop.performAndWait { () }
    #expect(blockSaw.snapshot.map { [$0.0, $0.1] } == [1, 1])
    #expect(jobSaw.snapshot == 1)
    for timer in timers { timer.invalidate() }
    source.invalidate()
    other.invalidate()
  }

  /// Changes that a nested run (started by a change's schedule routine) applies keep their order,
  /// and a block sent after all of them sees them all.
  @Test func nestedRunInsideScheduleRoutineKeepsChangeOrder() async throws {
    let loop = try RunLoopThread(name: "rr2-nestorder")
    defer { loop.shutdownAndWait() }
    let log = Guarded<[Int]>([])
    let nestedResults = Guarded<[RunLoopRunResult]>([])
    let count = 3 * LoopCore.controlsPerPass + 5
    let sources = (0..<count).map { index in
      InputSource(
        schedule: { _, runLoop, _ in
          log.withLock { $0.append(index) }
          if index == 0 || index == 300 {
            // Runs the loop nested in an empty mode: it must apply the waiting changes first and
            // report finished only then (or time out).
            let result = runLoop.run(mode: RunLoopMode("rr2-empty"), for: .seconds(5))
            nestedResults.withLock { $0.append(result) }
          }
        }, perform: { _ in })
    }
    let release = blockLoop(loop)
    for source in sources { loop.add(source, to: .default) }
    let seenByBlock = Guarded<Int>(-1)
    loop.perform { seenByBlock.withLock { $0 = log.snapshot.count } }
    release.open()
    _ = try await withWatchdogOnThread(timeout: .seconds(20), "changes applied") {
      waitUntil(timeout: .seconds(15)) { seenByBlock.snapshot >= 0 }
    }
    #expect(log.snapshot == Array(0..<count))
    #expect(seenByBlock.snapshot == count)
    #expect(nestedResults.snapshot == [.finished, .finished])
    for source in sources { source.invalidate() }
  }

  /// An endless stream of changes from another thread does not starve blocks and jobs: they all
  /// run while the stream still goes on (the producer stops on its own after at most 1.2 s).
  @Test func streamOfChangesDoesNotStarveWork() async throws {
    let loop = try RunLoopThread(name: "rr2-starve")
    defer { loop.shutdownAndWait() }
    let stop = AtomicCounter()
    let producerDone = AtomicCounter()
    let sent = AtomicCounter()
    let producer = startThread {
      let observer = LoopObserver(activities: .exit) { _, _ in }
      var index = 0
      let deadline = ContinuousClock.now.advanced(by: .milliseconds(1200))
      while stop.current == 0 && ContinuousClock.now < deadline {
        if index % 2 == 0 { loop.add(observer, to: .default) } else { loop.remove(observer, from: .default) }
        index += 1
        sent.increment()
      }
      producerDone.increment()
      observer.invalidate()
    }
    while sent.current < 5_000 && producerDone.current == 0 { sched_yield() }
    let blocks = AtomicCounter()
    let jobs = AtomicCounter()
    for _ in 0..<20 {
      loop.perform { blocks.increment() }
      Task(executorPreference: loop) { jobs.increment() }
    }
    while (blocks.current < 20 || jobs.current < 20) && producerDone.current == 0 { usleep(1000) }
    let ranDuringStream = (blocks.current, jobs.current)
    stop.increment()
    joinThread(producer)
    // Each block and job waits only for the changes that arrived before it. Under a sanitizer
    // (watchdogScale > 1) the loop applies changes slower than the producer sends them, so that
    // backlog alone can outlast the stream: there only their eventual run is checked.
    if watchdogScale == 1 {
      #expect(ranDuringStream.0 == 20 && ranDuringStream.1 == 20, "ran during the stream: \(ranDuringStream)")
    }
    _ = try loop.performAndWait { () }
    #expect(blocks.current == 20)
    #expect(await eventually("the jobs ran") { jobs.current == 20 })
  }

  /// A source signalled before a burst of changes from another thread fires while those changes
  /// still wait (a pass applies a bounded number of them): it waits only for the changes that
  /// arrived before its signal, not for every change behind it.
  @Test func aSignalBeforeABurstOfChangesFiresWhileTheyStillWait() throws {
    let loop = try RunLoopThread(name: "rr2-signal-burst")
    defer { loop.shutdownAndWait() }
    let firedWhileWaiting = Guarded<Bool?>(nil)
    let source = InputSource { _ in
      let waiting = loop.core.hasWaitingControls
      firedWhileWaiting.withLock { $0 = waiting }
    }
    _ = try loop.performAndWait { loop.add(source) }
    // Hold the loop in a block so that the signal and the burst all wait in its inbox together.
    let release = blockLoop(loop)
    source.signal()
    let timer = LoopTimer(after: .seconds(3600)) { _ in }
    for index in 0..<(4 * LoopCore.controlsPerPass) {
      if index % 2 == 0 { loop.add(timer, to: "rr2-burst") } else { loop.remove(timer, from: "rr2-burst") }
    }
    release.open()
    _ = try loop.performAndWait { () }
    #expect(
      firedWhileWaiting.snapshot == true,
      "fired only after the whole burst: \(String(describing: firedWhileWaiting.snapshot))")
    timer.invalidate()
    source.invalidate()
  }

  /// Shutdown while thousands of changes wait: every source's schedule and cancel run once, every
  /// block accepted before the shutdown runs.
  @Test func shutdownDrainsManyWaitingChanges() async throws {
    let loop = try RunLoopThread(name: "rr2-sdmany")
    let schedules = AtomicCounter()
    let cancels = AtomicCounter()
    let blocks = AtomicCounter()
    let count = 2_000
    let sources = (0..<count).map { _ in
      InputSource(
        schedule: { _, _, _ in schedules.increment() }, cancel: { _, _ in cancels.increment() }, perform: { _ in })
    }
    let release = blockLoop(loop)
    for (index, source) in sources.enumerated() {
      loop.add(source, to: index % 2 == 0 ? .default : RunLoopMode("rr2-other"))
      if index % 100 == 0 { #expect(loop.perform { blocks.increment() }) }
    }
    loop.shutdown()
    release.open()
    _ = try await withWatchdogOnThread(timeout: .seconds(20), "shutdown") { loop.shutdownAndWait() }
    #expect(schedules.current == count)
    #expect(cancels.current == count)
    #expect(blocks.current == count / 100)
    #expect(sources.allSatisfy { !$0.isValid })
  }

  /// runModal and performAndWait behind many waiting changes: the modal run sees the source the
  /// changes added and returns handledSource; performAndWait returns.
  @Test func runModalAndPerformAndWaitBehindWaitingChanges() async throws {
    let loop = try RunLoopThread(name: "rr2-modal")
    defer { loop.shutdownAndWait() }
    let mode = RunLoopMode("rr2-modal")
    let fired = AtomicCounter()
    let source = InputSource(perform: { _ in fired.increment() })
    let release = blockLoop(loop)
    let observer = Self.sendChanges(loop, count: 3 * LoopCore.controlsPerPass + 3)
    loop.add(source, to: mode)
    source.signal()
    let afterMany = try await withWatchdogOnThread(timeout: .seconds(20), "performAndWait") {
      let thread = startThread { _ = try? loop.performAndWait { () } }
      release.open()
      let value = try loop.performAndWait { loop.core.modeCount(of: source) }
      joinThread(thread)
      return value
    }
    #expect(afterMany == 1)
    let result = try await withWatchdog(timeout: .seconds(20), "runModal") {
      try await loop.runModal(mode: mode, for: .seconds(10), returnAfterSourceHandled: true)
    }
    #expect(result == .handledSource)
    #expect(fired.current == 1)
    // A modal run in an empty mode behind waiting changes that add nothing to it: finished.
    let release2 = blockLoop(loop)
    let observer2 = Self.sendChanges(loop, count: 3 * LoopCore.controlsPerPass + 3)
    let emptyResult = try await withWatchdog(timeout: .seconds(20), "runModal empty") {
      async let run = loop.runModal(mode: RunLoopMode("rr2-empty"), for: .seconds(10))
      release2.open()
      return try await run
    }
    #expect(emptyResult == .finished)
    observer.invalidate()
    observer2.invalidate()
    source.invalidate()
  }

  // MARK: 2. Dropped handles

  /// Dropping the handle while three threads post: every accepted post is delivered exactly once,
  /// cancel runs once, the thread exits.
  @Test func dropWhilePostersPost() async throws {
    let name = "rr2-droppost"
    let delivered = AtomicCounter()
    let cancels = AtomicCounter()
    let command = CommandSource<Int>(cancel: { _, _ in cancels.increment() }) { _ in delivered.increment() }
    var loop: RunLoopThread? = try RunLoopThread(name: name)
    loop!.add(command.source, to: .default)
    _ = try loop!.performAndWait { () }
    let accepted = AtomicCounter()
    let refused = AtomicCounter()
    let started = AtomicCounter()
    let posters = (0..<3).map { _ in
      startThread {
        started.increment()
        for index in 0..<20_000 {
          if command.post(index) { accepted.increment() } else { refused.increment() }
        }
      }
    }
    while started.current < 3 { sched_yield() }
    usleep(2000)
    loop = nil
    for poster in posters { joinThread(poster) }
    let exited = try await withWatchdogOnThread(timeout: .seconds(20), "dropped loop exits") {
      waitUntil(timeout: .seconds(15), "thread exit") { threadCount(named: name) == 0 && cancels.current == 1 }
    }
    #expect(exited == true)
    #expect(delivered.current == accepted.current)
    #expect(accepted.current + refused.current == 60_000)
    #expect(cancels.current == 1)
    #expect(!command.source.isValid)
  }

  /// Dropping the user's handle while another thread's performAndWait is blocked on the loop: the
  /// caller holds the loop, the block runs, the thread exits afterwards.
  @Test func dropWhilePerformAndWaitBlocked() async throws {
    let name = "rr2-droppaw"
    var loop: RunLoopThread? = try RunLoopThread(name: name)
    let inBlock = TestGate()
    let release = TestGate()
    let result = Guarded<Int?>(nil)
    let caller = startThread { [loop] in
      let value = try? loop!.performAndWait { () -> Int in
        inBlock.open()
        _ = release.wait(timeout: .seconds(10))
        return 42
      }
      result.withLock { $0 = value }
    }
    _ = inBlock.wait(timeout: .seconds(10))
    loop = nil
    release.open()
    joinThread(caller)
    #expect(result.snapshot == 42)
    let exited = try await withWatchdogOnThread(timeout: .seconds(20), "exit") {
      waitUntil(timeout: .seconds(15)) { threadCount(named: name) == 0 }
    }
    #expect(exited == true)
  }

  /// The last reference is held only by a performed block's closure; a repeating timer fires all
  /// along; a source's cancel runs once during the drain that follows.
  @Test func dropWithLastReferenceInBlockAndTimersFiring() async throws {
    let name = "rr2-dropblock"
    let fires = AtomicCounter()
    let cancels = AtomicCounter()
    let sawSelf = Guarded<Bool?>(nil)
    do {
      let loop = try RunLoopThread(name: name)
      let timer = LoopTimer(after: .milliseconds(1), repeatingEvery: .milliseconds(1)) { _ in fires.increment() }
      loop.add(timer, to: .default)
      let source = InputSource(cancel: { _, _ in cancels.increment() }, perform: { _ in })
      loop.add(source, to: .common)
      _ = waitUntil(timeout: .seconds(5)) { fires.current >= 3 }
      loop.perform { [loop] in
        usleep(5000)
        sawSelf.withLock { $0 = RunLoopThread.current === loop }
      }
    }
    let exited = try await withWatchdogOnThread(timeout: .seconds(20), "exit") {
      waitUntil(timeout: .seconds(15)) { threadCount(named: name) == 0 }
    }
    #expect(exited == true)
    #expect(sawSelf.snapshot == true)
    #expect(cancels.current == 1)
    let afterExit = fires.current
    usleep(10_000)
    #expect(fires.current == afterExit)
  }

  /// Dropped while a nested run is active (inside a block): the nested run ends on its limit, the
  /// loop drains and exits; cancel once; a job sent from the nested run's source runs.
  @Test func dropDuringNestedRun() async throws {
    let name = "rr2-dropnest"
    let cancels = AtomicCounter()
    let nestedEnded = Guarded<RunLoopRunResult?>(nil)
    let inNested = TestGate()
    let jobRan = AtomicCounter()
    do {
      let loop = try RunLoopThread(name: name)
      let nestMode = RunLoopMode("rr2-nest")
      let source = InputSource(cancel: { _, _ in cancels.increment() }, perform: { _ in })
      loop.add(source, to: nestMode)
      loop.perform {
        let observer = LoopObserver(activities: .beforeWaiting, repeats: false) { _, _ in inNested.open() }
        RunLoopThread.current.add(observer, to: nestMode)
        let result = RunLoopThread.current.run(mode: nestMode, for: .milliseconds(300))
        nestedEnded.withLock { $0 = result }
      }
      _ = inNested.wait(timeout: .seconds(10))
      Task(executorPreference: loop) { jobRan.increment() }
    }
    let exited = try await withWatchdogOnThread(timeout: .seconds(20), "exit") {
      waitUntil(timeout: .seconds(15)) { threadCount(named: name) == 0 }
    }
    #expect(exited == true)
    #expect(nestedEnded.snapshot != nil)
    #expect(cancels.current == 1)
    #expect(jobRan.current == 1)
  }

  /// Dropped while many changes wait (the stand-in drains them): every schedule and cancel once.
  @Test func dropWithManyWaitingChanges() async throws {
    let name = "rr2-dropmany"
    let schedules = AtomicCounter()
    let cancels = AtomicCounter()
    let count = 1_500
    let sources = (0..<count).map { _ in
      InputSource(
        schedule: { _, _, _ in schedules.increment() }, cancel: { _, _ in cancels.increment() }, perform: { _ in })
    }
    do {
      let loop = try RunLoopThread(name: name)
      let release = blockLoop(loop)
      for source in sources { loop.add(source, to: .default) }
      release.open()
    }
    let exited = try await withWatchdogOnThread(timeout: .seconds(20), "exit") {
      waitUntil(timeout: .seconds(15)) { threadCount(named: name) == 0 }
    }
    #expect(exited == true)
    #expect(schedules.current == count)
    #expect(cancels.current == count)
  }
}
