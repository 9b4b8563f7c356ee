import AsyncRunLoop
import CAsyncRunLoop
import Dispatch
import Foundation

// idle-cpu, timers-100k, loops-1000: what a loop costs when it does nothing, per timer, and to
// create and destroy. Single-loop scenarios: nothing is pinned, whatever `--pin` says.

/// idle-cpu: a loop with ten far-future timers (one of them repeating) sleeps for the window;
/// the value is the CPU time its thread used meanwhile (its POSIX thread CPU clock), the extra
/// `wakeups` the context switches it made (/proc/self/task/<tid>/status).
final class IdleLoopCPU: FigureSession {
  private let loop: RunLoopThread
  private let cpuClock: clockid_t
  private let threadID: Int32
  private let window: Int64
  private let timers: [LoopTimer]

  init(window: Int64) {
    self.window = window
    loop = try! RunLoopThread(name: "idle")
    (cpuClock, threadID) = try! loop.performAndWait { (currentThreadCPUClock(), carl_gettid()) }
    timers =
      (1...9).map { hours in LoopTimer(after: .seconds(3600 * hours)) { _ in } }
      + [LoopTimer(after: .seconds(7200), repeatingEvery: .seconds(7200)) { _ in }]
    for timer in timers { loop.add(timer, to: .default) }
  }

  func measure() -> Figure {
    sleepNanoseconds(50_000_000)  // let the loop apply the additions and go to sleep
    let switchesBefore = contextSwitches()
    guard let before = threadCPUNanoseconds(cpuClock) else {
      progress("idle-cpu: cannot read the loop thread's CPU clock")
      return Figure(value: .nan)
    }
    sleepNanoseconds(window)
    let used = (threadCPUNanoseconds(cpuClock) ?? .max) - before
    let switches = contextSwitches() - switchesBefore
    // The thread's CPU time since it started (at least its start-up work): shows the clock works.
    return Figure(
      value: Double(used), extras: [("wakeups", Double(switches)), ("thread_cpu_total_ns", Double(before))])
  }

  /// Voluntary + involuntary context switches of the loop thread so far.
  private func contextSwitches() -> Int {
    guard let status = try? String(contentsOfFile: "/proc/self/task/\(threadID)/status", encoding: .utf8) else {
      return 0
    }
    var total = 0
    for line in status.split(separator: "\n") where line.contains("ctxt_switches:") {
      total += Int(line.split(separator: ":").last!.trimmingCharacters(in: .whitespaces)) ?? 0
    }
    return total
  }

  func close() {
    for timer in timers { timer.invalidate() }
    loop.shutdownAndWait()
  }
}

/// Counts fired timers on the loop thread and notes when the last one fired.
private final class FireCounter: @unchecked Sendable {
  // Safety: `fired`, `started`, `scheduled` and `finished` are only touched on the loop thread
  // (the scheduling block and the timer handlers); the measuring thread reads them after `done`.
  var fired = 0
  var started: Int64 = 0
  var scheduled: Int64 = 0
  var finished: Int64 = 0
  let target: Int
  let done = DispatchSemaphore(value: 0)
  init(target: Int) { self.target = target }
}

/// timers-100k: on the loop thread, schedule `count` one-shot timers due now + i ns (so all are
/// due by the time scheduling ends) and fire them all; the value is the total time from the first
/// schedule to the last fire, per timer. Extras: `schedule_ns` and `fire_ns`, the two halves.
final class ManyTimers: FigureSession {
  private let loop: RunLoopThread
  private let count: Int

  init(count: Int) {
    self.count = count
    loop = try! RunLoopThread(name: "timers")
  }

  func measure() -> Figure {
    let counter = FireCounter(target: count)
    let count = self.count
    let loop = self.loop
    loop.perform {
      let start = monotonicNanoseconds()
      counter.started = start
      for index in 0..<count {
        let timer = LoopTimer(fireAt: LoopClock.Instant(nanoseconds: start + Int64(index))) { _ in
          counter.fired += 1
          if counter.fired == counter.target {
            counter.finished = monotonicNanoseconds()
            counter.done.signal()
          }
        }
        loop.add(timer, to: .default)
      }
      counter.scheduled = monotonicNanoseconds()
    }
    counter.done.wait()
    let perTimer = Double(count)
    return Figure(
      value: Double(counter.finished - counter.started) / perTimer,
      extras: [
        ("schedule_ns", Double(counter.scheduled - counter.started) / perTimer),
        ("fire_ns", Double(counter.finished - counter.scheduled) / perTimer),
      ])
  }

