import Dispatch
import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("Ending from inside the loop, moving sources", .serialized, .timeLimit(.minutes(10)))
struct EndingFromInsideTheLoopTests {
  /// Promised: `invalidate()` delivers what was accepted, also when the consumer itself calls it
  /// on the loop thread mid-stream; a post after it answers `.terminated`.
  @Test func consumerOnTheLoopInvalidatingMidStreamStillGetsEverything() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "self-invalidate") {
      () async throws -> (seen: [Int], late: SourcePostResult?) in
      let loop = try RunLoopThread(name: "self-end")
      let sequence = loop.sourceSequence(of: Int.self)
      let release = blockLoop(loop)
      for value in 0..<50 { _ = sequence.post(value) }
      release.open()
      let result = await SelfInvalidatingConsumerActor(loop: loop).consume(sequence, invalidatingAfter: 10)
      await execShutdown(loop)
      return result
    }
    #expect(outcome?.seen == Array(0..<50))
    #expect(outcome?.late == .terminated)
  }

  /// Promised (`CommandSource`): a handler that invalidates its own source mid-batch: every
  /// command accepted before is still handled, once, in order; posts after it return false.
  @Test func commandHandlerInvalidatingItsSourceMidBatchLosesNothing() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "handler invalidates") {
      () async throws -> (seen: [Int], latePosts: [Bool], cancels: Int) in
      let loop = try RunLoopThread(name: "cmd-self")
      let seen = Guarded<[Int]>([])
      let late = Guarded<[Bool]>([])
      let cancels = AtomicCounter()
      let box = Guarded<CommandSource<Int>?>(nil)
      let commands = CommandSource<Int>(cancel: { _, _ in cancels.increment() }) { value in
        seen.withLock { $0.append(value) }
        if value == 10, let me = box.snapshot {
          me.source.invalidate()
          let accepted = me.post(-1)
          late.withLock { $0.append(accepted) }
        }
      }
      box.withLock { $0 = commands }
      let release = blockLoop(loop)
      loop.add(commands.source, to: .common)
      for value in 0..<50 { commands.post(value) }
      release.open()
      #expect(await pollEveryMillisecond { cancels.current == 1 })
      await execShutdown(loop)
      box.withLock { $0 = nil }
      return (seen.snapshot, late.snapshot, cancels.current)
    }
    #expect(outcome?.seen == Array(0..<50))
    #expect(outcome?.latePosts == [false])
    #expect(outcome?.cancels == 1)
  }

  /// `onSchedule` may post to its own sequence (on the loop thread, while the loop adds it): the
  /// element is delivered.
  @Test func onSchedulePostingToItsOwnSequenceIsDelivered() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "post from onSchedule") { () async throws -> [Int] in
      let loop = try RunLoopThread(name: "sched-post")
      let box = Guarded<SourceSequence<Int>?>(nil)
      let release = blockLoop(loop)
      let sequence = loop.sourceSequence(of: Int.self, onSchedule: { _, _ in _ = box.snapshot?.post(1) })
      box.withLock { $0 = sequence }
      release.open()
      var iterator = sequence.makeAsyncIterator()
      let first = await iterator.next()
      box.withLock { $0 = nil }
      sequence.invalidate()
      var rest: [Int] = []
      while let value = await iterator.next() { rest.append(value) }
      await execShutdown(loop)
      return [first ?? -1] + rest
    }
    #expect(outcome == [1])
  }

  /// Promised (`CommandSource`): a source moved between loops (removed from its last mode on one,
  /// added to another, from another thread) while threads post keeps every accepted command:
  /// each is handled once, in posting order per thread, on the loop the source was on.
  @Test func commandSourceMovedBetweenLoopsWhilePostingLosesNothing() async throws {
    let producers = 3
    let perProducer = 1500
    let outcome = try await withWatchdog(timeout: .seconds(20), "moving command source") {
      () async throws -> (seen: [Int: [Int]], accepted: [Int: [Int]], offLoop: Int) in
      let loops = [try RunLoopThread(name: "move-a"), try RunLoopThread(name: "move-b")]
      let seen = Guarded<[Int: [Int]]>([:])
      let offLoop = AtomicCounter()
      let commands = CommandSource<ProducedItem> { item in
        if !loops.contains(where: { $0.isOnLoopThread }) { offLoop.increment() }
        seen.withLock { $0[item.producer, default: []].append(item.index) }
      }
      loops[0].add(commands.source, to: .common)
      let done = AtomicCounter()
      let accepted = Guarded<[Int: [Int]]>([:])
      await execOnNewThread {
        var bodies: [@Sendable () -> Void] = (0..<producers).map { producer in
          {
            var mine: [Int] = []
            for index in 0..<perProducer where commands.post(ProducedItem(producer: producer, index: index)) {
              mine.append(index)
            }
            accepted.withLock { $0[producer] = mine }
            done.increment()
          }
        }
        bodies.append {
          var on = 0
          while done.current < producers {
            loops[on].remove(commands.source, from: .common)
            on = 1 - on
            loops[on].add(commands.source, to: .common)
            sched_yield()
          }
        }
        race(bodies)
      }
      commands.source.invalidate()
      for loop in loops { await execShutdown(loop) }
      return (seen.snapshot, accepted.snapshot, offLoop.current)
    }
    guard let outcome else { return }
    for producer in 0..<producers {
      #expect((outcome.seen[producer] ?? []) == (outcome.accepted[producer] ?? []), "producer \(producer)")
    }
    #expect(outcome.offLoop == 0)
  }
}
