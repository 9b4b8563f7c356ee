/// The sequences that live on a `CFRunLoopExecutor`'s run loop (its timer and source
/// sequences): a pure state machine under the executor's lock. Shutdown ends each of them.
struct ExecutorMembers {
  typealias Ender = @Sendable () -> Void

  private(set) var isEnded = false
  private(set) var enders: [ObjectIdentifier: Ender] = [:]

  /// A new sequence: false once the executor has terminated (the sequence ends at once).
  mutating func adopt(_ id: ObjectIdentifier, ender: @escaping Ender) -> Bool {
    guard !isEnded else { return false }
    enders[id] = ender
    return true
  }

  /// The sequence went away (dropped, cancelled or invalidated).
  mutating func forget(_ id: ObjectIdentifier) {
    enders[id] = nil
  }

  /// The executor terminated: no more sequences; the caller ends these, after the lock.
  mutating func end() -> [Ender] {
    isEnded = true
    defer { enders.removeAll() }
    return Array(enders.values)
  }
}
