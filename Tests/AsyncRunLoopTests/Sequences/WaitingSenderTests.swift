import Dispatch
import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("Waiting senders, unfired ticks", .serialized, .timeLimit(.minutes(10)))
struct WaitingSenderTests {
  /// Promised (`send`): producers that wait for room are admitted oldest first; a waiting sender
  /// whose task is cancelled answers `.full` and its element is not delivered.
  @Test func waitingSendersAreAdmittedOldestFirstAndCancelledOnesLeave() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "sender order") {
      () async throws -> (seen: [Int], cancelled: SourcePostResult?, others: [SourcePostResult]) in
      let loop = try RunLoopThread(name: "senders")
      let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(1))
      _ = sequence.post(0)
      var senders: [Task<SourcePostResult, Never>] = []
      for value in 1...5 {
        senders.append(Task { await sequence.send(value) })
        #expect(await pollEveryMillisecond { sequence.waitingProducerCount == value })
      }
      senders[2].cancel()  // value 3
      let cancelled = await senders[2].value
      var seen: [Int] = []
      var iterator = sequence.makeAsyncIterator()
      while seen.count < 5, let value = await iterator.next() { seen.append(value) }
      var others: [SourcePostResult] = []
      for (index, sender) in senders.enumerated() where index != 2 { others.append(await sender.value) }
      sequence.invalidate()
      while let value = await iterator.next() { seen.append(value) }
      await execShutdown(loop)
      return (seen, cancelled, others)
    }
    #expect(outcome?.seen == [0, 1, 2, 4, 5])
    #expect(outcome?.cancelled == .full)
    #expect(outcome?.others == Array(repeating: .enqueued, count: 4))
  }

  /// Promised (`TimerSequence`): a tick whose instant passed while the loop was busy, but that
  /// the loop has not fired, is not delivered after `invalidate()`.
  @Test func aTickDueWhileTheLoopIsBusyIsNotDeliveredAfterInvalidate() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "unfired tick") { () async throws -> Int in
      let loop = try RunLoopThread(name: "unfired")
      let release = blockLoop(loop)
      let timer = loop.timer(after: .milliseconds(1))
      usleep(5000)  // the instant passes while the loop is busy
      timer.invalidate()
      release.open()
      var n = 0
      for await _ in timer { n += 1 }
      await execShutdown(loop)
      return n
    }
    #expect(outcome == 0)
  }
}
