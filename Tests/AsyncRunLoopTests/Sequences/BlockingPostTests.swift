import Glibc
import Testing

@testable import AsyncRunLoop

/// `SourceSequence.post(_:timeout:)`: a plain thread blocks while a `.bounded` buffer is full, and
/// is released by the consumer making room, by its timeout, by `invalidate()` or by the loop's
/// shutdown; it is refused on the loop thread and in a task instead of blocking.
@Suite(.timeLimit(.minutes(5))) struct BlockingPostTests {
  /// Starts a raw thread that posts `value` with `timeout`; the returned gate opens once it
  /// returned, with its answer in `result`.
  private func blockedPoster(
    _ sequence: SourceSequence<Int>, _ value: Int, timeout: Duration, result: Guarded<String?>
  ) -> TestGate {
    let done = TestGate()
    startThread(detached: true) {
      let answer: String
      do {
        let result = try sequence.post(value, timeout: timeout)
        answer = "\(result)"
      } catch {
        answer = "refused: \(error)"
      }
      result.withLock { $0 = answer }
      done.open()
    }
    return done
  }

  @Test func aPlainThreadPostingIntoASmallBufferLosesNothing() async throws {
    let loop = try RunLoopThread(name: "bpost-count")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(4))
    let count = 2_000
    let results = Guarded([SourcePostResult]())
    let posterDone = TestGate()
    let received = try await withWatchdog(timeout: .seconds(60), "the blocking producer and its consumer") {
      let consumer = Task { () -> [Int] in
        var got: [Int] = []
        for await value in sequence {
          got.append(value)
          if got.count == count { break }
        }
        return got
      }
      startThread(detached: true) {
        for value in 0..<count {
          let result = (try? sequence.post(value, timeout: .seconds(3_600))) ?? .terminated
          results.withLock { $0.append(result) }
        }
        posterDone.open()
      }
      return await consumer.value
    }
    #expect(received == Array(0..<count))
    // The consumer can take the last element before its poster has recorded `post`'s answer.
    #expect(posterDone.wait(timeout: .seconds(30 * watchdogScale)))
    let answers = results.withLock { $0 }
    #expect(answers.count == count)
    #expect(answers.allSatisfy { $0 == .enqueued })
  }

  @Test func theConsumerMakingRoomReleasesABlockedPoster() async throws {
    let loop = try RunLoopThread(name: "bpost-room")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(1))
    #expect(sequence.post(0) == .enqueued)
    let result = Guarded<String?>(nil)
    let done = blockedPoster(sequence, 1, timeout: .seconds(3_600), result: result)
    waitUntil("the poster blocked") { sequence.waitingProducerCount == 1 }
    #expect(!done.opened)
    let received = try await withWatchdog(timeout: .seconds(30), "the consumer") { () -> [Int] in
      var got: [Int] = []
      for await value in sequence {
        got.append(value)
        if got.count == 2 { break }
      }
      return got
    }
    #expect(received == [0, 1])
    #expect(done.wait(timeout: .seconds(30 * watchdogScale)))
    #expect(result.withLock { $0 } == "enqueued")
  }

  @Test func aBlockedPosterGivesUpAtItsTimeoutWithoutTheElementTaken() throws {
    let loop = try RunLoopThread(name: "bpost-timeout")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(1))
    #expect(sequence.post(0) == .enqueued)
    let result = Guarded<String?>(nil)
    let done = blockedPoster(sequence, 1, timeout: .milliseconds(50), result: result)
    #expect(done.wait(timeout: .seconds(30 * watchdogScale)))
    #expect(result.withLock { $0 } == "full")
    #expect(sequence.waitingProducerCount == 0)
    #expect(sequence.bufferedCount == 1)
    let immediate = Guarded<String?>(nil)
    #expect(blockedPoster(sequence, 2, timeout: .zero, result: immediate).wait(timeout: .seconds(30 * watchdogScale)))
    #expect(immediate.withLock { $0 } == "full")
    #expect(sequence.bufferedCount == 1)
    sequence.invalidate()
  }

  @Test func invalidateReleasesABlockedPosterAndStillDeliversWhatWasTaken() async throws {
    let loop = try RunLoopThread(name: "bpost-inval")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(1))
    #expect(sequence.post(0) == .enqueued)
    let result = Guarded<String?>(nil)
    let done = blockedPoster(sequence, 1, timeout: .seconds(3_600), result: result)
    waitUntil("the poster blocked") { sequence.waitingProducerCount == 1 }
    sequence.invalidate()
    #expect(done.wait(timeout: .seconds(30 * watchdogScale)))
    #expect(result.withLock { $0 } == "terminated")
    let received = try await withWatchdog(timeout: .seconds(30), "the consumer") { () -> [Int] in
      var got: [Int] = []
      for await value in sequence { got.append(value) }
      return got
    }
    #expect(received == [0])
  }

  @Test func theLoopsShutdownReleasesABlockedPoster() throws {
    let loop = try RunLoopThread(name: "bpost-shutdown")
    let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(1))
    #expect(sequence.post(0) == .enqueued)
    let result = Guarded<String?>(nil)
    let done = blockedPoster(sequence, 1, timeout: .seconds(3_600), result: result)
    waitUntil("the poster blocked") { sequence.waitingProducerCount == 1 }
    loop.shutdown()
    #expect(done.wait(timeout: .seconds(30 * watchdogScale)))
    #expect(result.withLock { $0 } == "terminated")
    loop.shutdownAndWait()
    #expect(sequence.post(2) == .terminated)
  }

  @Test func onTheLoopThreadItIsRefusedInsteadOfBlocking() throws {
    let loop = try RunLoopThread(name: "bpost-onloop")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: Int.self, buffering: .bounded(1))
    #expect(sequence.post(0) == .enqueued)
    let answer = try loop.performAndWait { () -> String in
      do {
        let result = try sequence.post(1, timeout: .seconds(3_600))
        return "\(result)"
      } catch {
        if case .wouldDeadlock? = error as? RunLoopError { return "refused" }
        return "\(error)"
      }
    }
    #expect(answer == "refused")
    #expect(sequence.bufferedCount == 1)
    #expect(sequence.waitingProducerCount == 0)
  }

  @Test func inATaskItIsRefusedInsteadOfBlocking() async throws {
    let loop = try RunLoopThread(name: "bpost-task")
    defer { loop.shutdownAndWait() }
    let sequence = loop.sourceSequence(of: Int.self, buffering: .unbounded)
    #expect(throws: RunLoopError.self) { _ = try sequence.post(1, timeout: .seconds(1)) }
    #expect(sequence.bufferedCount == 0)
  }
}
