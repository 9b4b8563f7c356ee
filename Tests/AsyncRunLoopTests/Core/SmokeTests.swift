import Glibc
import Testing

@_spi(Testing) @testable import AsyncRunLoop

actor Counter: PinnedToLoopActor {
  nonisolated let loop: RunLoopThread
  var count = 0
  init(loop: RunLoopThread) { self.loop = loop }
  func increment() -> Int {
    loop.checkIsolated()
    count += 1
    return count
  }
}

protocol PinnedToLoopActor: Actor {
  nonisolated var loop: RunLoopThread { get }
}
extension PinnedToLoopActor {
  nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
}

@Test func loopStarts() throws {
  let loop = try RunLoopThread(name: "smoke")
  let value = try loop.performAndWait { 42 }
  #expect(value == 42)
  loop.shutdownAndWait()
}

@Test func timerAndCommands() throws {
  let loop = try RunLoopThread(name: "smoke2")
  let received = LockedValue<[Int]>([])
  let gate = BlockingGate()
  let source = CommandSource<Int> { value in
    received.withLock { $0.append(value) }
    if value == 999 { gate.open() }
  }
  loop.add(source.source)
  for i in 0..<1000 { source.post(i) }
  gate.wait()
  #expect(received.withLock { $0 } == Array(0..<1000))
  let timerGate = BlockingGate()
  let start = LoopClock.Instant.now
  loop.add(LoopTimer(after: .milliseconds(20)) { _ in timerGate.open() })
  timerGate.wait()
  #expect(start.duration(to: .now) >= .milliseconds(20))
  loop.shutdownAndWait()
}

@Test func actorCalls() async throws {
  let loop = try RunLoopThread(name: "smoke3")
  let counter = Counter(loop: loop)
  for _ in 0..<1000 { _ = await counter.increment() }
  #expect(await counter.increment() == 1001)
  try await loop.clock.sleep(for: .milliseconds(5))
  loop.shutdownAndWait()
}

@Test func currentLoopRunsWithTimeout() throws {
  // On a thread of its own: a pool thread's loop would outlive the test (and its timer).
  let (empty, timed, fired) = EngineTestThread.run { () -> (RunLoopRunResult, RunLoopRunResult, Int) in
    let loop = RunLoopThread.current
    let empty = loop.run(mode: .default, for: .milliseconds(10))
    let fired = Locked(0)
    let timer = LoopTimer(after: .milliseconds(5), repeatingEvery: .milliseconds(5)) { _ in
      fired.withLock { $0 += 1 }
    }
    loop.add(timer)
    let timed = loop.run(mode: .default, for: .milliseconds(52))
    timer.invalidate()
    return (empty, timed, fired.withLock { $0 })
  }
  #expect(empty == .finished)
  #expect(timed == .timedOut)
  // At least once: a due timer fires in the pass that finds the limit passed. (Not "about ten
  // times": under a sanitizer on a loaded machine the thread may sleep through most of the
  // 52 ms, and a repeating timer skips the grid points it missed.)
  #expect(fired >= 1)
}

@Test func taskSleepUsesLoop() async throws {
  let loop = try RunLoopThread(name: "smoke4")
  await withTaskExecutorPreference(loop) {
    try? await Task.sleep(for: .milliseconds(3))
    #expect(loop.isOnLoopThread)
  }
  #expect(loop.scheduledJobCount == 1)
  loop.shutdownAndWait()
}

@Test func performAndWaitOnALoopWhoseThreadExitedThrowsShutDown() throws {
  let made = Locked<RunLoopThread?>(nil)
  EngineTestThread.start { made.withLock { $0 = RunLoopThread.current } }.join()
  // The thread has exited: its loop terminated, so the call is refused instead of hanging.
  let loop = try #require(made.withLock { $0 })
  #expect(throws: RunLoopError.shutDown(loop: loop.name)) { try loop.performAndWait { 1 } }
}
