import AsyncRunLoopFoundation
import CoreFoundation
import Dispatch
import Foundation
import Testing

#if canImport(Glibc)
  import Glibc
#endif

/// `CFRunLoopExecutor.init()`: a thread that exits before its executor has terminated ends the
/// executor as `shutdown()` would, off the thread. Its queued jobs are not left waiting for a run
/// loop that will never run again.
@Suite struct CFRunLoopExecutorThreadExitTests {
  /// Jobs queued while the thread is alive (it never runs its loop, so they wait) run once it has
  /// exited, in order, isolated to the executor (on its fallback queue), and before a job enqueued
  /// after the exit.
  @Test func jobsQueuedOnAThreadThatExitsRunOnTheFallbackInOrderBeforeLaterOnes() async throws {
    let thread = try await ExitingExecutorThread.start()
    let log = BridgeTestLog()
    let executor = thread.executor
    // Enqueued on the executor as the tasks are created, while its thread waits to exit.
    let early = (1...3).map { index in
      Task(executorPreference: executor) { () -> Bool in
        log.append("queued before the exit \(index)")
        return executor.isIsolatingCurrentContext() == true
      }
    }
    #expect(log.snapshot.isEmpty, "a job ran before the thread served its loop")
    try await thread.exit()
    let late = Task(executorPreference: executor) { () -> Bool in
      log.append("enqueued after the exit")
      return executor.isIsolatingCurrentContext() == true
    }
    #expect(await eventually { log.snapshot.count == 4 }, "jobs were left waiting: \(log.snapshot)")
    guard log.snapshot.count == 4 else { return }  // awaiting them would hang the suite
    for task in early { #expect(await task.value, "a job queued before the exit ran without isolation") }
    #expect(await late.value, "a job enqueued after the exit ran without isolation")
    #expect(
      log.snapshot == [
        "queued before the exit 1", "queued before the exit 2", "queued before the exit 3", "enqueued after the exit",
      ])
  }

  /// Jobs enqueued from another thread before, during and after the thread's exit: each runs
  /// once, in the order enqueued.
  @Test func jobsEnqueuedAcrossTheThreadsExitEachRunOnceInOrder() async throws {
    let thread = try await ExitingExecutorThread.start()
    let executor = thread.executor
    let log = CountingLog()
    let created = CountingLog()
    let exited = BridgeTestLog()
    let producer = Thread {
      // Enqueues while the thread exits, recording every 100th; at most 20,000 before `exit()`
      // returned (then it waits for that), and 2,000 after.
      var index = 0
      var lastBeforeTheExit: Int?
      while lastBeforeTheExit.map({ index - $0 <= 2_000 }) ?? true {
        if lastBeforeTheExit == nil, !exited.snapshot.isEmpty { lastBeforeTheExit = index }
        if lastBeforeTheExit == nil, index >= 20_000 {
          usleep(1_000)
          continue
        }
        Task(executorPreference: executor) { [index] in log.append(index) }
        if index % 100 == 0 { created.append(index) }
        index += 1
      }
      created.append(-index)  // the total, once done
    }
    producer.start()
    #expect(await eventually { created.snapshot.count >= 2 }, "the producer did not start")
    do { try await thread.exit() } catch {
      exited.append("exited")
      throw error
    }
    exited.append("exited")
    #expect(await eventually { created.snapshot.last.map { $0 < 0 } ?? false }, "the producer did not finish")
    let total = -(created.snapshot.last ?? 0)
    #expect(total > 2_000)
    #expect(await eventually { log.snapshot.count >= total }, "\(total - log.snapshot.count) jobs were left waiting")
    let ran = log.snapshot
    let firstOutOfOrder = ran.indices.first { ran[$0] != $0 }
    #expect(ran.count == total, "\(ran.count) jobs ran for \(total) enqueued")
    #expect(firstOutOfOrder == nil, "job \(firstOutOfOrder.map { ran[$0] } ?? 0) ran at \(firstOutOfOrder ?? 0)")
  }

