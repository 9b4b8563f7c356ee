import Dispatch
import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("No wake-up is lost without a flush", .serialized, .timeLimit(.minutes(10)))
struct NoLostWakeUpTests {
  /// Promised: everything posted is released without anything else waking the loop (no
  /// `invalidate()` to flush it): many threads post to a source sequence, a command source and a
  /// signal sequence at once; each consumer eventually sees every accepted element.
  @Test func concurrentProducersAreAllDeliveredWithoutAFlush() async throws {
    let producers = 4
    let perProducer = 2000
    let outcome = try await withWatchdog(timeout: .seconds(20), "no flush") { () async throws -> [String] in
      var problems: [String] = []
      for round in 0..<5 {
        let loop = try RunLoopThread(name: "noflush")
        let sequence = loop.sourceSequence(of: Int.self)
        let signals = loop.signalSequence()
        let handled = AtomicCounter()
        let commands = CommandSource<Int> { _ in handled.increment() }
        loop.add(commands.source, to: .common)
        let received = AtomicCounter()
        let signalled = AtomicCounter()
        let consumer = Task {
          for await _ in sequence { received.increment() }
        }
        let signalConsumer = Task(executorPreference: loop) {
          for await count in signals { signalled.value.add(count, ordering: .sequentiallyConsistent) }
        }
        await execOnNewThread {
          race(
            (0..<producers).map { _ in
              {
                for index in 0..<perProducer {
                  _ = sequence.post(index)
                  commands.post(index)
                  signals.signal()
                  if index % 97 == 0 { sched_yield() }
                }
              }
            })
        }
        let total = producers * perProducer
        let all = await pollEveryMillisecond(timeout: .seconds(5)) {
          received.current == total && handled.current == total && signalled.current == total
        }
        if !all {
          problems.append(
            "round \(round): source \(received.current), command \(handled.current), signal \(signalled.current) of \(total)"
          )
        }
        consumer.cancel()
        signalConsumer.cancel()
        await consumer.value
        await signalConsumer.value
        await execShutdown(loop)
      }
      return problems
    }
    #expect(outcome == [])
  }

  /// One source per descriptor and loop: a second readiness sequence on a descriptor that the loop
  /// already watches (its registration paused by a slow consumer) is refused visibly — a thrown
  /// error, or an `.error` element and the end — and the first keeps working.
  @Test func aSecondReadinessSequenceOnAWatchedDescriptorIsRefusedVisibly() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "second readiness") {
      () async throws -> (refused: Bool, firstStillWorks: Bool) in
      let loop = try RunLoopThread(name: "ready2")
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let first = try loop.readiness(of: pipe.read)
      writeByte(pipe.write)
      // Let the loop see the unread byte a few times: the first one's registration pauses.
      #expect(await pollEveryMillisecond { first.lock.withLock { first.machine.paused } })
      var refused = false
      do {
        let second = try loop.readiness(of: pipe.read)
        var events: [DescriptorEvents] = []
        for await element in second { events.append(element) }
        refused = events.allSatisfy { $0.contains(.error) } && !events.isEmpty
      } catch {
        refused = true
      }
      var iterator = first.makeAsyncIterator()
      let firstElement = await iterator.next()
      drainDescriptor(pipe.read)
      writeByte(pipe.write)
      let secondElement = await iterator.next()
      first.invalidate()
      await execShutdown(loop)
      return (refused, firstElement?.contains(.readable) == true && secondElement?.contains(.readable) == true)
    }
    #expect(outcome?.refused == true)
    #expect(outcome?.firstStillWorks == true)
  }

  /// `onSchedule` runs once however many modes the source sequence is in, also when a mode joins
  /// the common set later; `onCancel` once at the end.
  @Test func onScheduleRunsOncePerLoopNotPerMode() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "onSchedule once") {
      () async throws -> (Int, Int) in
      let loop = try RunLoopThread(name: "sched")
      let schedules = AtomicCounter()
      let cancels = AtomicCounter()
      let sequence = loop.sourceSequence(
        of: Int.self, modes: [.common, endRaceModeA, endRaceModeB], onSchedule: { _, _ in schedules.increment() },
        onCancel: { _ in cancels.increment() })
      loop.addModeToCommonModes("c")
      _ = try loop.performAndWait { 0 }
      sequence.invalidate()
      for await _ in sequence {}
      await execShutdown(loop)
      return (schedules.current, cancels.current)
    }
    #expect(outcome?.0 == 1)
    #expect(outcome?.1 == 1)
  }
}
