/// Which loop threads are blocked in `LoopTimer.invalidateAndWait()` (waiting for a callout on
/// another loop) or `RunLoopThread.performAndWait` (waiting for another loop to run a block): a
/// wait-for graph, so that a wait that would close a cycle (two loops waiting for each other,
/// directly or through others) is refused instead of deadlocking. Any thread; the graph is
/// only touched under its lock, and no edge is held across anything but the wait itself.
enum CalloutWaits {
  /// Waiting loop → the loop whose callout it waits for. A loop thread waits for one thing at a
  /// time, so one edge per waiter.
  private static let edges = LockedValue([ObjectIdentifier: LoopShared]())

  /// Records that `waiter`'s thread is about to wait for a callout on `target`; false (recording
  /// nothing) when `target` is, directly or through other loops, waiting for `waiter`.
  static func begin(waiter: LoopShared, target: LoopShared) -> Bool {
    edges.withLock { edges in
      guard !leadsBack(from: target, to: waiter, in: edges) else { return false }
      edges[ObjectIdentifier(waiter)] = target
      return true
    }
  }

  /// Records a wait that cannot be refused (`shutdownAndWait`), even when it closes a cycle: a
  /// wait in the cycle that can give up (a closing drain's) then sees it and does.
  static func beginUnrefusable(waiter: LoopShared, target: LoopShared) {
    edges.withLock { $0[ObjectIdentifier(waiter)] = target }
  }

  /// Whether the chain of waits from `start` reaches `waiter`. Bounded by the number of edges:
  /// an unrefusable wait may have closed a cycle that does not pass through `waiter`.
  private static func leadsBack(
    from start: LoopShared, to waiter: LoopShared, in edges: [ObjectIdentifier: LoopShared]
  ) -> Bool {
    var next: LoopShared? = start
    var steps = edges.count
    while let loop = next, steps >= 0 {
      if loop === waiter { return true }  // the chain leads back to the waiter: a cycle
      next = edges[ObjectIdentifier(loop)]
      steps -= 1
    }
    return false
  }

  /// Runs `wait` (which blocks the calling thread until `target` did something) with the caller's
  /// loop, if it is a loop thread, recorded as waiting for `target`. Throws
  /// `RunLoopError.wouldDeadlock` (without waiting) when `target` is, directly or through other
  /// loops, waiting for the caller's loop. `what` names the call for the message.
  static func whileWaiting<T>(
    for target: LoopShared, _ what: String, _ wait: () throws -> T
  ) throws -> T {
    guard let waiter = RunLoopThread.currentIfExists?.shared, waiter !== target else { return try wait() }
    guard begin(waiter: waiter, target: target) else {
      throw RunLoopError.wouldDeadlock(
        "\(what) on loop '\(waiter.name)' would wait for loop '\(target.name)', which is itself waiting for loop "
          + "'\(waiter.name)'")
    }
    defer { end(waiter: waiter) }
    return try wait()
  }

  /// `waiter`'s wait ended.
  static func end(waiter: LoopShared) {
    _ = edges.withLock { $0.removeValue(forKey: ObjectIdentifier(waiter)) }
  }
}