  /// `shutdown()` called while the thread is alive, its final drain not yet run (the thread never
  /// runs its loop), and then the thread exits: the final drain runs on the fallback queue, once.
  /// The jobs queued before run once each, in order, isolated; a timer sequence ends.
  @Test func aShutdownWhoseFinalDrainHadNotRunWhenTheThreadExitsStillDrainsOnce() async throws {
    let thread = try await ExitingExecutorThread.start()
    let executor = thread.executor
    let log = BridgeTestLog()
    let ticks = executor.timer(every: .seconds(3600))
    let early = (1...3).map { index in
      Task(executorPreference: executor) { () -> Bool in
        log.append("job \(index)")
        return executor.isIsolatingCurrentContext() == true
      }
    }
    executor.shutdown()
    executor.shutdown()
    try await thread.exit()
    #expect(await eventually { log.snapshot.count == 3 }, "jobs were left waiting: \(log.snapshot)")
    guard log.snapshot.count == 3 else { return }
    for task in early { #expect(await task.value) }
    let consumer = Task { for await _ in ticks {} }
    #expect(await finishedValue(of: consumer) != nil, "the timer sequence did not end")
    let late = await Task(executorPreference: executor) { () -> Bool in
      log.append("late job")
      return executor.isIsolatingCurrentContext() == true
    }.value
    #expect(late)
    #expect(log.snapshot == ["job 1", "job 2", "job 3", "late job"])
  }

  /// A source sequence on the executor ends when its thread exits: the signals counted and not
  /// yet performed (the loop never ran) come in its last element, and `signal()` returns false
  /// from then on.
  @Test func aSourceSequenceEndsWithItsCountedSignalsWhenTheThreadExits() async throws {
    let thread = try await ExitingExecutorThread.start()
    let source = thread.executor.sourceSequence()
    #expect(source.signal())
    #expect(source.signal())
    let consumer = Task { () -> Int in
      var signals = 0
      for await performance in source { signals += performance.signals }
      return signals
    }
    try await thread.exit()
    let signals = await finishedValue(of: consumer)
    #expect(signals == 2, "the source sequence did not end (nil), or lost signals")
    #expect(!source.signal())
  }

  /// Once the thread has exited and the jobs queued on its executor have run, the executor is
  /// freed when its user drops it: the drain block left on the dead run loop does not keep it.
  @Test func anExecutorWhoseThreadExitedWithJobsQueuedIsFreedOnceDropped() async throws {
    let weakExecutor = WeakExecutorBox()
    do {
      let thread = try await ExitingExecutorThread.start()
      weakExecutor.executor = thread.executor
      let executor = thread.executor
      let jobs = (1...3).map { _ in Task(executorPreference: executor) { 1 } }
      try await thread.exit()
      var sum = 0
      for job in jobs { sum += await job.value }
      #expect(sum == 3)
    }
    #expect(await eventually { weakExecutor.executor == nil }, "the executor was never freed")
  }

  /// A timer sequence cancelled or invalidated while its thread exits (and the exit ends it too):
  /// its consumer ends, with no tick, and nothing touches the run loop after CF has freed it (the
  /// sanitizer runs of CI check the latter). Twenty threads, half of them cancelled.
  @Test func aTimerSequenceEndedWhileItsThreadExitsEndsItsConsumer() async throws {
    for round in 0..<20 {
      let thread = try await ExitingExecutorThread.start()
      let ticks = thread.executor.timer(every: .seconds(3600))
      let consumer = Task { await tickCount(of: ticks) }
      async let exited: Void = thread.exit()
      if round % 2 == 0 { consumer.cancel() } else { ticks.invalidate() }
      try await exited
      #expect(await consumer.value == 0)
    }
  }

  /// Two executors made on one thread: both end when it exits.
  @Test func everyExecutorMadeOnTheThreadEndsWhenItExits() async throws {
    let thread = try await ExitingExecutorThread.start(executorCount: 2)
    let log = BridgeTestLog()
    let tasks = thread.executors.enumerated().map { index, executor in
      Task(executorPreference: executor) { () -> Bool in
        log.append("executor \(index)")
        return executor.isIsolatingCurrentContext() == true
      }
    }
    try await thread.exit()
    #expect(await eventually { log.snapshot.count == 2 }, "jobs were left waiting: \(log.snapshot)")
    guard log.snapshot.count == 2 else { return }
    for task in tasks { #expect(await task.value) }
  }

  /// A timer sequence on the executor ends when its thread exits (as at the final drain of a
  /// `shutdown()`), instead of waiting for firings of a run loop that no longer runs.
  @Test func aTimerSequenceEndsWhenTheExecutorsThreadExits() async throws {
    let thread = try await ExitingExecutorThread.start()
    let ticks = thread.executor.timer(every: .seconds(3600))
    let consumer = Task { await tickCount(of: ticks) }
    try await thread.exit()
    let ticksBeforeTheEnd = await finishedValue(of: consumer)
    #expect(ticksBeforeTheEnd == 0, "the timer sequence did not end (nil), or ticked")
  }

  /// Once the thread has exited, a later thread that gets the same `pthread_t` is not isolated to
  /// the executor, also while the jobs queued before the exit still run (on the fallback queue,
  /// which is). glibc hands an exited thread's stack, and so its `pthread_t`, to the next thread
  /// asking for a stack of that size: an unusual size, in a child process, so no other thread
  /// takes it first.
  @Test func aLaterThreadWithTheExitedThreadsIDIsNotIsolatedToTheExecutor() async {
    await #expect(processExitsWith: .success) {
      alarm(UInt32(60 * watchdogScale))
      let stackSize = 256 * 1024 + 16 * 1024
      let thread = try await ExitingExecutorThread.start(stackSize: stackSize)
      let executor = thread.executor
      let running = DispatchSemaphore(value: 0)
      let release = DispatchSemaphore(value: 0)
      // Queued before the exit: it holds the fallback queue's final drain until released.
      let held = Task(executorPreference: executor) { () -> Bool? in
        running.signal()
        release.wait()
        return executor.isIsolatingCurrentContext()
      }
      try await thread.exit()
      let ran = await waitOffThePool(running)
      precondition(ran, "the job queued before the exit did not run")
      var reused: Bool?? = nil  // the answer on a thread with the same pthread_t, once one came
      for _ in 0..<16 where reused == nil {
        reused = await onNewThread(stackSize: stackSize) { () -> Bool?? in
          pthread_equal(pthread_self(), thread.pthreadID.value) != 0 ? .some(executor.isIsolatingCurrentContext()) : nil
        }
      }
      release.signal()
      guard let answer = reused else { preconditionFailure("no new thread reused the exited thread's pthread_t") }
      precondition(answer == nil, "a new thread with the exited thread's pthread_t counts as the executor's")
      let heldWasIsolated = await held.value
      precondition(heldWasIsolated == true, "the job queued before the exit ran without isolation")
      let late = await Task(executorPreference: executor) { executor.isIsolatingCurrentContext() }.value
      precondition(late == true, "a job after the exit ran without isolation")
    }
  }
}

/// A Foundation thread that makes `CFRunLoopExecutor`s with `init()`, never runs its run loop,
/// and exits when told to.
struct ExitingExecutorThread: Sendable {
  let executors: [CFRunLoopExecutor]
  let pthreadID: PthreadID
  private let kernelID: String
  private let mayExit: DispatchSemaphore

