@_spi(Testing) import AsyncRunLoop
import CAsyncRunLoop
import Dispatch
import Foundation
import Synchronization

// timer-1ms-lateness: a timer repeating every 1 ms with no tolerance; each sample is one fire's
// lateness (when the handler ran minus when the fire was due), in µs. Every `measure` starts a
// fresh timer and stops it after `count` fires. A fire is due on the timer's grid
// (start + k·1 ms); after a late fire the timers skip to the next grid point, so lateness is
// measured against the latest due time.

/// The 1 ms interval.
private let intervalNanoseconds: Int64 = 1_000_000

/// Collects samples on whichever thread the timer fires on, and hands them over once complete.
private final class SampleCollector: @unchecked Sendable {
  // Safety: `samples` is only touched by the one thread (or serial queue) firing the timer until
  // `done` is signalled; the measuring thread reads it only after waiting on `done`.
  private var samples: [Double] = []
  private let target: Int
  private let done = DispatchSemaphore(value: 0)

  init(count: Int) {
    target = count
    samples.reserveCapacity(count)
  }

  /// Records one lateness; returns true when this was the last sample wanted.
  func record(latenessNanoseconds: Int64) -> Bool {
    guard samples.count < target else { return true }
    samples.append(Double(latenessNanoseconds) / 1000)
    if samples.count == target {
      done.signal()
      return true
    }
    return false
  }

  func wait() -> [Double] {
    done.wait()
    return samples
  }
}

/// floor-timerfd: a thread blocks in read() on a periodic absolute timerfd.
final class FloorTimerfdLateness: LatencySession {

  func measure(_ count: Int) -> [Double] {
    let collector = SampleCollector(count: count)
    let thread = PlainThread(name: "floor-timerfd", cpu: nil) {
      let descriptor = timerfd_create(CLOCK_MONOTONIC, Int32(TFD_CLOEXEC))
      precondition(descriptor >= 0, "timerfd_create failed")
      let start = monotonicNanoseconds() + intervalNanoseconds
      var spec = itimerspec()
      spec.it_value = timespec(tv_sec: Int(start / 1_000_000_000), tv_nsec: Int(start % 1_000_000_000))
      spec.it_interval = timespec(tv_sec: 0, tv_nsec: Int(intervalNanoseconds))
      timerfd_settime(descriptor, Int32(TFD_TIMER_ABSTIME), &spec, nil)
      var expirations: Int64 = 0
      while true {
        var newExpirations: UInt64 = 0
        guard read(descriptor, &newExpirations, 8) == 8 else { continue }
        let now = monotonicNanoseconds()
        expirations += Int64(newExpirations)
        let due = start + (expirations - 1) * intervalNanoseconds
        if collector.record(latenessNanoseconds: now - due) { break }
      }
      Glibc.close(descriptor)
    }
    let samples = collector.wait()
    thread.join()
    return samples
  }

  func close() {}
}

/// asyncrunloop: `for await tick in loop.timer(every: 1 ms, tolerance: .zero)` in a task whose
/// executor preference is the loop; lateness = when the consumer has the tick minus
/// `tick.scheduled` (the due instant it stands for).
final class TimerSequenceLateness: LatencySession {
  private let loop: RunLoopThread

  init() { loop = try! RunLoopThread(name: "timer-seq") }

  func measure(_ count: Int) -> [Double] {
    let ticks = loop.timer(every: .nanoseconds(intervalNanoseconds), tolerance: .zero)
    return blockingAwait(executor: loop) {
      var samples: [Double] = []
      samples.reserveCapacity(count)
      for await tick in ticks {
        samples.append(Double(monotonicNanoseconds() - tick.scheduled.nanoseconds) / 1000)
        if samples.count == count { break }
      }
      return samples
    }
  }

  func close() { loop.shutdownAndWait() }
}

/// asyncrunloop-looptimer: a repeating `LoopTimer` with a callback (the peer held against the
/// other callback timers); the handler reads the timer's current fire date (it moves to the next
/// grid point after the callout).
final class LoopTimerLateness: LatencySession {
  /// The timer's loop (`fill` adds idle members to it).
  let loop: RunLoopThread

