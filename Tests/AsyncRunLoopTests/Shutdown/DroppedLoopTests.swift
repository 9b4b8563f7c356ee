import Glibc
import Testing

@testable import AsyncRunLoop

/// Dropping a loop's last reference ends it without losing accepted work.
@Suite("Dropping a loop's last reference ends it without losing accepted work", .timeLimit(.minutes(10)))
struct DroppedLoopTests {
  /// Dropping the handle while three threads post: every accepted post is delivered exactly once,
  /// cancel runs once, the thread exits.
  @Test func dropWhilePostersPost() async throws {
    let name = "droppost"
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
    let name = "droppaw"
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
    let name = "dropblock"
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
    let name = "dropnest"
    let cancels = AtomicCounter()
    let nestedEnded = Guarded<RunLoopRunResult?>(nil)
    let inNested = TestGate()
    let jobRan = AtomicCounter()
    do {
      let loop = try RunLoopThread(name: name)
      let nestMode = RunLoopMode("nest")
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
    // Waits for what the drain does as well as for the thread, as `dropWhilePostersPost` does: a
    // count of 0 alone could be read while the thread was still in its nested run (a name read
    // that failed under load counted as "gone"; `threadCount(named:)` now answers -1 then). A
    // drain that never ends the nested run or never cancels the source still fails, by timeout.
    let exited = try await withWatchdogOnThread(timeout: .seconds(20), "exit") {
      waitUntil(timeout: .seconds(15)) {
        threadCount(named: name) == 0 && nestedEnded.snapshot != nil && cancels.current == 1
      }
    }
    #expect(exited == true)
    #expect(nestedEnded.snapshot != nil)
    #expect(cancels.current == 1)
    #expect(jobRan.current == 1)
  }

  /// Dropped while many changes wait (the stand-in drains them): every schedule and cancel once.
  @Test func dropWithManyWaitingChanges() async throws {
    let name = "dropmany"
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
