import Dispatch
import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("Invalidation racing a fresh add", .serialized, .timeLimit(.minutes(10)))
struct InvalidationRacingAFreshAddTests {
  /// Promised (`CommandSource`): an invalidation racing posts right after an `add` (the add may
  /// still be on its way to the loop) still delivers every accepted command once, in order, and
  /// `cancel` runs once after `schedule`.
  @Test func invalidateRacingPostsRightAfterAddLosesNothing() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "fresh add race") { () async throws -> [String] in
      var problems: [String] = []
      let loop = try RunLoopThread(name: "fresh")
      for round in 0..<60 {
        let seen = Guarded<[Int: [Int]]>([:])
        let pairs = PairLog()
        let commands = CommandSource<ProducedItem>(
          schedule: { _, loop, _ in pairs.schedule(loop) }, cancel: { _, loop in pairs.cancel(loop) }
        ) { item in seen.withLock { $0[item.producer, default: []].append(item.index) } }
        let release = round % 2 == 0 ? blockLoop(loop) : nil
        loop.add(commands.source, to: .common)
        let accepted = Guarded<[Int: [Int]]>([:])
        await execOnNewThread {
          var bodies: [@Sendable () -> Void] = (0..<2).map { producer in
            {
              var mine: [Int] = []
              for index in 0..<200 where commands.post(ProducedItem(producer: producer, index: index)) {
                mine.append(index)
              }
              accepted.withLock { $0[producer] = mine }
            }
          }
          bodies.append { commands.source.invalidate() }
          race(bodies)
        }
        release?.open()
        _ = await pollEveryMillisecond(timeout: .seconds(5)) {
          pairs.counts.snapshot.values.contains { $0.cancel == 1 }
        }
        _ = try? loop.performAndWait { 0 }
        if seen.snapshot != accepted.snapshot.filter({ !$0.value.isEmpty }) {
          let counts = (seen.snapshot.mapValues(\.count), accepted.snapshot.mapValues(\.count))
          problems.append("round \(round): seen \(counts.0) accepted \(counts.1)")
        }
        problems += pairs.unpaired.map { "round \(round): \($0)" }
      }
      await execShutdown(loop)
      return problems
    }
    #expect(outcome == [])
  }
}
