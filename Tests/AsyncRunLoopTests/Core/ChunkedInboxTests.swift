import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("The chunked inbox keeps order across chunks", .serialized, .timeLimit(.minutes(10)))
struct ChunkedInboxTests {
  /// Two threads each add 3,000 observers (far more than a chunk, and than a bounded pass
  /// applies) with a performed block after each add that counts the loop's records. Promised: "a
  /// block waits for the changes that arrived before it", so each block sees at least as many
  /// records as its thread had added; every block runs once, in each thread's order.
  @Test func blocksWaitForTheChangesSentBeforeThemAcrossChunkBoundaries() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "chunked barrier") {
      () throws -> (short: [String], order: [String], ran: Int) in
      let loop = try RunLoopThread(name: "chunk")
      defer { loop.shutdownAndWait() }
      let perThread = 2_000
      let short = Guarded<[String]>([])
      let seen = Guarded<[Int: [Int]]>([:])
      let ran = AtomicCounter()
      let release = blockLoop(loop)  // the first burst queues behind a busy loop
      let bodies: [@Sendable () -> Void] = (0..<2).map { thread in
        {
          for index in 0..<perThread {
            loop.add(LoopObserver(activities: .exit) { _, _ in }, to: inboxModeA)
            loop.perform {
              ran.increment()
              let records = loop.core.modeTable.recordCount
              seen.withLock { $0[thread, default: []].append(index) }
              if records < index + 1 {
                short.withLock { $0.append("thread \(thread) block \(index) saw \(records) records") }
              }
            }
            if index == 500 && thread == 0 { release.open() }
          }
        }
      }
      race(bodies)
      release.open()
      _ = try loop.performAndWait {}
      let order = seen.snapshot.compactMap { thread, indices in
        indices == Array(0..<perThread) ? nil : "thread \(thread): \(indices.count) blocks, out of order"
      }
      return (Array(short.snapshot.prefix(5)), order, ran.current)
    }
    guard let outcome else { return }
    #expect(outcome.short == [])
    #expect(outcome.order == [])
    #expect(outcome.ran == 4_000)
  }

  /// A burst of adds of custom sources (with schedule and cancel routines) and blocks from two
  /// threads races `shutdown()`. Promised: every block `perform` accepted runs exactly once;
  /// every source is scheduled and cancelled in pairs and ends invalidated (the drain detaches
  /// every member; an add refused by a terminated loop invalidates it).
  @Test func aBurstOfChangesAndBlocksRacingShutdownIsDrainedExactly() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "burst vs shutdown") {
      () throws -> [String] in
      var wrong: [String] = []
      repeatRounds(6, budget: .milliseconds(2000)) { round in
        guard let loop = try? RunLoopThread(name: "burst") else { return }
        let pairs = PairLog()
        let accepted = AtomicCounter()
        let ran = Guarded<[Int: Int]>([:])
        let sources = Guarded<[InputSource]>([])
        let bodies: [@Sendable () -> Void] = (0..<2).map { thread in
          {
            for index in 0..<2_500 {
              let source = InputSource(
                schedule: { _, loop, _ in pairs.schedule(loop) }, cancel: { _, loop in pairs.cancel(loop) },
                perform: { _ in })
              sources.withLock { $0.append(source) }
              loop.add(source, to: index % 2 == 0 ? .default : inboxModeA)
              let key = thread * 10_000 + index
              if loop.perform(inModes: [inboxModeB], { ran.withLock { $0[key, default: 0] += 1 } }) {
                accepted.increment()
              }
            }
          }
        }
        let shutter: @Sendable () -> Void = {
          usleep(UInt32(200 + round * 300))
          loop.shutdown()
        }
        race(bodies + [shutter])
        loop.shutdownAndWait()
        let counts = ran.snapshot
        if counts.count != accepted.current || counts.values.contains(where: { $0 != 1 }) {
          wrong.append(
            "round \(round): \(accepted.current) accepted, \(counts.count) ran, some twice: \(counts.values.contains { $0 > 1 })"
          )
        }
        if !pairs.unpaired.isEmpty { wrong.append("round \(round): \(pairs.unpaired)") }
        let valid = sources.snapshot.filter(\.isValid).count
        if valid != 0 { wrong.append("round \(round): \(valid) sources still valid") }
      }
      return wrong
    }
    #expect(outcome == [])
  }
}
