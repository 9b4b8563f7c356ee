import Dispatch
import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("A sequence has one consumer", .serialized, .timeLimit(.minutes(10)))
struct OneConsumerTests {
  /// Promised: a second `makeAsyncIterator()` traps with a message saying a sequence has a single
  /// consumer, also after the first iterator was dropped.
  @Test func aSecondIteratorTrapsWithTheSingleConsumerMessage() async throws {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let loop = try RunLoopThread(name: "second-iterator")
      let sequence = loop.timer(every: .seconds(3600))
      do { _ = sequence.makeAsyncIterator() }
      _ = sequence.makeAsyncIterator()
    }
    expectStandardError(of: result, mentions: "single consumer")
  }
}

extension OneConsumerTests {
  /// The documented feedback of an activity consumer on the observed loop (`.all`) keeps the
  /// loop busy but not stuck: the consumer gets its events, can stop, and the loop shuts down.
  @Test func anActivityConsumerOnTheObservedLoopCanStop() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "activity feedback") { () async throws -> (Int, Int) in
      let loop = try RunLoopThread(name: "feedback")
      let activities = loop.activities()
      let consumer = Task(executorPreference: loop) { () -> Int in
        var n = 0
        for await _ in activities {
          n += 1
          if n == 1000 { break }
        }
        return n
      }
      let events = await consumer.value
      let answer = (try? loop.performAndWait { 7 }) ?? 0
      await execShutdown(loop)
      return (events, answer)
    }
    #expect(outcome?.0 == 1000)
    #expect(outcome?.1 == 7)
  }
}
