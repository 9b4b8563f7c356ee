import AsyncRunLoop
import Dispatch
import Glibc

/// Calls made from another thread before the main loop runs (runOnMain, MainActor
/// tasks, DispatchQueue.main blocks, interleaved) are queued and run in call order on the main
/// thread once it runs; a runOnMain made on the main thread meanwhile (before `runMainLoop()`, and
/// from a main-loop timer's callout) runs inline, in the caller's frame, ahead of them.
func mainQueuedBeforeRunScenario() {
  let calls = 3000
  let received = Locked<[Int]>([])
  let record: @Sendable (Int) -> Void = { sequence in
    check(isOnMainThread, "call \(sequence) ran off the main thread")
    MainActor.assumeIsolated {}
    received.withLock { $0.append(sequence) }
  }
  let sender = PlainThread {
    for sequence in 0..<calls {
      switch sequence % 3 {
      case 0: runOnMain { record(sequence) }
      case 1: Task { @MainActor in record(sequence) }
      default: DispatchQueue.main.async { record(sequence) }
      }
    }
    runOnMain { stopMainLoop() }  // queued behind every call
  }
  sender.join()
  check(!RunLoopThread.isMainLoopRunning, "the main loop runs before runMainLoop()")
  let inlineRan = Locked(false)
  runOnMain { inlineRan.withLock { $0 = true } }
  check(inlineRan.current, "runOnMain on the main thread did not run inline")
  check(received.current.isEmpty, "queued calls ran before the main loop did")
  let calloutInline = Locked<Bool?>(nil)
  let timer = LoopTimer(after: .zero) { _ in
    let ran = Locked(false)
    runOnMain { ran.withLock { $0 = true } }
    calloutInline.withLock { $0 = ran.current }
  }
  RunLoopThread.main.add(timer, to: .common)
  runMainLoop()
  let order = received.current
  check(order == Array(0..<calls), "calls ran out of order or were lost: \(order.count) of \(calls)")
  if let inline = calloutInline.current {
    check(inline, "runOnMain in a main-loop timer's callout did not run inline")
  }
  timer.invalidate()
  say("round20 queued-before-run: \(order.count) calls in order")
}
