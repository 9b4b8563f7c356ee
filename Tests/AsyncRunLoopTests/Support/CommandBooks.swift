import Testing

@testable import AsyncRunLoop

/// The books of one `CommandSource<Int>` under test (review rounds 21 and 22): what `post`
/// accepted, what the handler got (in order), and its schedule and cancel calls. Holds nothing of
/// the source (no cycle).
final class CommandBooks: Sendable {
  let accepted = AtomicCounter()
  let delivered = Guarded<[Int]>([])
  let schedules = AtomicCounter()
  let cancels = AtomicCounter()

  /// A command source that books every delivery, then runs `extra` (on the loop thread); its
  /// schedule routine holds `token` (to see when the routines are released).
  func makeSource(
    token: (any Sendable)? = nil, _ extra: @escaping @Sendable (Int) -> Void = { _ in }
  ) -> CommandSource<Int> {
    CommandSource<Int>(
      schedule: { [self] _, _, _ in
        withExtendedLifetime(token) {}
        schedules.increment()
      },
      cancel: { [self] _, _ in cancels.increment() },
      handler: { [self] command in
        delivered.withLock { $0.append(command) }
        extra(command)
      })
  }

  /// Posts and books an accepted command.
  @discardableResult
  func post(_ source: CommandSource<Int>, _ command: Int) -> Bool {
    guard source.post(command) else { return false }
    accepted.increment()
    return true
  }

  var deliveredCount: Int { delivered.snapshot.count }
}

/// What the tests check at quiescence, as plain values (checked outside the blocking bodies).
struct CommandTally: Sendable, Equatable, CustomStringConvertible {
  var accepted: Int
  var delivered: [Int]
  var pending: Int
  var dropped: Int
  var schedules: Int
  var cancels: Int

  init(_ books: CommandBooks, pending: Int, dropped: Int) {
    accepted = books.accepted.current
    delivered = books.delivered.snapshot
    self.pending = pending
    self.dropped = dropped
    schedules = books.schedules.current
    cancels = books.cancels.current
  }

  init(_ books: CommandBooks, _ source: CommandSource<Int>) {
    self.init(books, pending: source.pendingCount, dropped: source.droppedCount)
  }

  /// accepted == delivered + pending + dropped, each delivered once, in posting order (one poster
  /// posting 0, 1, 2, ...: what was dropped is always the newest, so what was delivered is a
  /// prefix), and schedules pair with cancels.
  var balances: Bool {
    accepted == delivered.count + pending + dropped && delivered == Array(0..<delivered.count)
      && schedules == cancels
  }

  var description: String {
    "accepted \(accepted), delivered \(delivered), pending \(pending), dropped \(dropped), "
      + "schedules \(schedules), cancels \(cancels)"
  }
}
