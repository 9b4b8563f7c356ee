import Glibc
import Testing

@testable import AsyncRunLoop

// Helpers for the tests of the loop-thread fast path for adds and removals (a call on the loop thread
// first applies the changes other threads sent, which may call out), the chunked inbox, timers,
// command sources and the executor. Blocking work runs on threads of the tests' own; results are
// checked after the watchdog returns.

let inboxModeA: RunLoopMode = "inbox-mode-a"

let inboxModeB: RunLoopMode = "inbox-mode-b"

let inboxModeC: RunLoopMode = "inbox-mode-c"

/// The modes of `loop` that hold `member`, read on its thread.
func loopModes(_ member: some LoopMember, on loop: RunLoopThread) -> [RunLoopMode]? {
  try? loop.performAndWait { loop.core.modes(of: member) }
}

/// Where a ping-pong command source is and what it delivered.
final class CommandPingPongScenario: Sendable {
  let loops: [RunLoopThread]
  let source = Guarded<InputSource?>(nil)
  let delivered = Guarded<[Int]>([])
  let moves = AtomicCounter()
  init(_ loops: [RunLoopThread]) { self.loops = loops }
}
