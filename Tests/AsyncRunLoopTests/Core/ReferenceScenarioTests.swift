import Glibc
import Testing

@testable import AsyncRunLoop

/// A plain pthread, for tests whose point is a thread of its own running `RunLoopThread.current`.
///
/// Swift Testing runs tests on reused pool threads; a loop made current on one of them would
/// outlive the test. A thread of our own takes its loop (and everything scheduled on it) with it
/// when it exits.
final class EngineTestThread: @unchecked Sendable {
  // Safety: `thread` is written once by `start` before the object is handed to anyone, and read
  // only by `join`, on the thread that called `start`. `body` is immutable.
  private var thread = pthread_t()
  private let body: @Sendable () -> Void

  private init(body: @escaping @Sendable () -> Void) { self.body = body }

  /// Starts a thread running `body`. Join it with `join()`.
  static func start(_ body: @escaping @Sendable () -> Void) -> EngineTestThread {
    let started = EngineTestThread(body: body)
    let context = Unmanaged.passRetained(started).toOpaque()
    let rc = pthread_create(
      &started.thread, nil,
      { raw in
        Unmanaged<EngineTestThread>.fromOpaque(raw!).takeRetainedValue().body()
        return nil
      }, context)
    precondition(rc == 0, "pthread_create failed: \(rc)")
    return started
  }

  /// Waits for the thread to finish.
  func join() {
    pthread_join(thread, nil)
  }

  /// Runs `body` on a new thread and returns its result once the thread has finished.
  static func run<T: Sendable>(_ body: @escaping @Sendable () -> T) -> T {
    let result = Locked<T?>(nil)
    start { result.withLock { $0 = body() } }.join()
    return result.withLock { $0! }
  }
}

/// A thread-safe list of events, in the order they were recorded: `log("fired")`.
final class EngineEventLog: Sendable {
  private let storage = Locked<[String]>([])

  /// Appends `event`. Any thread.
  func callAsFunction(_ event: String) { storage.withLock { $0.append(event) } }

  /// The events so far.
  var entries: [String] { storage.withLock { $0 } }

  /// How many times `event` was recorded.
  func count(of event: String) -> Int { storage.withLock { $0.count { $0 == event } } }
}

/// The two scenarios SPEC.md is built around, end to end.
@Suite("Reference scenarios")
struct ReferenceScenarioTests {
  /// The "main thread" side of scenario (a): the list of worker sources it may send commands to,
  /// filled by the sources' schedule routines and emptied by their cancel routines (the
  /// registerSource/removeSource pair of the CFRunLoop custom-source example).
  final class Coordinator: Sendable {
    let registered = Locked<[WorkerSource]>([])
    let history = Locked<[String]>([])

    func register(_ source: WorkerSource) {
      registered.withLock { $0.append(source) }
      history.withLock { $0.append("registered") }
    }

    func unregister(_ source: WorkerSource) {
      registered.withLock { list in list.removeAll { $0 === source } }
      history.withLock { $0.append("unregistered") }
    }
  }

  /// The worker side of scenario (a): a custom source and its command buffer, which other
  /// threads fill under a lock ("version 0" source with a command buffer).
  final class WorkerSource: Sendable {
    private let buffer = Locked<[String]>([])
    let received = Locked<[String]>([])
    let routineThreadChecks = Locked<[Bool]>([])
    private let sourceBox = Locked<InputSource?>(nil)

    init(coordinator: Coordinator) {
      let source = InputSource(
        schedule: { [weak self] _, loop, mode in
          guard let self else { return }
          self.routineThreadChecks.withLock { $0.append(loop.isOnLoopThread && mode == .default) }
          coordinator.register(self)  // tell clients how to reach us
        },
        cancel: { [weak self] _, loop in
          guard let self else { return }
          self.routineThreadChecks.withLock { $0.append(loop.isOnLoopThread) }
          coordinator.unregister(self)  // clients drop their reference
        },
        perform: { [weak self] source in
          guard let self else { return }
          let commands = self.buffer.withLock { pending in
            defer { pending.removeAll() }
            return pending
          }
          for command in commands {
            self.received.withLock { $0.append(command) }
            if command == "quit" { source.invalidate() }  // removes it, runs cancel, the run finishes
          }
        })
      sourceBox.withLock { $0 = source }
    }

    var source: InputSource { sourceBox.withLock { $0! } }

    /// Client side, any thread: queue a command, then signal + wake in one call.
    func send(_ command: String) {
      buffer.withLock { $0.append(command) }
      source.signal()
    }
  }

