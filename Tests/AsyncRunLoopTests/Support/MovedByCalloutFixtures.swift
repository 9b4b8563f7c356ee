import Glibc
import Testing

@testable import AsyncRunLoop

// Helpers for the tests of timers whose callouts move them between loops (one-shot timers' records on the
// loop they were moved to, dates set during a deferred callout, shutdown of either loop), command
// sources whose closing drain waits for another loop's batch (what that wait can deadlock with),
// and the loop-thread fast path for adds and removals. Blocking work runs on threads of the tests'
// own; results are checked after the watchdog returns.

let movedModeA: RunLoopMode = "moved-mode-a"

let movedModeB: RunLoopMode = "moved-mode-b"

/// The number of records `loop` holds, read on its thread (nil when it refused: shut down).
func recordCount(_ loop: RunLoopThread) -> Int? {
  try? loop.performAndWait { loop.core.modeTable.allRecords.count }
}

/// What a moved batch's scenario shares with its two halves: the loops, the command source (held
/// only here: dropping it invalidates the source), its buffer, notes, and a gate the handler may
/// wait on.
final class MovedBatch: Sendable {
  let loopA: RunLoopThread
  let loopB: RunLoopThread
  let loopC: RunLoopThread
  let command = Locked<CommandSource<Int>?>(nil)
  let source = Locked<InputSource?>(nil)
  let buffer = Locked<CommandBuffer<Int>?>(nil)
  let notes = Locked<[String]>([])
  let leave = TestGate()

  init(_ name: String) throws {
    loopA = try RunLoopThread(name: "\(name)-a")
    loopB = try RunLoopThread(name: "\(name)-b")
    loopC = try RunLoopThread(name: "\(name)-c")
  }

  func note(_ text: String) { notes.withLock { $0.append(text) } }

  /// Whether B's closing drain waits for A's batch now.
  var closingDrainWaits: Bool {
    guard let buffer = buffer.withLock({ $0 }) else { return false }
    return buffer.lock.withLock { !buffer.closingWaiters.isEmpty }
  }

  func waitForClosingDrain() -> Bool {
    let deadline = ContinuousClock.now.advanced(by: .seconds(10))
    while !closingDrainWaits {
      if ContinuousClock.now >= deadline { return false }
      usleep(200)
    }
    return true
  }
}

/// What a moved batch delivered.
struct MovedOutcome: Sendable {
  var delivered: [Int]
  var accepted: [Int]
  var cancels: Int
  /// Commands delivered after the last (second) cancel.
  var afterLastCancel: Int
  var notes: [String]
  var captureGone: Bool
}