  init() { loop = try! RunLoopThread(name: "looptimer") }

  func measure(_ count: Int) -> [Double] {
    let collector = SampleCollector(count: count)
    let timer = LoopTimer(
      after: .nanoseconds(intervalNanoseconds), repeatingEvery: .nanoseconds(intervalNanoseconds), tolerance: .zero
    ) { timer in
      let lateness = monotonicNanoseconds() - timer.fireDate.nanoseconds
      if collector.record(latenessNanoseconds: lateness) { timer.invalidate() }
    }
    loop.add(timer, to: .default)
    return collector.wait()
  }

  func close() { loop.shutdownAndWait() }
}

/// Sleeps on a 1 ms grid with `Task.sleep(until:tolerance:clock:)` (ContinuousClock, zero
/// tolerance) and returns `count` latenesses, measured with the same clock.
private func sleepOnGrid(count: Int) async -> [Double] {
  var samples: [Double] = []
  samples.reserveCapacity(count)
  let clock = ContinuousClock()
  let interval = Duration.nanoseconds(intervalNanoseconds)
  var deadline = clock.now.advanced(by: interval)
  while samples.count < count {
    try? await Task.sleep(until: deadline, tolerance: .zero, clock: clock)
    let now = clock.now
    let lateness = deadline.duration(to: now)
    samples.append(Double(lateness.components.seconds) * 1e6 + Double(lateness.components.attoseconds) / 1e12)
    while deadline <= now { deadline = deadline.advanced(by: interval) }
  }
  return samples
}

/// asyncrunloop-task-sleep: `Task.sleep` in a task whose executor preference is a loop: the
/// loop's `SchedulingExecutor` turns each sleep into a loop timer (checked with
/// `scheduledJobCount`).
final class LoopTaskSleepLateness: LatencySession {
  private let loop: RunLoopThread
  /// Sleeps the loop did not schedule itself (they went to the global executor's timers).
  private(set) var unroutedSleeps = 0

  init() { loop = try! RunLoopThread(name: "task-sleep") }

  func measure(_ count: Int) -> [Double] {
    let before = loop.scheduledJobCount
    let samples = blockingAwait(executor: loop) { await sleepOnGrid(count: count) }
    let routed = loop.scheduledJobCount - before
    if routed < count {
      unroutedSleeps += count - routed
      progress("timer-1ms-lateness: only \(routed) of \(count) Task.sleep calls were scheduled on the loop")
    }
    return samples
  }

  func close() { loop.shutdownAndWait() }
}

/// task-sleep: `Task.sleep` in a task on the default executor (the global executor's timers).
final class GlobalTaskSleepLateness: LatencySession {
  func measure(_ count: Int) -> [Double] {
    blockingAwait { await sleepOnGrid(count: count) }
  }

  func close() {}
}

/// dispatch-source-timer: a repeating `DispatchSourceTimer` with zero leeway on a serial queue;
/// lateness is measured with `DispatchTime` (the clock dispatch schedules it on), and `data`
/// (fires since the last handler) keeps the grid position.
final class DispatchTimerLateness: LatencySession {
  private let queue = DispatchQueue(label: "dispatch-timer")

  func measure(_ count: Int) -> [Double] {
    let collector = SampleCollector(count: count)
    let timer = DispatchSource.makeTimerSource(queue: queue)
    let start = DispatchTime.now().uptimeNanoseconds + UInt64(intervalNanoseconds)
    let grid = GridPosition()
    // The handler holds the timer until cancel() releases the handler.
    timer.setEventHandler {
      let now = DispatchTime.now().uptimeNanoseconds
      grid.fires += UInt64(timer.data)
      let due = start + (grid.fires - 1) * UInt64(intervalNanoseconds)
      if collector.record(latenessNanoseconds: Int64(now) - Int64(due)) { timer.cancel() }
    }
    timer.schedule(
      deadline: DispatchTime(uptimeNanoseconds: start), repeating: .nanoseconds(Int(intervalNanoseconds)),
      leeway: .nanoseconds(0))
    timer.resume()
    let samples = collector.wait()
    timer.cancel()
    return samples
  }

  func close() {}
}

