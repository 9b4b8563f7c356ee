import Glibc
import Testing

@testable import AsyncRunLoop

// Helpers for the tests of the per-pass budget of cross-thread registration changes (at most 256 per
// pass, shared by the pass's points; nested runs make passes of their own and give back what is
// left; blocks, jobs and signals sent after a waiting change wait for it), attacked with bursts
// larger than a budget, nested runs from every kind of callout, refused descriptor adds, and
// shutdowns while a burst waits.

/// An input source that counts its routines; `onSchedule` runs (with the number of schedules so
/// far, this one included) inside the schedule routine.
final class RoutineCountingSource: Sendable {
  let schedules = AtomicCounter()
  let cancels = AtomicCounter()
  let performs = AtomicCounter()
  let source: InputSource

  init(index: Int = 0, onSchedule: (@Sendable (Int, RunLoopThread) -> Void)? = nil) {
    let schedules = self.schedules
    let cancels = self.cancels
    let performs = self.performs
    source = InputSource(
      schedule: { _, loop, _ in
        schedules.increment()
        onSchedule?(index, loop)
      },
      cancel: { _, _ in cancels.increment() },
      perform: { _ in performs.increment() })
  }
}

/// The total of every source's schedule routine calls.
func totalSchedules(_ sources: [RoutineCountingSource]) -> Int { sources.reduce(0) { $0 + $1.schedules.current } }

/// Sources whose schedule and cancel counts are not exactly `schedules` and `cancels`.
func miscounted(_ sources: [RoutineCountingSource], schedules: Int, cancels: Int) -> [String] {
  sources.enumerated().compactMap { index, counted in
    let (got, gotCancels) = (counted.schedules.current, counted.cancels.current)
    return got == schedules && gotCancels == cancels ? nil : "source \(index): schedule \(got), cancel \(gotCancels)"
  }
}

/// A regular file's descriptor (unlinked at once): epoll refuses it with EPERM.
func openRegularFile() -> Int32 {
  var template = Array("/tmp/asyncrunloop-test-XXXXXX".utf8CString)
  let descriptor = template.withUnsafeMutableBufferPointer { mkstemp($0.baseAddress!) }
  precondition(descriptor >= 0, "mkstemp failed: \(errno)")
  template.withUnsafeBufferPointer { _ = unlink($0.baseAddress!) }
  _ = fcntl(descriptor, F_SETFD, FD_CLOEXEC)
  return descriptor
}

/// A descriptor number above the process's limit: never open (no other test can reuse it).
let neverOpenedDescriptor: Int32 = 1_000_000

/// 20,000 adds wait on a held loop A; each one's schedule routine adds, on A's thread, a timer of
/// its own. With `staleOnB`, each timer was last changed from another thread on loop B, whose
/// inbox numbers are all past A's. Traps unless all 20,000 are scheduled.
func deepLoopThreadAdds(staleOnB: Bool) throws {
  let count = 20_000
  let loopA = try RunLoopThread(name: "deep-a")
  let loopB = try RunLoopThread(name: "deep-b")
  let timers = (0..<count).map { _ in LoopTimer(after: .seconds(3_600)) { _ in } }
  if staleOnB {
    for _ in 0..<(count + 10_000) { loopB.perform {} }
    for timer in timers {
      loopB.add(timer)
      loopB.remove(timer)
    }
    try loopB.performAndWait {}
  }
  let scheduled = AtomicCounter()
  let sources = (0..<count).map { index in
    InputSource(
      schedule: { _, loop, _ in
        scheduled.increment()
        loop.add(timers[index])
      }, perform: { _ in })
  }
  burstBehindHeldLoop(sources, on: loopA) {}
  try loopA.performAndWait {}
  precondition(scheduled.current == count, "scheduled \(scheduled.current)")
  for timer in timers { timer.invalidate() }
  for source in sources { source.invalidate() }
  loopA.shutdownAndWait()
  loopB.shutdownAndWait()
}

actor ModeCountReadingActor: LoopActor {
  nonisolated let loop: RunLoopThread
  init(loop: RunLoopThread) { self.loop = loop }
  func record(_ counter: AtomicCounter, into box: Guarded<Int>) {
    let now = counter.current
    box.withLock { $0 = now }
  }
  func modeCounts(_ sources: [InputSource], _ timers: [LoopTimer]) -> (sources: [Int], timers: [Int]) {
    (sources.map { loop.core.modeCount(of: $0) }, timers.map { loop.core.modeCount(of: $0) })
  }
}

