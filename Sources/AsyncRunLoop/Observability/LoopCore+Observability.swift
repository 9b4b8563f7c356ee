/// The one hook every callout of a pass goes through (jobs, blocks, source and readiness handlers,
/// timers, observers). Loop thread only.
extension LoopCore {
  /// Runs `body`, one callout of `kind`, counted and timed when metrics are on and stamped for the
  /// stall watcher when a watch is on; off, it costs one test of a loop-thread flag (the label
  /// and priority are not even computed).
  /// - Parameters:
  ///   - label: The member's label.
  ///   - priority: A job's priority.
  ///   - since: When what the callout answers arrived (0: not known): a job's enqueue or a
  ///     source's signal as a `MetricsClock` reading, a timer's fire date as a `LoopClock` time.
  @inline(__always)
  func observed<Result>(
    _ kind: LoopCalloutKind, label: @autoclosure () -> String? = nil,
    priority: @autoclosure () -> TaskPriority? = nil, since: Int64 = 0, _ body: () throws -> Result
  ) rethrows -> Result {
    guard monitor.isActive else { return try body() }
    let token = monitor.begin(kind, label: label, priority: priority, since: since)
    defer { monitor.end(token) }
    return try body()
  }
}

extension LoopShared {
  /// `LoopCore.observed`, for members firing on this loop's thread. `since` is in the loop's time
  /// (`nowNanoseconds`: a timer's fire date); on a virtual-time loop it is carried over to
  /// `LoopClock` keeping its distance from now, so a timer's lateness is the virtual lateness.
  @inline(__always)
  func observed<Result>(
    _ kind: LoopCalloutKind, label: @autoclosure () -> String? = nil, since: @autoclosure () -> Int64 = 0,
    _ body: () throws -> Result
  ) rethrows -> Result {
    guard core.monitor.isActive else { return try body() }
    var arrived = since()
    if arrived != 0, case .manual(let clock) = timeSource {
      let ago = clock.nowNanoseconds.subtractingSaturating(arrived)
      arrived = LoopClock.monotonicNanoseconds().subtractingSaturating(ago)
    }
    return try core.observed(kind, label: label(), since: arrived, body)
  }
}
