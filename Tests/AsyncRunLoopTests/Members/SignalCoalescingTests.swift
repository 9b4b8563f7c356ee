import Glibc
import Testing

@testable import AsyncRunLoop

/// Signals coalesce into one perform and follow their source.
@Suite("Signals coalesce into one perform and follow their source", .serialized, .timeLimit(.minutes(10)))
struct SignalCoalescingTests: SharedTestLoops {
  /// One signal, while the source waits in B on a loop held in a block: another thread moves the
  /// source to a second loop (running its default mode) and, in some rounds, straight back to B
  /// on the first. Once both loops have run its modes, the source fired exactly once (on one of
  /// them).
  @Test func oneSignalFiresOnceAcrossAMoveBetweenLoops() async throws {
    let first = try RunLoopThread(name: "one")
    let second = try RunLoopThread(name: "two")
    defer {
      first.shutdown()
      second.shutdown()
    }
    let keepB = LoopTimer(after: .seconds(3600)) { _ in }
    first.add(keepB, to: orderModeB)
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "move between loops") { () -> [String] in
      var problems: [String] = []
      repeatRounds(200, budget: .milliseconds(1000)) { round in
        let fires = Guarded<[String]>([])
        let source = InputSource { _ in fires.withLock { $0.append(RunLoopThread.currentIfExists?.name ?? "?") } }
        first.add(source, to: orderModeB)
        let release = round % 3 == 0 ? nil : blockLoop(first)
        source.signal()
        if round % 3 == 0 { _ = try? first.performAndWait {} }  // sorted out in default: waits for B
        for _ in 0..<(round % 7) { sched_yield() }
        first.remove(source, from: orderModeB)
        second.add(source, to: .default)
        let back = round % 2 == 0
        if back {
          for _ in 0..<(round % 5) { sched_yield() }
          second.remove(source, from: .default)
          first.add(source, to: orderModeB)
        }
        release?.open()
        let fired = waitUntil(timeout: .seconds(5), "the one fire") {
          _ = try? first.performAndWait { first.run(mode: orderModeB, until: .now) }
          return !fires.snapshot.isEmpty
        }
        for _ in 0..<3 {
          _ = try? first.performAndWait { first.run(mode: orderModeB, until: .now) }
          _ = try? second.performAndWait {}
        }
        if !fired || fires.snapshot.count != 1 {
          problems.append("round \(round) (back \(back)): fired \(fires.snapshot)")
        }
        source.invalidate()
      }
      return problems
    }
    keepB.invalidate()
    #expect(outcome == [])
  }

  /// Four threads signal a signal sequence while a fifth invalidates it: the elements' counts add
  /// up to exactly the number of signals that were accepted ("the consumer receives them as one
  /// element, the number of signals it stands for"; "signals already made are still delivered").
  @Test func coalescedSignalsRacingInvalidationAddUpExactly() async throws {
    for round in 0..<6 {
      let loop = try RunLoopThread(name: "signals")
      let sequence = loop.signalSequence()
      let consumer = Task { () -> Int in
        var total = 0
        for await count in sequence { total += count }
        return total
      }
      let accepted = AtomicCounter()
      let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "round \(round)") { () -> Int in
        let producers: [@Sendable () -> Void] = (0..<4).map { _ in
          {
            for _ in 0..<2_000 where sequence.signal() { accepted.increment() }
          }
        }
        race(
          producers + [
            {
              for _ in 0..<(round * 300) { sched_yield() }
              sequence.invalidate()
            }
          ])
        return accepted.current
      }
      let total = try await withWatchdog(timeout: .seconds(20), "the consumer of round \(round)") {
        await consumer.value
      }
      #expect(total == outcome, "round \(round): delivered \(total ?? -1) for \(outcome ?? -1) accepted signals")
      await execShutdown(loop)
    }
  }

  /// Promise (InputSource.signal): many signals before the loop gets to the source coalesce into
  /// one `perform`; signals that arrive while the source is on no loop are kept and fire once it
  /// joins one (a valid source keeps its signal for the loop it joins next). Signals race from
  /// three threads while the loop is blocked; then the source moves to another loop.
  @Test func signalsCoalesceIntoOnePerformAndSurviveAMove() async throws {
    let failures = try await failuresOverRounds(150, budget: .seconds(3), "coalescing signals") { round, failures in
      let loopA = Self.sharedLoop
      let loopB = Self.secondLoop
      let performs = Guarded<[String]>([])
      let source = InputSource { _ in performs.withLock { $0.append(RunLoopThread.current.name) } }
      defer { source.invalidate() }
      loopA.add(source, to: .common)
      loopA.add(source, to: RunLoopMode("sig"))
      _ = try? loopA.performAndWait {}
      let release = blockLoop(loopA)
      race((0..<3).map { _ in { for _ in 0..<30 { source.signal() } } })
      release.open()
      // Blocks run before sources in a pass (and a block sent meanwhile may run in the same
      // work point), so a round trip alone does not prove the pass reached the sources.
      waitUntil(timeout: .seconds(10), "the fire on A") { !performs.snapshot.isEmpty }
      _ = try? loopA.performAndWait {}
      _ = try? loopA.performAndWait {}
      if performs.snapshot != [loopA.name] { failures.append("round \(round): first batch \(performs.snapshot)") }
      // Signalled while on no loop, then added to B.
      loopA.remove(source, from: .common)
      loopA.remove(source, from: RunLoopMode("sig"))
      race((0..<3).map { _ in { for _ in 0..<10 { source.signal() } } })
      loopB.add(source, to: .common)
      waitUntil(timeout: .seconds(10), "the fire on B") { performs.snapshot.count >= 2 }
      _ = try? loopA.performAndWait {}
      _ = try? loopB.performAndWait {}
      if performs.snapshot != [loopA.name, loopB.name] {
        failures.append("round \(round): after the move \(performs.snapshot)")
      }
      loopB.remove(source, from: .common)
    }
    #expect(failures == [])
  }
}
