import Glibc

@testable import AsyncRunLoop

/// A thread that owns a `RunLoopThread.current` loop, publishes it and parks (never running the
/// loop) until `runOnce` or `exit`. Its loop is the case where a wait could last as long as the
/// thread lives.
final class ParkedLoopThread: Sendable {
  private let published = LockedValue<RunLoopThread?>(nil)
  private let commands = LockedValue<[@Sendable (RunLoopThread) -> Void]>([])
  let exit = TestGate()
  let exited = TestGate()

  init() {
    ExecThread { [published, commands, exit, exited] in
      published.withLock { $0 = RunLoopThread.current }
      let loop = RunLoopThread.current
      while !exit.wait(timeout: .milliseconds(2)) {
        for command in commands.withLock({ list in
          defer { list.removeAll() }; return list
        }) { command(loop) }
      }
      exited.open()
    }.detach()
  }

  func loop() async -> RunLoopThread {
    await execOnNewThread { [published] in
      while published.withLock({ $0 }) == nil { usleep(200) }
      return published.withLock { $0! }
    }
  }

  /// Runs `body` on the thread (once, at its next look).
  func onThread(_ body: @escaping @Sendable (RunLoopThread) -> Void) {
    commands.withLock { $0.append(body) }
  }

  func end() {
    published.withLock { $0 }?.shutdown()
    exit.open()
  }
}
