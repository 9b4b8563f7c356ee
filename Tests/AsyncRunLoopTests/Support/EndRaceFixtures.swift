import Dispatch
import Glibc
import Testing

@testable import AsyncRunLoop

// Helpers for the tests of an external acceptance pass over the async surface (source, command, signal,
// timer, readiness and activity sequences racing their end), the executor (actors pinned to a
// loop, sleeps, modal runs, shutdown with pending work, LoopGroup). Blocking work runs on threads
// of the tests' own; results are checked after the watchdog returns.

let endRaceModeA: RunLoopMode = "end-race-mode-a"

/// One element of a multi-producer test.
struct ProducedItem: Sendable, Equatable {
  let producer: Int
  let index: Int
}

/// How a stream is ended while producers still post.
enum StreamEnding: Sendable, CustomStringConvertible {
  case shutdown
  case invalidate
  case remove

  var description: String {
    switch self {
    case .shutdown: return "shutdown"
    case .invalidate: return "invalidate"
    case .remove: return "remove"
    }
  }
}

/// An actor pinned to a loop that logs calls in order.
actor CallLoggingActor: LoopActor {
  nonisolated let loop: RunLoopThread
  private(set) var entries: [Int] = []
  init(loop: RunLoopThread) { self.loop = loop }

  func append(_ value: Int) -> Bool {
    entries.append(value)
    return loop.isOnLoopThread || loop.isShutDown
  }

  func sleepThenAppend(_ value: Int) async throws {
    try await Task.sleep(for: .milliseconds(30))
    entries.append(value)
  }

  /// Consumes `sequence` on this actor (the loop's thread).
  func consume(_ sequence: SourceSequence<ProducedItem>) async -> [Int: [Int]] {
    var seen: [Int: [Int]] = [:]
    for await item in sequence { seen[item.producer, default: []].append(item.index) }
    return seen
  }
}

/// Polls `condition` every millisecond without blocking a pool thread; false after `timeout`.
func pollEveryMillisecond(timeout: Duration = .seconds(10), _ condition: @Sendable () -> Bool) async -> Bool {
  let deadline = ContinuousClock.now.advanced(by: timeout * watchdogScale)
  while !condition() {
    if ContinuousClock.now >= deadline { return false }
    try? await Task.sleep(for: .milliseconds(1))
  }
  return true
}

/// Ends a stream the way `end` says, from the calling thread.
func endStream(_ end: StreamEnding, loop: RunLoopThread, source: InputSource, invalidate: () -> Void) {
  switch end {
  case .shutdown: loop.shutdown()
  case .invalidate: invalidate()
  case .remove: loop.remove(source, from: .common)
  }
}

/// `producers` threads post `perProducer` items each through `post`, while one more thread ends
/// the stream once a third of the posts were made. Returns, per producer, the indices accepted.
func racePostsAgainstEnd(
  producers: Int, perProducer: Int, end: @escaping @Sendable () -> Void,
  post: @escaping @Sendable (ProducedItem) -> Bool
) async -> [Int: [Int]] {
  let accepted = Guarded<[Int: [Int]]>([:])
  let posted = AtomicCounter()
  await execOnNewThread {
    var bodies: [@Sendable () -> Void] = (0..<producers).map { producer in
      {
        var mine: [Int] = []
        for index in 0..<perProducer {
          if post(ProducedItem(producer: producer, index: index)) { mine.append(index) }
          posted.increment()
        }
        accepted.withLock { $0[producer] = mine }
      }
    }
    bodies.append {
      while posted.current < producers * perProducer / 3 { sched_yield() }
      end()
    }
    race(bodies)
  }
  return accepted.snapshot
}

/// An actor whose method runs its loop nested in a custom mode while a job for itself is queued.
actor NestingLoopActor: LoopActor {
  nonisolated let loop: RunLoopThread
  let log: EventLog
  init(loop: RunLoopThread, log: EventLog) {
    self.loop = loop
    self.log = log
  }

  func inner() { log.add("inner") }

  func nest() async {
    log.add("outer-start")
    let task = Task { self.inner() }  // its first job queues on this loop now
    let hold = LoopTimer(after: .seconds(3600)) { _ in }
    loop.add(hold, to: endRaceModeA)
    _ = loop.run(mode: endRaceModeA, for: .milliseconds(50))
    hold.invalidate()
    log.add("outer-end")
    await task.value
  }
}

extension NestingLoopActor {
  func sleepThenLog() async {
    log.add("sleeping")
    try? await Task.sleep(for: .milliseconds(20))
    log.add("woke")
  }

  func nestLong() {
    log.add("outer-start")
    let hold = LoopTimer(after: .seconds(3600)) { _ in }
    loop.add(hold, to: endRaceModeA)
    _ = loop.run(mode: endRaceModeA, for: .milliseconds(150))
    hold.invalidate()
    log.add("outer-end")
  }
}

let endRaceModeB: RunLoopMode = "end-race-mode-b"

/// Where a run nested inside a job's nested run is started from.
enum DeepNestCallout: Sendable, CustomStringConvertible {
  case source
  case block
  case timer
  case observer

  var description: String {
    switch self {
    case .source: return "source"
    case .block: return "block"
    case .timer: return "timer"
    case .observer: return "observer"
    }
  }
}

