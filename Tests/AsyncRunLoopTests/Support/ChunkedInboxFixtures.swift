import Glibc
import Testing

@testable import AsyncRunLoop

// Helpers for the tests of the loop-thread fast path for adds and removals (a call on the loop thread
// first applies the changes other threads sent, which may call out), the chunked inbox, timers,
// command sources and the executor. Blocking work runs on threads of the tests' own; results are
// checked after the watchdog returns.

let r13ModeA: RunLoopMode = "r13-a"

let r13ModeB: RunLoopMode = "r13-b"

let r13ModeC: RunLoopMode = "r13-c"

/// An object to watch with a weak reference (captured by a member's closure).
final class R13Token: Sendable {}

/// The number of records `loop` holds, read on its thread (nil when it refused: shut down).
func r13RecordCount(_ loop: RunLoopThread) -> Int? {
  try? loop.performAndWait { loop.core.modeTable.allRecords.count }
}

/// The modes of `loop` that hold `member`, read on its thread.
func r13Modes(_ member: some LoopMember, on loop: RunLoopThread) -> [RunLoopMode]? {
  try? loop.performAndWait { loop.core.modes(of: member) }
}

/// Runs `body` on the loop thread of `loop` (a performed block) while a change sent from another
/// thread waits in the inbox: `pending` sends it once the block runs. Returns what `body` returned.
func r13WithChangeWaiting<T: Sendable>(
  on loop: RunLoopThread, pending: @escaping @Sendable () -> Void, _ body: @escaping @Sendable () -> T
) -> T? {
  let started = TestGate()
  let go = TestGate()
  let result = Locked<T?>(nil)
  let done = TestGate()
  loop.perform {
    started.open()
    _ = go.wait(timeout: .seconds(10))
    let value = body()
    result.withLock { $0 = value }
    done.open()
  }
  guard started.wait(timeout: .seconds(10)) else { return nil }
  pending()
  go.open()
  guard done.wait(timeout: .seconds(10)) else { return nil }
  return result.withLock { $0 }
}

/// Where a ping-pong command source is and what it delivered.
final class R13PingPong: Sendable {
  let loops: [RunLoopThread]
  let source = Guarded<InputSource?>(nil)
  let delivered = Guarded<[Int]>([])
  let moves = AtomicCounter()
  init(_ loops: [RunLoopThread]) { self.loops = loops }
}

/// An actor pinned to a loop that counts its calls and checks its isolation on each.
actor R13Counter: LoopActor {
  nonisolated let loop: RunLoopThread
  private var calls = 0
  private(set) var misisolated = 0
  init(loop: RunLoopThread) { self.loop = loop }

  func call() -> Int {
    if loop.isIsolatingCurrentContext() != true { misisolated += 1 }
    calls += 1
    return calls
  }
}
