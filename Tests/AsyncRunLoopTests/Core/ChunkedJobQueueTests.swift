import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("The chunked job queue runs every job once, in order", .serialized, .timeLimit(.minutes(10)))
struct ChunkedJobQueueTests {
  /// A current loop (a thread of the test's own) gets 5,000 jobs; its run is stopped by an early
  /// job (thousands are left and go back to the inbox in chunks), a later job runs the loop nested
  /// (which runs no jobs); then, while its thread is out of a run, another 3,000 jobs race
  /// `shutdown()`. Promised: every job runs exactly once, never two at once, in the order
  /// enqueued: those left by the run and those diverted to the fallback executor alike.
  @Test func leftoverJobsOfACurrentLoopThenShutdownRacingABurstRunOnceInOrder() async throws {
    let thread = CommandedCurrentLoopThread()
    let loop = await thread.loop()
    let order = Guarded<[Int]>([])
    let depth = AtomicCounter()
    let overlaps = AtomicCounter()
    let nestedRan = AtomicCounter()
    let first = 5_000
    let total = 8_000
    @Sendable func job(_ index: Int) {
      if depth.increment() != 1 { overlaps.increment() }
      order.withLock { $0.append(index) }
      if index == 3 { RunLoopThread.current.stop() }
      if index == 4_000, RunLoopThread.currentIfExists === loop {
        let before = order.snapshot.count
        _ = loop.run(for: .milliseconds(5))
        nestedRan.value.store(order.snapshot.count - before, ordering: .sequentiallyConsistent)
      }
      depth.value.subtract(1, ordering: .sequentiallyConsistent)
    }
    var tasks = (0..<first).map { index in Task(executorPreference: loop) { job(index) } }
    _ = await execOnNewThread {
      waitUntil("the jobs waiting") { loop.shared.inboxLock.withLock { loop.shared.inbox.jobs.count } >= first }
    }
    let firstRun = await thread.exec { loop -> RunLoopRunResult in
      let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keepAlive)
      defer { keepAlive.invalidate() }
      return loop.run(for: .seconds(20))
    }
    let leftAfterFirst = first - order.snapshot.count
    // A second run that is not stopped: runs the rest, with the nested run at job 4,000.
    _ = await thread.exec { loop -> RunLoopRunResult in
      let keepAlive = LoopTimer(after: .milliseconds(200)) { _ in }
      loop.add(keepAlive)
      defer { keepAlive.invalidate() }
      return loop.run(for: .milliseconds(300))
    }
    startThread(detached: true) {
      usleep(300)
      loop.shutdown()
    }
    tasks += (first..<total).map { index in Task(executorPreference: loop) { job(index) } }
    let allTasks = tasks
    let done: Void? = try await withWatchdog(timeout: .seconds(20), "every job") {
      for task in allTasks { await task.value }
    }
    thread.quit()
    #expect(done != nil)
    #expect(firstRun == .stopped)
    #expect(leftAfterFirst > 1_024)
    #expect(nestedRan.current == 0, "a run nested in a job ran \(nestedRan.current) jobs")
    #expect(overlaps.current == 0)
    let snapshot = order.snapshot
    #expect(snapshot.count == total)
    let inOrder = snapshot == Array(0..<total)
    #expect(inOrder, "first out of order at \(zip(snapshot, 0...).first { $0 != $1 }.map { "\($0)" } ?? "-")")
  }
}

extension ChunkedJobQueueTests {
  /// A current loop's thread, out of a run, adds a source while a change from another thread
  /// waits (so the add applies the inbox); 200 jobs wait in its inbox. Then the loop is shut
  /// down and 200 more jobs are enqueued. Promised ("outside a run, every job the loop accepted
  /// is in the inbox"; `shutdown()`: "as soon as its thread is out of a run, the jobs it accepted
  /// and every later one run on the fallback, in order"): all 400 run, in order, without waiting
  /// for the thread to exit.
  @Test
  func jobsTakenByALoopThreadAddOutsideARunStillLeaveAtShutdown() async throws {
    let thread = CommandedCurrentLoopThread()
    let loop = await thread.loop()
    let order = Guarded<[Int]>([])
    let first = 200
    let total = 400
    func start(_ range: Range<Int>) -> [Task<Void, Never>] {
      range.map { index in Task(executorPreference: loop) { order.withLock { $0.append(index) } } }
    }
    var tasks = start(0..<first)
    _ = await execOnNewThread {
      waitUntil("the jobs waiting") { loop.shared.inboxLock.withLock { loop.shared.inbox.jobs.count } >= first }
    }
    let timer = LoopTimer(after: .seconds(3600)) { _ in }
    loop.add(timer)  // from this thread: a change waits in the inbox
    let source = InputSource(perform: { _ in })
    let inInbox = await thread.exec { loop -> Int in
      loop.add(source)  // on the loop thread, out of a run
      return loop.shared.inboxLock.withLock { loop.shared.inbox.jobs.count }
    }
    loop.shutdown()
    tasks += start(first..<total)
    let ranBeforeExit = await execOnNewThread { () -> [Int] in
      let deadline = ContinuousClock.now.advanced(by: .seconds(3))
      while order.snapshot.count < total && ContinuousClock.now < deadline { usleep(1000) }
      return order.snapshot
    }
    thread.quit()  // its exit drain runs whatever it still holds
    let allTasks = tasks
    let done: Void? = try await withWatchdog(timeout: .seconds(20), "every job") {
      for task in allTasks { await task.value }
    }
    #expect(done != nil)
    #expect(inInbox == first, "out of a run, \(first - inInbox) jobs were held by the thread, not the inbox")
    #expect(ranBeforeExit.count == total, "only \(ranBeforeExit.count) of \(total) jobs ran before the thread exited")
    let snapshot = order.snapshot
    let inOrder = snapshot == Array(0..<total)
    #expect(inOrder, "the jobs ran out of order: the first were \(snapshot.prefix(3))")
  }
}