extension NestingLoopActor {
  /// Runs the loop nested in mode A; a callout of `kind` there runs it nested again in mode B.
  /// A job for this actor is queued before; it must not run before this method returns.
  func deepNest(_ kind: DeepNestCallout) {
    log.add("outer-start")
    Task { self.inner() }  // its first job queues on this loop now
    let holdB = LoopTimer(after: .seconds(3600)) { _ in }
    loop.add(holdB, to: endRaceModeB)
    let loop = loop
    let log = log
    let callout: @Sendable () -> Void = {
      log.add("callout-start")
      _ = loop.run(mode: endRaceModeB, for: .milliseconds(60))
      log.add("callout-end")
    }
    var members: [() -> Void] = []
    switch kind {
    case .source:
      let commands = CommandSource<Int> { _ in callout() }
      loop.add(commands.source, to: endRaceModeA)
      commands.post(1)
      members.append { commands.source.invalidate() }
    case .block:
      let hold = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(hold, to: endRaceModeA)
      loop.perform(inModes: [endRaceModeA], callout)
      members.append { hold.invalidate() }
    case .timer:
      let timer = LoopTimer(after: .zero) { _ in callout() }
      loop.add(timer, to: endRaceModeA)
      members.append { timer.invalidate() }
    case .observer:
      let hold = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(hold, to: endRaceModeA)
      let observer = LoopObserver(activities: [.beforeWaiting], repeats: false) { _, _ in callout() }
      loop.add(observer, to: endRaceModeA)
      members.append { hold.invalidate() }
      members.append { observer.invalidate() }
    }
    _ = loop.run(mode: endRaceModeA, for: .milliseconds(150))
    members.forEach { $0() }
    holdB.invalidate()
    log.add("outer-end")
  }
}

/// An actor on a loop that sleeps for an hour.
actor HourSleepingActor: LoopActor {
  nonisolated let loop: RunLoopThread
  init(loop: RunLoopThread) { self.loop = loop }

}

extension HourSleepingActor {
  func sleepLong() async -> Bool {
    do {
      try await Task.sleep(for: .seconds(3600))
      return false
    } catch { return error is CancellationError }
  }
}

/// Consumes `sequence` on the loop and invalidates it from inside the loop after `after` elements.
actor SelfInvalidatingConsumerActor: LoopActor {
  nonisolated let loop: RunLoopThread
  init(loop: RunLoopThread) { self.loop = loop }

  func consume(
    _ sequence: SourceSequence<Int>, invalidatingAfter after: Int
  ) async -> (seen: [Int], late: SourcePostResult?) {
    var seen: [Int] = []
    var late: SourcePostResult?
    for await value in sequence {
      seen.append(value)
      if seen.count == after {
        sequence.invalidate()
        late = sequence.post(-1)
      }
    }
    return (seen, late)
  }
}

/// A weak reference readable from any thread.
final class WeakReference: @unchecked Sendable {  // Safety: only a weak reference, set in init
  weak var value: AnyObject?
  init(_ value: AnyObject) { self.value = value }
  var isGone: Bool { value == nil }
}

/// `assumeIsolated` from synchronous code.
func assumeIsolatedFromSyncCode(_ actor: CallLoggingActor) {
  actor.assumeIsolated { _ in }
}

/// An actor on a loop that asks its own loop for a modal run.
actor OwnLoopModalActor: LoopActor {
  nonisolated let loop: RunLoopThread
  private(set) var pokes = 0
  init(loop: RunLoopThread) { self.loop = loop }

  func modal(returnAfterSourceHandled: Bool = false) async -> RunLoopRunResult? {
    try? await loop.runModal(mode: endRaceModeA, returnAfterSourceHandled: returnAfterSourceHandled)
  }

  func poke(stopping: Bool) {
    pokes += 1
    if stopping { loop.stop() }
  }
}

/// An actor on a loop that sleeps briefly.
actor NappingActor: LoopActor {
  nonisolated let loop: RunLoopThread
  init(loop: RunLoopThread) { self.loop = loop }

  func nap() async -> Bool {
    do {
      try await Task.sleep(for: .milliseconds(2))
      return loop.isOnLoopThread
    } catch { return false }
  }
}

extension NappingActor {
  /// Sleeps on `LoopClock()` (the caller's loop while it runs, per its docs).
  func napOnDefaultClock() async -> Bool {
    (try? await LoopClock().sleep(for: .milliseconds(2))) != nil
  }
}

/// How many timer schedulings `loop` has made (read on its thread).
func timerSchedulings(_ loop: RunLoopThread) -> UInt64 {
  (try? loop.performAndWait { loop.core.timerSequence }) ?? 0
}

extension CallLoggingActor {
  /// Shuts this actor's own loop down from inside one of its methods.
  func shutDownOwnLoop() {
    loop.shutdownAndWait()  // on its own thread: only starts the shutdown
    entries.append(-1)
  }

  /// Waits for a block on `other`, from this actor's loop thread.
  func waitFor(_ other: RunLoopThread) -> String {
    do {
      return try other.performAndWait { "ran" }
    } catch {  // a RunLoopError: the block cannot throw
      if case .shutDown = error { return "shutDown" }
      return "\(error)"
    }
  }
}
