import AsyncRunLoop
import AsyncRunLoopFoundation
import CoreFoundation
import Foundation

// A modal run of one loop nested in a callout of the other still serves both loops.

/// `runMainLoop()` drives; a LoopTimer's handler runs `RunLoop.main.run(mode:before:)` nested,
/// during which a LoopTimer and a Foundation timer both fire.
func foundationModalInOurCalloutScenario() {
  MainLoopBridge.install()
  let seen = Locked<[String]>([])
  RunLoopThread.main.add(
    LoopTimer(after: .milliseconds(10)) { _ in
      RunLoopThread.main.add(LoopTimer(after: .milliseconds(100)) { _ in seen.withLock { $0.append("loop") } })
      _ = Timer.scheduledTimer(withTimeInterval: 0.2, repeats: false) { _ in
        seen.withLock { $0.append("foundation") }
      }
      let end = Date(timeIntervalSinceNow: 0.4)
      while Date() < end {
        _ = RunLoop.main.run(mode: .default, before: end)
      }
      seen.withLock { $0.append("modal-ended") }
      stopMainLoop()
    })
  runMainLoop()
  check(seen.snapshot == ["loop", "foundation", "modal-ended"], "nested Foundation run saw \(seen.snapshot)")
  // Foundation's runs nested in our callout held nothing: runMainLoop() has returned, so the main
  // loop is not running and a caller that would wait for it is refused, not left hanging.
  check(!RunLoopThread.isMainLoopRunning, "the main loop still counts as running after runMainLoop() returned")
  let call = BlockedMainCall()
  check(call.waitForEnd(seconds: 2), "runOnMainAndWait still blocked 2 s although nothing serves the main loop")
  check(call.outcome.snapshot == "refused", "runOnMainAndWait \(call.outcome.snapshot ?? "")")
  say("seen \(seen.snapshot)")
}

/// `RunLoop.main.run()` drives; a Foundation timer's handler runs `RunLoopThread.main.run(mode:until:)`
/// nested, during which a Foundation timer and a LoopTimer both fire.
func ourModalInFoundationCalloutScenario() {
  MainLoopBridge.install()
  let seen = Locked<[String]>([])
  let done = Locked(false)
  _ = Timer.scheduledTimer(withTimeInterval: 0.01, repeats: false) { _ in
    _ = Timer.scheduledTimer(withTimeInterval: 0.1, repeats: false) { _ in
      seen.withLock { $0.append("foundation") }
    }
    RunLoopThread.main.add(LoopTimer(after: .milliseconds(200)) { _ in seen.withLock { $0.append("loop") } })
    RunLoopThread.main.run(mode: .default, until: .now.advanced(by: .milliseconds(400)))
    seen.withLock { $0.append("modal-ended") }
    done.withLock { $0 = true }
  }
  while !done.snapshot {
    _ = RunLoop.main.run(mode: .default, before: Date(timeIntervalSinceNow: 1))
  }
  check(seen.snapshot == ["foundation", "loop", "modal-ended"], "nested AsyncRunLoop run saw \(seen.snapshot)")
  say("seen \(seen.snapshot)")
}
