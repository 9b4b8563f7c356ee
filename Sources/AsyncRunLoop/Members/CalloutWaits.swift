/// Which loop threads are blocked in `LoopTimer.invalidateAndWait()` (waiting for a callout on
/// another loop) or `RunLoopThread.performAndWait` (waiting for another loop to run a block): a
/// wait-for graph, so that a wait that would close a cycle (two loops waiting for each other,
/// directly or through others) is refused instead of deadlocking. Any thread; the graph is
/// only touched under its lock, and no edge is held across anything but the wait itself.
enum CalloutWaits {
  /// A loop thread's wait: the loop it waits for, whether the wait gives up by itself when a
  /// cycle forms later (a closing drain's looks again every slice; the others block until done),
  /// and the gate that ends it. An edge whose gate is open is over although its thread has not
  /// woken to remove it yet: the loop it waited for finished what it waited for, so no cycle
  /// passes through it (a `shutdownAndWait` that saw it would not wait for a thread that is
  /// about to run again).
  private struct Edge {
    let target: LoopShared
    let yields: Bool
    let until: BlockingGate?

    var isOver: Bool { until?.isOpened == true }
  }

  /// Waiting loop → what it waits for. A loop thread waits for one thing at a time, so one edge
  /// per waiter.
  private static let edges = LockedValue([ObjectIdentifier: Edge]())

  /// Records that `waiter`'s thread is about to wait for a callout on `target` (`yields`: the
  /// wait gives up by itself, see `Edge`); false (recording nothing) when `target` is, directly or
  /// through other loops, waiting for `waiter`.
  /// `until` is the gate that ends the wait, when it has one.
  static func begin(waiter: LoopShared, target: LoopShared, yields: Bool = false, until: BlockingGate?) -> Bool {
    edges.withLock { edges in
      guard chain(from: target, to: waiter, in: edges) == nil else { return false }
      edges[ObjectIdentifier(waiter)] = Edge(target: target, yields: yields, until: until)
      return true
    }
  }

  /// Records a wait that only gives way to waits that give up by themselves
  /// (`shutdownAndWait`): when `target` leads back to `waiter` only through waits that block
  /// until done (another `shutdownAndWait`, a `performAndWait`), recording it would close a
  /// deadlock, and it returns false (recording nothing); a cycle through a closing drain's wait
  /// is recorded, and that drain sees it and gives up.
  static func beginUnlessDeadlocked(waiter: LoopShared, target: LoopShared) -> Bool {
    edges.withLock { edges in
      if let throughYieldingWait = chain(from: target, to: waiter, in: edges), !throughYieldingWait { return false }
      edges[ObjectIdentifier(waiter)] = Edge(target: target, yields: false, until: nil)
      return true
    }
  }

  /// Whether the chain of waits from `start` reaches `waiter`: nil when it does not; otherwise
  /// whether one of its waits gives up by itself. Bounded by the number of edges: a recorded
  /// cycle may not pass through `waiter`.
  private static func chain(
    from start: LoopShared, to waiter: LoopShared, in edges: [ObjectIdentifier: Edge]
  ) -> Bool? {
    var next: LoopShared? = start
    var yields = false
    var steps = edges.count
    while let loop = next, steps >= 0 {
      if loop === waiter { return yields }  // the chain leads back to the waiter: a cycle
      let edge = edges[ObjectIdentifier(loop)].flatMap { $0.isOver ? nil : $0 }
      yields = yields || edge?.yields == true
      next = edge?.target
      steps -= 1
    }
    return nil
  }

  /// Runs `wait` (which blocks the calling thread until `target` did something and opened
  /// `gate`) with the caller's loop, if it is a loop thread, recorded as waiting for `target`. Throws
  /// `RunLoopError.wouldDeadlock` (without waiting) when `target` is, directly or through other
  /// loops, waiting for the caller's loop. `what` names the call for the message.
  static func whileWaiting<T>(
    for target: LoopShared, _ what: String, until gate: BlockingGate, _ wait: () throws -> T
  ) throws -> T {
    guard let waiter = RunLoopThread.currentIfExists?.shared, waiter !== target else { return try wait() }
    guard begin(waiter: waiter, target: target, until: gate) else {
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
