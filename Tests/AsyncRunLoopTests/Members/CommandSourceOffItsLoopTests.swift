import Dispatch
import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("Command sources off their loop, dropped sequences", .serialized, .timeLimit(.minutes(10)))
struct CommandSourceOffItsLoopTests {
  /// Promised (`CommandSource`): commands posted while the source is on no loop wait for its next
  /// add and come before later ones; invalidated while on no loop, the loop that lets go of it
  /// last delivers them. Each once, in order.
  @Test func commandsPostedOffLoopAreDeliveredByTheNextOrTheLastLoop() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "off-loop commands") {
      () async throws -> (seen: [Int], threads: [String]) in
      let loops = [try RunLoopThread(name: "off-a"), try RunLoopThread(name: "off-b")]
      let seen = Guarded<[Int]>([])
      let threads = Guarded<[String]>([])
      let commands = CommandSource<Int> { value in
        seen.withLock { $0.append(value) }
        let name = loops.first(where: { $0.isOnLoopThread })?.name ?? "elsewhere"
        threads.withLock { if $0.last != name { $0.append(name) } }
      }
      loops[0].add(commands.source, to: .common)
      for value in 0..<5 { commands.post(value) }
      loops[0].remove(commands.source, from: .common)
      for value in 5..<10 { commands.post(value) }
      loops[1].add(commands.source, to: .common)
      for value in 10..<15 { commands.post(value) }
      #expect(await pollEveryMillisecond { seen.snapshot.count == 15 })
      loops[1].remove(commands.source, from: .common)
      for value in 15..<20 { commands.post(value) }
      commands.source.invalidate()
      #expect(await pollEveryMillisecond { seen.snapshot.count == 20 })
      for loop in loops { await execShutdown(loop) }
      return (seen.snapshot, threads.snapshot)
    }
    #expect(outcome?.seen == Array(0..<20))
    #expect(outcome?.threads.allSatisfy { $0 != "elsewhere" } == true)
    // Which loop delivers the last five depends on timing: B, or A when A's thread applies its
    // removal after B's (seen once under CI's 3x load). Both are what `CommandSource` promises; the
    // loop that lets go last delivers (`CommandSourceTests` holds A's thread to check that case).
    #expect(outcome.map { ["off-a", "off-b"].contains($0.threads.last) } == true)
  }

  /// Promised: dropping a sequence (and its iterator) invalidates its source: `onCancel` runs
  /// once, for a sequence never iterated and for one whose iterator was dropped.
  @Test func droppingASequenceRunsOnCancelOnce() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "dropped sequences") { () async throws -> [Int] in
      let loop = try RunLoopThread(name: "dropped")
      let cancels = [AtomicCounter(), AtomicCounter(), AtomicCounter()]
      do {
        let never = loop.sourceSequence(of: Int.self, onCancel: { _ in cancels[0].increment() })
        _ = never.post(1)
        let signals = loop.signalSequence(onCancel: { _ in cancels[1].increment() })
        signals.signal()
        let iterated = loop.sourceSequence(of: Int.self, onCancel: { _ in cancels[2].increment() })
        _ = iterated.post(1)
        _ = iterated.post(2)
        var iterator = iterated.makeAsyncIterator()
        _ = await iterator.next()
      }
      #expect(await pollEveryMillisecond { cancels.allSatisfy { $0.current >= 1 } })
      _ = try? loop.performAndWait { 0 }
      await execShutdown(loop)
      return cancels.map(\.current)
    }
    #expect(outcome == [1, 1, 1])
  }
}
