import AsyncRunLoop
import AsyncRunLoopFoundation
import CoreFoundation
import Foundation

// CF timer and source sequences on the main run loop (a CFRunLoopExecutor made on the main
// thread), consumed by a task on that executor, under either driver.

/// Signals sent to the main run loop's source sequence from another thread.
let mainSignalCount = 10_000

/// A task on the main thread's executor takes five firings of a CF timer, then every signal of a
/// CF source signalled from another thread; both callouts and the consumer run on the main
/// thread. `foundationDrives`: `RunLoop.main.run(mode:before:)` runs the main thread, else
/// `runMainLoop()` (the executor's blocks and the CF callouts then run in CF's run that is our
/// main loop's sleep).
func mainSequencesScenario(foundationDrives: Bool) {
  MainLoopBridge.install()
  let executor = CFRunLoopExecutor()
  let done = Locked(false)
  Task(executorPreference: executor) {
    var firings = 0
    for await tick in executor.timer(every: .milliseconds(20)) {
      check(isOnMainThread, "a timer tick reached its consumer off the main thread")
      firings += tick.firings
      if firings >= 5 { break }
    }
    let sequence = executor.sourceSequence()
    startThread {
      let refused = (0..<mainSignalCount).filter { _ in !sequence.signal() }.count
      check(refused == 0, "\(refused) signals were refused before the invalidation")
      sequence.invalidate()
    }
    var signals = 0
    var elements = 0
    for await performance in sequence {
      check(isOnMainThread, "a source performance reached its consumer off the main thread")
      signals += performance.signals
      elements += 1
    }
    check(signals == mainSignalCount, "\(signals) of \(mainSignalCount) signals were delivered")
    say("\(firings) timer firings, \(mainSignalCount) signals in \(elements) elements, all on the main thread")
    done.withLock { $0 = true }
    if foundationDrives { CFRunLoopStop(CFRunLoopGetMain()) } else { stopMainLoop() }
  }
  if foundationDrives {
    while !done.snapshot { _ = RunLoop.main.run(mode: .default, before: Date(timeIntervalSinceNow: 10)) }
  } else {
    runMainLoop()
  }
  check(done.snapshot, "the main loop returned before the sequences were consumed")
}
