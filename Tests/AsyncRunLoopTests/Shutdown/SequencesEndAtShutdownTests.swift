import Testing

@testable import AsyncRunLoop

/// An async sequence's consumer and producers are waits like any other: the loop's shutdown
/// releases them — the consumer after what was accepted, producers waiting for room with
/// `.terminated` — also on a `RunLoopThread.current` loop whose thread is parked outside a run and
/// may never run the loop again.
@Suite(.timeLimit(.minutes(5)))
struct SequencesEndAtShutdownTests {
  @Test func aSourceSequenceOfAParkedCurrentLoopDeliversWhatWasAcceptedThenEndsAtShutdown() async throws {
    let thread = ParkedLoopThread()
    defer { thread.end() }
    let loop = await thread.loop()
    let outcome = try await withWatchdog(timeout: .seconds(20), "source sequence of a parked loop at shutdown") {
      () -> (got: [Int], posts: [SourcePostResult], sent: SourcePostResult) in
      let events = loop.sourceSequence(of: Int.self, buffering: .bounded(2))
      let posts = [events.post(1), events.post(2)]
      let producer = Task { await events.send(3) }  // no room: waits (or finds the sequence ended)
      let consumer = Task { () -> [Int] in
        var got: [Int] = []
        for await element in events { got.append(element) }
        return got
      }
      loop.shutdown()
      return (await consumer.value, posts, await producer.value)
    }
    #expect(outcome?.posts == [.enqueued, .enqueued])
    #expect(outcome?.got == [1, 2])
    #expect(outcome?.sent == .terminated)
  }

  @Test func aSignalSequenceOfAParkedCurrentLoopEndsAtShutdown() async throws {
    let thread = ParkedLoopThread()
    defer { thread.end() }
    let loop = await thread.loop()
    let ended = try await withWatchdog(timeout: .seconds(20), "signal sequence of a parked loop at shutdown") {
      () -> Bool in
      let signals = loop.signalSequence()
      let consumer = Task { () -> Bool in
        for await _ in signals {}
        return true
      }
      loop.shutdown()
      return await consumer.value
    }
    #expect(ended == true)
  }

  @Test func aTimerSequenceOfAParkedCurrentLoopEndsAtShutdown() async throws {
    let thread = ParkedLoopThread()
    defer { thread.end() }
    let loop = await thread.loop()
    let ticks = try await withWatchdog(timeout: .seconds(20), "timer sequence of a parked loop at shutdown") {
      () -> Int in
      let timer = loop.timer(every: .seconds(3600))
      let consumer = Task { () -> Int in
        var count = 0
        for await _ in timer { count += 1 }
        return count
      }
      loop.shutdown()
      return await consumer.value
    }
    #expect(ticks == 0)
  }

  /// A sequence made after its current loop was shut down (and its jobs diverted) ends at once.
  @Test func aSequenceMadeOnAShutDownParkedCurrentLoopEndsAtOnce() async throws {
    let thread = ParkedLoopThread()
    defer { thread.end() }
    let loop = await thread.loop()
    loop.shutdown()
    let got = try await withWatchdog(timeout: .seconds(20), "sequence of a shut-down parked loop") { () -> [Int] in
      let events = loop.sourceSequence(of: Int.self)
      var got: [Int] = []
      for await element in events { got.append(element) }
      return got
    }
    #expect(got == [])
  }
}
