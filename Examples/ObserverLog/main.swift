import AsyncRunLoop
import Synchronization

// An observer log of one thread's passes: the main thread runs its loop in a mode of its own
// holding a repeating timer, a custom input source and an observer of every activity. The
// observer prints each activity it is told, so the log shows the order of one pass: entry once,
// then per pass beforeTimers, beforeSources (sources fire), beforeWaiting, the sleep,
// afterWaiting, then the due timers; exit once the run ends.
//
// The timer's second fire signals the source (it fires in the next pass, without a sleep before
// it); its third fire invalidates the timer and the source, which leaves the mode with nothing to
// watch, so the run returns `finished`.
//
// Run it: swift run ObserverLogExample

/// The log's counters. Only the main thread (the loop's) touches them; atomics only so that the
/// `@Sendable` callouts may share them, so relaxed ordering is enough.
enum Log {
  static let pass = Atomic<Int>(0)
  static let timerFires = Atomic<Int>(0)

  /// Prints `line` under the current pass number.
  static func print(_ line: String) {
    Swift.print("pass \(pass.load(ordering: .relaxed)): \(line)")
  }
}

let loop = RunLoopThread.main  // this thread's loop: the callouts below run on this thread
let mode: RunLoopMode = "log"  // a mode of our own: only our members, so only our wake-ups

let observer = LoopObserver(activities: .all) { _, activity in
  if activity == .beforeTimers { Log.pass.add(1, ordering: .relaxed) }
  Log.print("\(activity)")
}

let source = InputSource { _ in
  Log.print("  source fired")
}

let timer = LoopTimer(after: .milliseconds(20), repeatingEvery: .milliseconds(20)) { timer in
  let fire = Log.timerFires.add(1, ordering: .relaxed).newValue
  Log.print("  timer fired (\(fire))")
  switch fire {
  case 2:
    Log.print("  timer signals the source")
    source.signal()
  case 3:
    Log.print("  timer invalidates itself and the source")
    timer.invalidate()
    source.invalidate()
  default:
    break
  }
}

loop.add(observer, to: mode)
loop.add(source, to: mode)
loop.add(timer, to: mode)

// The watchdog limit only matters if something goes wrong: the run finishes after three fires.
let result = loop.run(mode: mode, for: .seconds(10))
observer.invalidate()
print("run returned \(result) after \(Log.timerFires.load(ordering: .relaxed)) timer fires")
precondition(result == .finished, "the run did not finish by itself: \(result)")