extension ChunkedJobQueueTests {
  /// A current loop's thread runs the loop in short runs again and again (each run's leftover
  /// jobs go back to the inbox) while two threads each enqueue 3,000 jobs (chunks' worth) and a
  /// third shuts the loop down part-way. Promised: every job runs exactly once, never two at
  /// once, each producer's in the order it enqueued them (on the thread or, after the shutdown,
  /// on the fallback).
  @Test func shortRunsRacingABurstAndShutdownKeepEachProducersOrder() async throws {
    for round in 0..<3 {
      let thread = CommandedCurrentLoopThread()
      let loop = await thread.loop()
      let seen = Guarded<[Int: [Int]]>([:])
      let depth = AtomicCounter()
      let overlaps = AtomicCounter()
      let perProducer = 3_000
      let tasks = Guarded<[Task<Void, Never>]>([])
      let running = Guarded(true)
      thread.send { loop in
        let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
        loop.add(keepAlive)
        while running.snapshot { _ = loop.run(for: .microseconds(300)) }
        keepAlive.invalidate()
      }
      let producers: [@Sendable () -> Void] = (0..<2).map { producer in
        {
          var mine: [Task<Void, Never>] = []
          for index in 0..<perProducer {
            mine.append(
              Task(executorPreference: loop) {
                if depth.increment() != 1 { overlaps.increment() }
                seen.withLock { $0[producer, default: []].append(index) }
                depth.value.subtract(1, ordering: .sequentiallyConsistent)
              })
          }
          tasks.withLock { $0 += mine }
        }
      }
      let shutter: @Sendable () -> Void = {
        usleep(UInt32(500 + 1_500 * round))
        loop.shutdown()
      }
      await execOnNewThread { race(producers + [shutter]) }
      let allTasks = tasks.snapshot
      let done: Void? = try await withWatchdog(timeout: .seconds(20), "every job, round \(round)") {
        for task in allTasks { await task.value }
      }
      running.withLock { $0 = false }
      thread.quit()
      #expect(done != nil)
      #expect(overlaps.current == 0, "round \(round)")
      let snapshot = seen.snapshot
      for producer in 0..<2 {
        let mine = snapshot[producer] ?? []
        #expect(
          mine == Array(0..<perProducer),
          "round \(round), producer \(producer): \(mine.count) jobs, in order \(mine == mine.sorted())")
      }
    }
  }
}

extension ChunkedJobQueueTests {
  /// The same start (a current loop's thread, out of a run, adds a source while a change waits;
  /// 100 jobs of one actor wait), then `shutdown()`, 100 more calls of the actor (each job takes
  /// a millisecond), and the thread exits at once. Promised: the loop is one serial executor,
  /// also once its jobs run on the fallback ("still isolated to the loop"): no two jobs of the
  /// actor ever run at once.
  @Test
  func jobsTakenOutsideARunNeverOverlapTheFallbackQueue() async throws {
    let thread = CommandedCurrentLoopThread()
    let loop = await thread.loop()
    let depth = AtomicCounter()
    let overlaps = AtomicCounter()
    let ran = AtomicCounter()
    let first = 100
    let total = 200
    func start(_ range: Range<Int>) -> [Task<Void, Never>] {
      range.map { _ in
        Task(executorPreference: loop) {
          if depth.increment() != 1 { overlaps.increment() }
          usleep(1_000)
          ran.increment()
          depth.value.subtract(1, ordering: .sequentiallyConsistent)
        }
      }
    }
    var tasks = start(0..<first)
    _ = await execOnNewThread {
      waitUntil("the jobs waiting") { loop.shared.inboxLock.withLock { loop.shared.inbox.jobs.count } >= first }
    }
    let timer = LoopTimer(after: .seconds(3600)) { _ in }
    loop.add(timer)
    let source = InputSource(perform: { _ in })
    _ = await thread.exec { loop in loop.add(source) }
    loop.shutdown()
    tasks += start(first..<total)
    thread.quit()
    let allTasks = tasks
    let done: Void? = try await withWatchdog(timeout: .seconds(20), "every job") {
      for task in allTasks { await task.value }
    }
    #expect(done != nil)
    #expect(ran.current == total)
    #expect(overlaps.current == 0, "\(overlaps.current) jobs of the loop's serial executor started while another ran")
  }
}
