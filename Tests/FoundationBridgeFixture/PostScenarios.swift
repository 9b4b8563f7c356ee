import AsyncRunLoop
import AsyncRunLoopFoundation
import CoreFoundation
import Foundation

// Posts across the bridge are delivered exactly once, in order; a side that shuts down or stops
// with work queued on the other loses none of it.

let postCount = 1_000_000

/// Counts deliveries on the main thread and checks each is the next one expected.
final class Delivery: @unchecked Sendable {
  // Safety: `next` is only touched on the main thread (the blocks run there; checked).
  private var next = 0
  let done = Locked(false)

  func deliver(_ index: Int) {
    check(isOnMainThread, "post \(index) ran off the main thread")
    check(index == next, "post \(index) arrived when \(next) was expected")
    next += 1
    if next == postCount {
      done.withLock { $0 = true }
      CFRunLoopStop(CFRunLoopGetMain())  // ends the innermost CF run, whichever loop drives
    }
  }

  var delivered: Int { next }
}

/// `RunLoop.main.run()` drives; another thread posts 1,000,000 blocks to our main loop.
func postsIntoOurLoopScenario() {
  MainLoopBridge.install()
  let delivery = Delivery()
  startThread {
    for index in 0..<postCount {
      let accepted = RunLoopThread.main.perform(inModes: [.default]) { delivery.deliver(index) }
      check(accepted, "perform \(index) was refused")
    }
  }
  while !delivery.done.snapshot {
    _ = RunLoop.main.run(mode: .default, before: Date(timeIntervalSinceNow: 10))
  }
  say("delivered \(delivery.delivered)")
}

/// `runMainLoop()` drives; another thread posts 1,000,000 CF blocks (each with a wake-up) to
/// Foundation's main run loop.
func postsIntoFoundationScenario() {
  MainLoopBridge.install()
  let delivery = Delivery()
  RunLoopThread.main.add(LoopTimer(after: .seconds(3600)) { _ in })  // the default mode holds something
  startThread {
    let main = CFRunLoopGetMain()
    for index in 0..<postCount {
      CFRunLoopPerformBlock(main, kCFRunLoopDefaultMode) {
        delivery.deliver(index)
        if delivery.done.snapshot { stopMainLoop() }
      }
      CFRunLoopWakeUp(main)
    }
  }
  runMainLoop()
  check(delivery.delivered == postCount, "delivered \(delivery.delivered) of \(postCount)")
  say("delivered \(delivery.delivered)")
}

/// CF drives; our main loop shuts down with blocks and jobs queued: every one accepted runs (the
/// pass after the shutdown drains the loop); Foundation's loop goes on.
func ourShutdownUnderFoundationScenario() {
  MainLoopBridge.install()
  let ran = Locked(0)
  let accepted = Locked(0)
  let cfRan = Locked(false)
  let queued = Locked(false)
  startThread {
    for _ in 0..<1000 {
      if RunLoopThread.main.perform(inModes: [.default], { ran.withLock { $0 += 1 } }) {
        accepted.withLock { $0 += 1 }
      }
    }
    RunLoopThread.main.shutdown()
    queued.withLock { $0 = true }
    CFRunLoopPerformBlock(CFRunLoopGetMain(), kCFRunLoopDefaultMode) { cfRan.withLock { $0 = true } }
    CFRunLoopWakeUp(CFRunLoopGetMain())
  }
  while !(queued.snapshot && cfRan.snapshot && RunLoopThread.main.isShutDown) {
    _ = RunLoop.main.run(mode: .default, before: Date(timeIntervalSinceNow: 1))
  }
  // One more CF turn: the pass after the shutdown drains what was accepted.
  _ = RunLoop.main.run(mode: .default, before: Date(timeIntervalSinceNow: 0.2))
  check(ran.snapshot == accepted.snapshot, "\(ran.snapshot) of \(accepted.snapshot) accepted blocks ran")
  check(accepted.snapshot == 1000, "only \(accepted.snapshot) of 1000 blocks were accepted before the shutdown")
  say("ran \(ran.snapshot) of \(accepted.snapshot)")
}

/// Our loop drives and stops (`stopMainLoop()`, or `shutdown()` when `shutsDown`) with Foundation
/// blocks queued: none is lost, they run when Foundation's loop next runs.
func foundationWorkSurvivesOurStopScenario(shutsDown: Bool = false) {
  MainLoopBridge.install()
  let ran = Locked(0)
  RunLoopThread.main.add(
    LoopTimer(after: .milliseconds(10)) { _ in
      for _ in 0..<1000 {
        CFRunLoopPerformBlock(CFRunLoopGetMain(), kCFRunLoopDefaultMode) { ran.withLock { $0 += 1 } }
      }
      // Before CF had a turn.
      if shutsDown { RunLoopThread.main.shutdown() } else { stopMainLoop() }
    })
  runMainLoop()
  let before = ran.snapshot
  var rounds = 0
  while ran.snapshot < 1000 && rounds < 100 {
    _ = CFRunLoopRunInMode(kCFRunLoopDefaultMode, 0.01, false)
    rounds += 1
  }
  check(ran.snapshot == 1000, "\(ran.snapshot) of 1000 Foundation blocks ran")
  say("ran \(before) before the stop, \(ran.snapshot) in all")
}
