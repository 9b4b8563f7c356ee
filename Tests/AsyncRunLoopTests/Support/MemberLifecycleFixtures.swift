import Glibc
import Testing

@testable import AsyncRunLoop

// Helpers for the tests of one member lifecycle under concurrency, at scale, with `.common` modes.
// Every test states the documented promise it attacks and asserts exact counts.

/// An actor pinned to a loop whose method runs the loop nested (from an executor job).
actor ClosureNestingActor: LoopActor {
  nonisolated let loop: RunLoopThread
  let nest: @Sendable () -> Void
  init(loop: RunLoopThread, nest: @escaping @Sendable () -> Void) {
    self.loop = loop
    self.nest = nest
  }
  func nestOnce() { nest() }
}

/// The books of a command source under test: how often each command was delivered.
final class CommandDeliveryLedger: Sendable {
  let delivered = Guarded<[Int: Int]>([:])
  let order = Guarded<[Int]>([])
  let accepted = Guarded<Set<Int>>([])

  func deliver(_ command: Int) {
    delivered.withLock { $0[command, default: 0] += 1 }
    order.withLock { $0.append(command) }
  }

  func accept(_ command: Int) { _ = accepted.withLock { $0.insert(command) } }

  /// What went wrong: duplicates, deliveries of refused commands, accepted commands lost
  /// (beyond `unaccounted`, the source's pending and dropped counts), and per-producer order.
  func problems(unaccounted: Int = 0, checkOrder: Bool = true) -> [String] {
    var problems: [String] = []
    let delivered = delivered.snapshot
    let accepted = accepted.snapshot
    let duplicates = delivered.filter { $0.value != 1 }
    if !duplicates.isEmpty { problems.append("delivered more than once: \(duplicates.keys.sorted().prefix(5))") }
    let refused = Set(delivered.keys).subtracting(accepted)
    if !refused.isEmpty { problems.append("delivered but refused: \(refused.sorted().prefix(5))") }
    let lost = accepted.subtracting(delivered.keys)
    if lost.count != unaccounted {
      problems.append("accepted \(accepted.count), delivered \(delivered.count), unaccounted \(unaccounted)")
    }
    // Per producer (command / 1000), commands come in posting order.
    var last: [Int: Int] = [:]
    for command in order.snapshot where checkOrder {
      let producer = command / 1000
      if let previous = last[producer], previous >= command {
        problems.append("producer \(producer): \(command) after \(previous)")
        break
      }
      last[producer] = command
    }
    return problems
  }
}

/// Posts `count` commands of `producer` (numbered `producer * 1000 + index`), noting the accepted.
func postAll(_ commands: CommandSource<Int>, _ ledger: CommandDeliveryLedger, producer: Int, count: Int) {
  for index in 0..<count {
    let command = producer * 1000 + index
    if commands.post(command) { ledger.accept(command) }
  }
}

let sharedTestLoopsSharedLoop: RunLoopThread = RunLoopThread.start(named: "shared")

let sharedTestLoopsSecondLoop: RunLoopThread = RunLoopThread.start(named: "second")

/// Helpers shared by the suites that conform (they call them as `Self.name` or by name).
protocol SharedTestLoops {}

extension SharedTestLoops {
  static var sharedLoop: RunLoopThread { sharedTestLoopsSharedLoop }

  static var secondLoop: RunLoopThread { sharedTestLoopsSecondLoop }
}