  var executor: CFRunLoopExecutor { executors[0] }

  struct PthreadID: @unchecked Sendable {  // Safety: proof below
    // Safety: an immutable integer (pthread_t is an unsigned long on Linux), only compared.
    let value: pthread_t
  }

  /// Starts the thread (with a stack of `stackSize` bytes; 0: the default) and waits until it
  /// published its `executorCount` executors.
  static func start(stackSize: Int = 0, executorCount: Int = 1) async throws -> ExitingExecutorThread {
    let published = DispatchSemaphore(value: 0)
    let mayExit = DispatchSemaphore(value: 0)
    let box = PublishedThread()
    let thread = Thread {
      box.publish(
        (0..<executorCount).map { _ in CFRunLoopExecutor() }, PthreadID(value: pthread_self()), currentKernelThreadID())
      published.signal()
      mayExit.wait()
    }
    if stackSize > 0 { thread.stackSize = stackSize }
    thread.start()
    #expect(await waitOffThePool(published), "the thread did not start")
    let value = try #require(box.value)
    return ExitingExecutorThread(
      executors: value.executors, pthreadID: value.pthreadID, kernelID: try #require(value.kernelID), mayExit: mayExit)
  }

  /// Lets the thread return, then waits until it is gone from `/proc/self/task` (its pthread
  /// keys' destructors have run by then).
  func exit() async throws {
    mayExit.signal()
    let gone = await eventually { threadExists(kernelID) == false }
    try #require(gone, "the thread did not exit")
  }

  private final class PublishedThread: @unchecked Sendable {  // Safety: proof below
    // Safety: `published` is only touched with `lock` held (the semaphore the test waits on is
    // signalled in libdispatch, which ThreadSanitizer does not see synchronize).
    private let lock = NSLock()
    private var published: (executors: [CFRunLoopExecutor], pthreadID: PthreadID, kernelID: String?)?

    func publish(_ executors: [CFRunLoopExecutor], _ pthreadID: PthreadID, _ kernelID: String?) {
      lock.withLock { published = (executors, pthreadID, kernelID) }
    }

    var value: (executors: [CFRunLoopExecutor], pthreadID: PthreadID, kernelID: String?)? {
      lock.withLock { published }
    }
  }
}

/// The ticks `ticks` delivered until it ended.
private func tickCount(of ticks: CFRunLoopTimerSequence) async -> Int {
  var count = 0
  for await _ in ticks { count += 1 }
  return count
}

/// A weak reference a test can hold across an `await`.
final class WeakExecutorBox: @unchecked Sendable {  // Safety: proof below
  // Safety: `executor` is only touched with `lock` held.
  private let lock = NSLock()
  private weak var storedExecutor: CFRunLoopExecutor?

  var executor: CFRunLoopExecutor? {
    get { lock.withLock { storedExecutor } }
    set { lock.withLock { storedExecutor = newValue } }
  }
}