  @Test func mainThreadHandsCommandsToAWorkerThroughItsCustomSource() {
    let coordinator = Coordinator()
    let workerSource = WorkerSource(coordinator: coordinator)
    let result = Locked<RunLoopRunResult?>(nil)
    let worker = EngineTestThread.start {
      let loop = RunLoopThread.current
      loop.add(workerSource.source, to: .default)  // the schedule routine announces the source
      let outcome = loop.run(mode: .default)  // unconditionally: until the source leaves
      result.withLock { $0 = outcome }
    }
    // Main thread: wait for the announcement, then hand over commands through the registry.
    waitUntil("the worker's source to be registered") { !coordinator.registered.withLock(\.isEmpty) }
    let target = coordinator.registered.withLock { $0[0] }
    let commands = (0..<100).map { "command \($0)" }
    for command in commands { target.send(command) }
    target.send("quit")
    worker.join()

    #expect(result.withLock { $0 } == .finished)
    #expect(workerSource.received.withLock { $0 } == commands + ["quit"])
    #expect(coordinator.history.withLock { $0 } == ["registered", "unregistered"])
    #expect(coordinator.registered.withLock(\.isEmpty))
    #expect(workerSource.routineThreadChecks.withLock { $0 } == [true, true])
    #expect(!workerSource.source.isValid)
  }

  /// Scenario (b): a thread runs its loop in ten slices of `run(until: now + slice)` with an
  /// observer for every activity, doing "housekeeping" between slices. SPEC's reference uses
  /// 1 s slices; we scale to 10 × 100 ms slices with a 10 ms repeating timer to keep the suite
  /// fast. The log must follow SPEC §6 in every slice.
  @Test func slicedRunsFollowTheActivitySequenceOfSpecSection6() {
    let (log, results) = EngineTestThread.run { () -> ([String], [RunLoopRunResult]) in
      let loop = RunLoopThread.current
      let log = Locked<[String]>([])
      let observer = LoopObserver(activities: .all) { _, activity in log.withLock { $0.append("\(activity)") } }
      let timer = LoopTimer(after: .milliseconds(10), repeatingEvery: .milliseconds(10)) { _ in
        log.withLock { $0.append("timer") }
      }
      loop.add(observer, to: .default)
      loop.add(timer, to: .default)
      var results: [RunLoopRunResult] = []
      for _ in 0..<10 {
        results.append(loop.run(mode: .default, until: .now.advanced(by: .milliseconds(100))))
        log.withLock { $0.append("housekeeping") }
      }
      timer.invalidate()
      observer.invalidate()
      return (log.withLock { $0 }, results)
    }
    #expect(results == Array(repeating: .timedOut, count: 10))

    // Split into slices at "housekeeping" and check each against SPEC §6:
    //   slice := entry pass+ exit
    //   pass  := beforeTimers beforeSources (beforeWaiting afterWaiting)? timer*
    // (A pass skips sleeping only when the slice's limit has already passed when it gets there.)
    let slices = log.split(separator: "housekeeping", omittingEmptySubsequences: false).dropLast()
    #expect(slices.count == 10)
    var sleepingPasses = 0
    for (index, slice) in slices.enumerated() {
      let events = Array(slice)
      guard events.first == "entry", events.last == "exit", events.count >= 4 else {
        Issue.record("slice \(index) is not entry … exit: \(events)")
        continue
      }
      var position = 1
      var passes = 0
      var fires = 0
      while position < events.count - 1 {
        guard events[position] == "beforeTimers", events[position + 1] == "beforeSources" else {
          Issue.record("slice \(index): pass \(passes) starts with \(events[position...]) ")
          break
        }
        position += 2
        if events[position] == "beforeWaiting" {
          guard events[position + 1] == "afterWaiting" else {
            Issue.record("slice \(index): beforeWaiting not followed by afterWaiting: \(events)")
            break
          }
          position += 2
          sleepingPasses += 1
        }
        while events[position] == "timer" {
          fires += 1
          position += 1
        }
        passes += 1
      }
      #expect(passes >= 1, "slice \(index)")
      // The timer is due at most 10 ms into every 100 ms slice, so it fires in each one.
      #expect(fires >= 1, "slice \(index) fired no timer")
    }
    // Each slice normally sleeps between fires; only a thread descheduled for a whole slice
    // would skip that, so check the run as a whole.
    #expect(sleepingPasses >= 1)
  }
}
