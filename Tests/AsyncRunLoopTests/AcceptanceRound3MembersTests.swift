import Glibc
import Testing

@testable import AsyncRunLoop

/// Acceptance round 3 (members): the promises of the member doc comments (CommandSource,
/// InputSource, the member lifecycle, nested runs from every callout, async sequences, leaks),
/// each written as the interleaving that would break it. Public API only, except where a test
/// must name a constant.
@Suite("AcceptanceRound3Members", .timeLimit(.minutes(3)))
struct AcceptanceRound3Members {
  /// An event log shared with loop-thread callouts.
  final class Log: Sendable {
    let entries = Guarded<[String]>([])
    func add(_ entry: String) { entries.withLock { $0.append(entry) } }
    var snapshot: [String] { entries.snapshot }
    func count(_ entry: String) -> Int { snapshot.filter { $0 == entry }.count }
  }

  /// Blocks the loop in a performed block until the returned gate opens.
  static func blockLoop(_ loop: RunLoopThread) -> TestGate {
    let started = TestGate()
    let release = TestGate()
    loop.perform {
      started.open()
      _ = release.wait(timeout: .seconds(20))
    }
    _ = started.wait(timeout: .seconds(20))
    return release
  }

  /// Lets the loop apply what was sent before and make one more pass.
  static func settle(_ loop: RunLoopThread) throws {
    _ = try loop.performAndWait { 0 }
    _ = try loop.performAndWait { 0 }
  }

  // MARK: - CommandSource: nothing accepted is lost

  /// CommandSource: "Commands posted while the source is on no loop (after its removal from its
  /// last mode) wait for its next add; if it is invalidated instead, the loop it was last on
  /// delivers them." An add refused by a terminated loop invalidates the source (documented in
  /// `RunLoopThread+Members`); the loop it was last *on* is still alive and must deliver.
  @Test func commandsPostedWhileUnboundSurviveARefusedAddToATerminatedLoop() throws {
    let alive = try RunLoopThread(name: "ar3-alive")
    defer { alive.shutdownAndWait() }
    let dead = try RunLoopThread(name: "ar3-dead")
    dead.shutdownAndWait()
    let log = Log()
    let command = CommandSource<Int>(cancel: { _, loop in log.add("cancel@\(loop.name)") }) { value in
      log.add("cmd\(value)")
    }
    alive.add(command.source)
    try Self.settle(alive)
    alive.remove(command.source)
    try Self.settle(alive)
    #expect(log.snapshot == ["cancel@ar3-alive"])
    #expect(command.post(1), "the source is valid and on no loop: the post is accepted")
    dead.add(command.source)  // refused: the loop terminated; the source is invalidated
    #expect(!command.source.isValid)
    #expect(!command.post(2))
    _ = waitUntil(timeout: .seconds(5), "the accepted command delivered") { log.count("cmd1") == 1 }
    try Self.settle(alive)
    #expect(log.snapshot == ["cancel@ar3-alive", "cmd1"], "pending: \(command.pendingCount)")
  }

  /// A source moved to another loop while its old loop is still delivering a batch: the old
  /// loop's handler call and the new loop's deliveries must not overlap (the handler runs once
  /// per command, in posting order; the buffer's delivery queue is loop-thread state that two
  /// threads must never share).
  @Test func aMovedCommandSourceIsNotDeliveredOnTwoThreadsAtOnce() async throws {
    let loopA = try RunLoopThread(name: "ar3-move-a")
    let loopB = try RunLoopThread(name: "ar3-move-b")
    defer {
      loopA.shutdownAndWait()
      loopB.shutdownAndWait()
    }
    let log = Log()
    let inFirst = TestGate()
    let releaseFirst = TestGate()
    let command = CommandSource<Int> { value in
      let here = RunLoopThread.currentIfExists?.name ?? "?"
      log.add("start\(value)@\(here)")
      if value == 1 {
        inFirst.open()
        _ = releaseFirst.wait(timeout: .seconds(20))
      }
      log.add("end\(value)")
    }
    #expect(command.post(1))
    #expect(command.post(2))  // one batch with 1 (both wait for the add)
    loopA.add(command.source)
    let observed = try await withWatchdogOnThread(timeout: .seconds(30), "moved source") { () -> [String] in
      _ = inFirst.wait(timeout: .seconds(20))
      loopA.remove(command.source)  // its last mode: free to move at once
      loopB.add(command.source)
      _ = command.post(3)
      try Self.settle(loopB)  // B applied the add and fired the source
      let duringFirst = log.snapshot
      releaseFirst.open()
      _ = waitUntil(timeout: .seconds(10), "every command") { log.snapshot.filter { $0.hasPrefix("end") }.count == 3 }
      try Self.settle(loopA)
      try Self.settle(loopB)
      return duringFirst
    }
    guard let observed else { return }
    #expect(observed == ["start1@ar3-move-a"], "nothing else may start while command 1's handler runs")
    let ends = log.snapshot.filter { $0.hasPrefix("end") }
    #expect(ends == ["end1", "end2", "end3"], "log: \(log.snapshot)")
    command.source.invalidate()
  }
}