  func close() { loop.shutdownAndWait() }
}

/// loops-1000: create `count` loops (owned threads, each with its epoll, eventfd and timerfd) in
/// batches of 100 and shut each batch down (`shutdownAndWait`); the value is the total time in
/// ms. Extras: descriptors and threads left over afterwards (/proc/self/fd, and the threads in
/// /proc/self/task named after these loops).
final class ManyLoops: FigureSession {
  private let count: Int
  private let batch = 100

  init(count: Int) { self.count = count }

  func measure() -> Figure {
    let descriptorsBefore = openDescriptorCount()
    let start = monotonicNanoseconds()
    var created = 0
    while created < count {
      let size = min(batch, count - created)
      let loops = (0..<size).map { index in try! RunLoopThread(name: "manyloops-\(created + index)") }
      for loop in loops { loop.shutdown() }
      for loop in loops { loop.shutdownAndWait() }
      created += size
    }
    let elapsed = monotonicNanoseconds() - start
    // A loop thread that finished its drain before `shutdownAndWait` registered to join it
    // detaches itself, and `shutdownAndWait` then returns when the drain is done, while the
    // kernel thread may still be exiting: count those separately ("lingering"), then give them up
    // to a second to go before calling anything left a leak.
    let lingering = threadsNamed(prefix: "manyloops-")
    var leakedThreads = lingering
    var leakedDescriptors = openDescriptorCount() - descriptorsBefore
    var waited = 0
    while (leakedThreads > 0 || leakedDescriptors > 0) && waited < 1_000 {
      sleepNanoseconds(10_000_000)
      waited += 10
      leakedThreads = threadsNamed(prefix: "manyloops-")
      leakedDescriptors = openDescriptorCount() - descriptorsBefore
    }
    return Figure(
      value: Double(elapsed) / 1e6,
      extras: [
        ("leaked_fds", Double(leakedDescriptors)), ("leaked_threads", Double(leakedThreads)),
        ("lingering_threads_at_return", Double(lingering)),
      ])
  }

  /// Threads of this process whose name starts with `prefix`.
  private func threadsNamed(prefix: String) -> Int {
    guard let tasks = try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task") else { return -1 }
    return tasks.filter { tid in
      let name = (try? String(contentsOfFile: "/proc/self/task/\(tid)/comm", encoding: .utf8)) ?? ""
      return name.hasPrefix(prefix)
    }.count
  }

  func close() {}
}

enum ResourceScenarios {
  static func idleCPU(_ context: BenchmarkContext) -> ScenarioResult {
    let window = context.mode.idleWindowNanoseconds
    return asyncRunLoopFigure(
      "idle-cpu", unit: "ns",
      note: "CPU time of an idle loop thread (ten far-future timers) over \(window / 1_000_000) ms;"
        + " wakeups = its context switches",
      warmUp: false, mode: context.mode
    ) { IdleLoopCPU(window: window) }
  }

  static func timers100k(_ context: BenchmarkContext) -> ScenarioResult {
    let count = context.mode.timerCount
    return asyncRunLoopFigure(
      "timers-100k", unit: "ns",
      note: "schedule and fire \(count) one-shot timers on the loop thread; ns per timer (schedule + fire)",
      warmUp: true, mode: context.mode
    ) { ManyTimers(count: count) }
  }

  static func loops1000(_ context: BenchmarkContext) -> ScenarioResult {
    let count = context.mode.loopCount
    return asyncRunLoopFigure(
      "loops-1000", unit: "ms",
      note: "create and shut down \(count) loops (batches of 100); total ms, and what was left over",
      warmUp: false, mode: context.mode
    ) { ManyLoops(count: count) }
  }

  /// A resource figure with asyncrunloop as its only peer, taken `figureRepetitions` times.
  private static func asyncRunLoopFigure(
    _ name: String, unit: String, note: String, warmUp: Bool, mode: RunMode,
    open: @escaping () -> any FigureSession
  ) -> ScenarioResult {
    runFigureScenario(
      name, unit: unit, notes: [note], peers: [PeerSpec(name: "asyncrunloop", open: open)],
      warmUp: warmUp, repetitions: mode.figureRepetitions)
  }
}
