import Glibc
import Testing

@testable import AsyncRunLoop

// Helpers for the tests of sources signalled while their modes do not run (`SignalledSources.deferred`), executor
// jobs waiting in the inbox in chunks (`ChunkedQueue`), timer reschedule coalescing
// (`LoopTimer.pendingReschedule`), executor-job timers in the internal every-mode, and the shutdown
// drain. Blocking work runs on threads of the tests' own; results are checked after the watchdog
// returns.

let orderModeA: RunLoopMode = "order-mode-a"

let orderModeB: RunLoopMode = "order-mode-b"

let orderModeC: RunLoopMode = "order-mode-c"

let orderModeEmpty: RunLoopMode = "order-mode-empty"

let orderModeModal: RunLoopMode = "order-mode-modal"

let deferredSignalSteps = 1_500

/// One pass of `mode` on the calling loop thread.
func runOnePass(_ loop: RunLoopThread, _ mode: RunLoopMode) {
  _ = loop.run(mode: mode, until: .now)
}

/// A small deterministic pseudo-random sequence (a 64-bit LCG), so a failing round repeats.
struct SeededRandom {
  var state: UInt64
  mutating func next(_ bound: Int) -> Int {
    state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
    return Int((state >> 33) % UInt64(bound))
  }
}

/// Whether `values` is 0, 1, 2, … (each once, in order).
func isEachOnceInOrder(_ values: [Int], count: Int) -> Bool {
  values == Array(0..<count)
}

/// Where the moving source is, as the loop thread left it.
struct MovingSourcePlacement {
  var inB = false
  var inC = false
  var inCommon = false
  var onOther = false
  var onHome: Bool { inB || inC || inCommon }
}

extension RunLoopThread {
  /// Runs an empty block on the loop and waits for it, unless the loop has shut down.
  func performAndWaitIfRunning(_ body: @escaping @Sendable () -> Void) -> Bool {
    (try? performAndWait(body)) != nil
  }
}
