/// Which loop threads are blocked in `LoopTimer.invalidateAndWait()`, waiting for a callout on
/// which other loop: a wait-for graph, so that a wait that would close a cycle (two loops' timer
/// callouts waiting for each other) is refused instead of deadlocking. Any thread; the graph is
/// only touched under its lock, and no edge is held across anything but the wait itself.
enum CalloutWaits {
  /// Waiting loop → the loop whose callout it waits for. A loop thread waits for one thing at a
  /// time, so one edge per waiter.
  private static let edges = LockedValue([ObjectIdentifier: LoopShared]())

  /// Records that `waiter`'s thread is about to wait for a callout on `target`; false (recording
  /// nothing) when `target` is, directly or through other loops, waiting for `waiter`.
  static func begin(waiter: LoopShared, target: LoopShared) -> Bool {
    edges.withLock { edges in
      var next: LoopShared? = target
      while let loop = next {
        if loop === waiter { return false }  // the chain leads back to the waiter: a cycle
        next = edges[ObjectIdentifier(loop)]
      }
      edges[ObjectIdentifier(waiter)] = target
      return true
    }
  }

  /// `waiter`'s wait ended.
  static func end(waiter: LoopShared) {
    _ = edges.withLock { $0.removeValue(forKey: ObjectIdentifier(waiter)) }
  }
}
