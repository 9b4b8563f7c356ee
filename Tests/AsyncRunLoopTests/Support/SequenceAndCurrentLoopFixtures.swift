import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

// MARK: - Helpers

/// A class instance whose release a weak reference observes.
final class WeaklyObservedObject: Sendable {}

/// A weak reference to an `WeaklyObservedObject`, shared with closures.
final class WeakObservedObjectReference: @unchecked Sendable {
  // Safety: written once by the test before the object is shared, read by polls afterwards;
  // the runtime zeroes weak references atomically.
  weak var object: WeaklyObservedObject?
}

/// A weak reference to a loop.
final class WeakLoopReference: @unchecked Sendable {
  // Safety: as `WeakObservedObjectReference`.
  weak var loop: RunLoopThread?
}

/// Counts the elements of a sequence until it ends.
func countElements<S: AsyncSequence & Sendable>(_ sequence: S) async -> Int {
  var count = 0
  var iterator = sequence.makeAsyncIterator()
  while (try? await iterator.next()) != nil { count += 1 }
  return count
}

/// Consumes a source sequence of its own loop and runs the loop nested inside its loop body.
actor NestingConsumerActor: LoopActor {
  nonisolated let loop: RunLoopThread
  init(loop: RunLoopThread) { self.loop = loop }

  func consume(_ sequence: SourceSequence<Int>) async -> (values: [Int], nested: RunLoopRunResult?, isolated: Bool) {
    var values: [Int] = []
    var nested: RunLoopRunResult?
    var isolated = true
    for await value in sequence {
      if !loop.isOnLoopThread { isolated = false }
      values.append(value)
      if value == 0 {
        _ = sequence.post(1)
        _ = sequence.post(2)
        nested = loop.run(mode: .default, until: .now.advanced(by: .seconds(10)), returnAfterSourceHandled: true)
        _ = sequence.post(3)
      }
      if value == 3 { break }
    }
    return (values, nested, isolated)
  }
}

/// Sends into a sequence of its own loop.
/// The hand-over's state for a stall report: what the consumer got, what the machine holds.
func handOverState(_ sequence: SourceSequence<Int>, received: AtomicCounter) -> String {
  let machine = sequence.lock.withLock { sequence.machine }
  return "received \(received.current), posted \(machine.posted.count), released \(machine.released.count), "
    + "waiting producers \(machine.waitingProducers.count), consumer \(machine.lifecycle.state), "
    + "source signalled \(sequence.source.isSignalled), valid \(sequence.source.isValid)"
}

actor SendingProducerActor: LoopActor {
  nonisolated let loop: RunLoopThread
  init(loop: RunLoopThread) { self.loop = loop }

  func send(_ count: Int, into sequence: SourceSequence<Int>) async -> Int {
    var enqueued = 0
    for value in 0..<count where await sequence.send(value) == .enqueued { enqueued += 1 }
    return enqueued
  }
}

/// Helpers shared by the suites that conform (they call them as `Self.name` or by name).
protocol SequenceTestModes {}

extension SequenceTestModes {
  var modeA: RunLoopMode { RunLoopMode("a") }

  var modeB: RunLoopMode { RunLoopMode("b") }
}