/// foundation-timer: a repeating Foundation `Timer` (tolerance 0) on a pthread running
/// `RunLoop`; during the callout `fireDate` is the fire being delivered (CF moves it after the
/// callout), compared with `Date()`. Each batch gets a fresh run-loop thread, shut down right
/// after: once its repeating timer was invalidated, a swift-corelibs-foundation run loop thread
/// was seen spinning (99% of the process's CPU samples while the other timer peers ran), which
/// would make every other peer late.
final class FoundationTimerLateness: LatencySession {
  func measure(_ count: Int) -> [Double] {
    let server = FoundationLoopThread(name: "foundation-tmr", cpu: nil)
    let collector = SampleCollector(count: count)
    let timer = Timer(
      fire: Date(timeIntervalSinceNow: Double(intervalNanoseconds) / 1e9), interval: Double(intervalNanoseconds) / 1e9,
      repeats: true
    ) { timer in
      let lateness = Date().timeIntervalSince(timer.fireDate)
      if collector.record(latenessNanoseconds: Int64((lateness * 1e9).rounded())) { timer.invalidate() }
    }
    timer.tolerance = 0
    server.runLoop.add(timer, forMode: .default)
    let samples = collector.wait()
    server.shutdown()
    return samples
  }

  func close() {}
}

/// A timer peer whose first `settleFires` fires of each batch are not counted. Some peers start a
/// fresh thread and timer for every batch (Foundation's timer and the timerfd floor, see above),
/// others keep one thread for the whole scenario; a batch's first fires run on cold code and
/// caches, which would count against the peers that start afresh (at p99 most). Every peer gets
/// the same treatment.
final class SettledTimerSession: LatencySession {
  static let settleFires = 10
  private let inner: any LatencySession

  init(_ inner: any LatencySession) { self.inner = inner }

  func activate() { inner.activate() }
  func deactivate() { inner.deactivate() }
  func measure(_ count: Int) -> [Double] { Array(inner.measure(count + Self.settleFires).dropFirst(Self.settleFires)) }
  func close() { inner.close() }
}

/// How many fires a dispatch timer has delivered.
private final class GridPosition: @unchecked Sendable {
  // Safety: only touched by the timer's handler, which runs on one serial queue.
  var fires: UInt64 = 0
}

enum TimerScenarios {
  /// Single-threaded peers: nothing is pinned (a pinned timer thread only waits for whatever
  /// else runs on its CPU), whatever `--pin` says.
  static func timerLateness(_ context: BenchmarkContext) -> ScenarioResult {
    let peers: [PeerSpec<any LatencySession>] = [
      PeerSpec(name: "asyncrunloop", open: { TimerSequenceLateness() }),
      PeerSpec(name: "asyncrunloop-looptimer", open: { LoopTimerLateness() }),
      PeerSpec(name: "asyncrunloop-task-sleep", open: { LoopTaskSleepLateness() }),
      PeerSpec(name: "task-sleep", open: { GlobalTaskSleepLateness() }),
      PeerSpec(name: "dispatch-source-timer", open: { DispatchTimerLateness() }),
      PeerSpec(name: "foundation-timer", open: { FoundationTimerLateness() }),
      PeerSpec(name: "floor-timerfd", open: { FloorTimerfdLateness() }),
    ]
    return runLatencyScenario(
      "timer-1ms-lateness", floor: "floor-timerfd",
      notes: [
        "fire time minus due time of a 1 ms repeating timer (zero tolerance/leeway); µs per fire",
        "asyncrunloop-looptimer: a repeating LoopTimer callback, held against the callback timers"
          + " (dispatch-source-timer, foundation-timer); the sequence (a task resumed per tick) against task-sleep",
        "each batch's first \(SettledTimerSession.settleFires) fires are not counted (some peers start a fresh"
          + " thread per batch)",
        "single-threaded: not pinned, whatever --pin says",
      ],
      peers: peers.map { spec in
        PeerSpec(
          name: spec.name, open: spec.open.map { open in { SettledTimerSession(open()) } },
          unavailableReason: spec.unavailableReason)
      },
      samples: context.mode.timerFires, warmUp: max(10, context.mode.timerFires / 10),
      repetitions: context.mode.timerRepetitions)
  }
}