/// A member kind moved between modes behind a burst.
enum MovedMemberKind: String, CaseIterable, Sendable, CustomTestStringConvertible {
  case timer, descriptor, observer
  var testDescription: String { rawValue }
}

/// Where a refused descriptor add is made from (on the loop thread).
enum RefusedAddCallout: String, CaseIterable, Sendable, CustomTestStringConvertible {
  case observer, timer, block, handler, schedule, observerInNestedRun
  var testDescription: String { rawValue }
}

/// Helpers shared by the suites that conform (they call them as `Self.name` or by name).
protocol ChangeBudgetMeasures {}

extension ChangeBudgetMeasures {
  static func moveBehind(fillers: Int, kind: MovedMemberKind) throws -> (before: Int, after: Int)? {
    let other: RunLoopMode = "moved-other"
    return try withWatchdogSync(timeout: .seconds(20), "moved \(kind)") { () -> (before: Int, after: Int) in
      let loop = try RunLoopThread(name: "moved")
      defer { loop.shutdownAndWait() }
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      writeByte(pipe.write)
      let calls = AtomicCounter()
      let timer = LoopTimer(after: .zero) { _ in calls.increment() }
      let descriptor = DescriptorSource(descriptor: pipe.read) { source, _ in
        drainDescriptor(source.descriptor)
        calls.increment()
      }
      let observer = LoopObserver(activities: .beforeTimers, repeats: false) { _, _ in calls.increment() }
      let sources = (0..<fillers).map { _ in RoutineCountingSource() }
      @Sendable func move(to mode: RunLoopMode, removing: RunLoopMode?) {
        switch kind {
        case .timer:
          if let removing { loop.remove(timer, from: removing) }
          loop.add(timer, to: mode)
        case .descriptor:
          if let removing { loop.remove(descriptor, from: removing) }
          try? loop.add(descriptor, to: mode)
        case .observer:
          if let removing { loop.remove(observer, from: removing) }
          loop.add(observer, to: mode)
        }
      }
      let keepAlive = LoopTimer(after: .seconds(3_600)) { _ in }  // a run of the other mode makes a pass
      loop.add(keepAlive, to: other)
      burstBehindHeldLoop(sources.map(\.source), on: loop) {
        move(to: .default, removing: nil)
      } then: {
        move(to: other, removing: .default)
      }
      try loop.performAndWait {}
      try loop.performAndWait {}
      let before = calls.current
      try loop.performAndWait { _ = loop.run(mode: other, until: .now) }
      let after = calls.current
      timer.invalidate()
      descriptor.invalidate()
      observer.invalidate()
      keepAlive.invalidate()
      for counted in sources { counted.source.invalidate() }
      try loop.performAndWait {}
      return (before, after)
    }
  }

  /// Held loop: 400 adds, a timer's add, 400 adds; the 6th add's schedule routine re-times the
  /// timer on the loop thread. Returns its fires after the burst, and after a re-timing to now
  /// from another thread (the later case).
  static func retimeOnTheLoop(sooner: Bool) throws -> (early: Int, late: Int)? {
    try withWatchdogSync(timeout: .seconds(20), "re-timed on the loop") { () -> (early: Int, late: Int) in
      let loop = try RunLoopThread(name: "retime-loop")
      defer { loop.shutdownAndWait() }
      let fired = AtomicCounter()
      let timer = LoopTimer(after: sooner ? .seconds(3_600) : .zero) { _ in fired.increment() }
      let sources = (0..<800).map { index in
        RoutineCountingSource(index: index) { index, _ in
          guard index == 5 else { return }
          timer.setFireDate(sooner ? .now : .now.advanced(by: .seconds(3_600)))
        }
      }
      let release = blockLoop(loop)
      for counted in sources[..<400] { loop.add(counted.source) }
      loop.add(timer)
      for counted in sources[400...] { loop.add(counted.source) }
      release.open()
      try loop.performAndWait {}
      if sooner { waitUntil(timeout: .seconds(10), "the sooner fire") { fired.current >= 1 } }
      try loop.performAndWait {}
      let early = fired.current
      if !sooner {
        timer.setFireDate(.now)
        waitUntil(timeout: .seconds(3), "the re-timed fire") { fired.current >= 1 }
      }
      try loop.performAndWait {}
      try loop.performAndWait {}
      let late = fired.current
      timer.invalidate()
      for counted in sources { counted.source.invalidate() }
      return (early, late)
    }
  }
}
