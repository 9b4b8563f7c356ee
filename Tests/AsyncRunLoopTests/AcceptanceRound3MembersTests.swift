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

  /// A moving source, stressed: one thread moves a CommandSource between two loops (removing it
  /// from its last mode first, as the docs require) while another posts. Every accepted command
  /// is delivered exactly once, in posting order, and the handler never runs on two threads at
  /// once; each loop calls cancel once per schedule.
  @Test func aCommandSourceMovedBackAndForthWhilePostedToDeliversEachCommandOnce() async throws {
    let loops = [try RunLoopThread(name: "ar3-pp-a"), try RunLoopThread(name: "ar3-pp-b")]
    defer { for loop in loops { loop.shutdownAndWait() } }
    let delivered = Guarded<[Int]>([])
    let inHandler = AtomicCounter()
    let overlaps = AtomicCounter()
    let schedules = Guarded<[String: Int]>([:])
    let cancels = Guarded<[String: Int]>([:])
    let command = CommandSource<Int>(
      schedule: { _, loop, _ in schedules.withLock { $0[loop.name, default: 0] += 1 } },
      cancel: { _, loop in cancels.withLock { $0[loop.name, default: 0] += 1 } }
    ) { value in
      if inHandler.increment() != 1 { overlaps.increment() }
      delivered.withLock { $0.append(value) }
      for _ in 0..<50 { sched_yield() }  // widen the window in which the source moves
      inHandler.value.subtract(1, ordering: .sequentiallyConsistent)
    }
    loops[0].add(command.source)
    let accepted = try await withWatchdogOnThread(timeout: .seconds(30), "move and post") { () -> Int in
      let posted = Guarded(0)
      race([
        {
          for round in 0..<200 {
            loops[round % 2].remove(command.source)
            loops[(round + 1) % 2].add(command.source)
            if round % 16 == 0 { usleep(200) }
          }
        },
        {
          for value in 0..<2_000 where command.post(value) { posted.withLock { $0 += 1 } }
        },
      ])
      command.source.invalidate()
      for loop in loops { try Self.settle(loop) }
      return posted.snapshot
    }
    guard let accepted else { return }
    #expect(accepted == 2_000)
    #expect(delivered.snapshot == Array(0..<2_000), "count \(delivered.snapshot.count)")
    #expect(overlaps.current == 0)
    #expect(schedules.snapshot == cancels.snapshot, "schedules \(schedules.snapshot), cancels \(cancels.snapshot)")
  }

  /// CommandSource: "every command that post accepted is delivered exactly once", also when the
  /// invalidation races the posts, and all of them before `cancel`.
  @Test func postsRacingInvalidateAreDeliveredExactlyOnceBeforeCancel() async throws {
    let loop = try RunLoopThread(name: "ar3-post-inv")
    defer { loop.shutdownAndWait() }
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "posts vs invalidate") {
      () -> [(accepted: Int, delivered: Int, afterCancel: Int, cancels: Int)] in
      var results: [(Int, Int, Int, Int)] = []
      repeatRounds(40, budget: .milliseconds(600)) { _ in
        let delivered = Guarded(0)
        let cancelled = Guarded(0)
        let afterCancel = Guarded(0)
        let command = CommandSource<Int>(cancel: { _, _ in cancelled.withLock { $0 += 1 } }) { _ in
          delivered.withLock { $0 += 1 }
          if cancelled.snapshot > 0 { afterCancel.withLock { $0 += 1 } }
        }
        loop.add(command.source)
        let accepted = Guarded(0)
        let producer: @Sendable () -> Void = {
          for value in 0..<300 where command.post(value) { accepted.withLock { $0 += 1 } }
        }
        race([
          producer, producer,
          {
            usleep(50); command.source.invalidate()
          },
        ])
        _ = waitUntil(timeout: .seconds(10), "cancel") { cancelled.snapshot == 1 }
        results.append((accepted.snapshot, delivered.snapshot, afterCancel.snapshot, cancelled.snapshot))
      }
      return results
    }
    for result in outcome ?? [] {
      #expect(result.delivered == result.accepted)
      #expect(result.afterCancel == 0)
      #expect(result.cancels == 1)
    }
  }

  /// The same, with the loop's shutdown (or the drop of its last reference) racing the posts.
  @Test(arguments: [false, true])
  func postsRacingTheEndOfTheLoopAreDeliveredExactlyOnce(dropInsteadOfShutdown: Bool) async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "posts vs end of loop") {
      () -> [(accepted: Int, delivered: Int, cancels: Int, freed: Bool)] in
      var results: [(Int, Int, Int, Bool)] = []
      try repeatRounds(20, budget: .milliseconds(600)) { _ in
        let delivered = Guarded(0)
        let cancelled = Guarded(0)
        let weak = ExecWeakLoop()
        let command = CommandSource<Int>(cancel: { _, _ in cancelled.withLock { $0 += 1 } }) { _ in
          delivered.withLock { $0 += 1 }
        }
        let accepted = Guarded(0)
        let producer: @Sendable () -> Void = {
          for value in 0..<300 where command.post(value) { accepted.withLock { $0 += 1 } }
        }
        try Self.endLoopWhilePosting(
          weak: weak, command: command, drop: dropInsteadOfShutdown, producers: [producer, producer])
        _ = waitUntil(timeout: .seconds(10), "cancel") { cancelled.snapshot == 1 }
        _ = waitUntil(timeout: .seconds(10), "loop freed") { weak.isGone }
        results.append((accepted.snapshot, delivered.snapshot, cancelled.snapshot, weak.isGone))
      }
      return results
    }
    for result in outcome ?? [] {
      #expect(result.delivered == result.accepted)
      #expect(result.cancels == 1)
      #expect(result.freed)
    }
  }

  private static func endLoopWhilePosting(
    weak: ExecWeakLoop, command: CommandSource<Int>, drop: Bool, producers: [@Sendable () -> Void]
  ) throws {
    let holder = Guarded<RunLoopThread?>(try RunLoopThread(name: "ar3-end"))
    guard let loop = holder.snapshot else { return }
    weak.set(loop)
    loop.add(command.source, to: .common)
    _ = try loop.performAndWait { 0 }
    let ender: @Sendable () -> Void = {
      usleep(50)
      if drop {
        holder.withLock { $0 = nil }  // the last reference: the loop shuts itself down
      } else {
        holder.snapshot?.shutdown()
        holder.withLock { $0 = nil }
      }
    }
    race(producers + [ender])
  }
}
