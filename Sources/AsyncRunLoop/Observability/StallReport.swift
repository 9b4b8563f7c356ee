/// One report of the stall watchdog (see `RunLoopThread.watchStalls(threshold:bufferSize:handler:)`):
/// a unit of work on the loop's thread ran longer than the threshold.
///
/// Each stalled callout is reported up to twice: `.stillRunning` by the watcher thread while the
/// loop's thread is still stuck in it (the loop's thread takes no part), then `.ended` by the
/// loop's thread when it returns, with its duration. A callout may be reported only `.ended`
/// (the watcher was not scheduled in time, or the callout ran the loop nested, which is not
/// stuck: nested passes are running).
public struct StallReport: Sendable, CustomStringConvertible {
  /// Where the callout was when reported.
  public enum Phase: Sendable, Equatable {
    /// Still running; it had been running for `elapsed` when the watcher looked.
    case stillRunning(elapsed: Duration)
    /// Returned after running for `duration`.
    case ended(duration: Duration)
  }

  /// The loop's name.
  public let loopName: String
  /// What kind of work it is.
  public let kind: LoopCalloutKind
  /// The label the member was given (`label:` of `InputSource`, `CommandSource`,
  /// `DescriptorSource`, `LoopTimer`, `LoopObserver`); nil for jobs, blocks and unlabelled
  /// members. The runtime offers no cheap way to read a job's task name from outside the task
  /// (`ExecutorJob` exposes only its priority), so jobs carry `priority` instead.
  public let label: String?
  /// A job's priority; nil for other kinds.
  public let priority: TaskPriority?
  /// The mode the loop was running.
  public let mode: RunLoopMode
  /// How many runs of the loop were on the thread's stack (1: the outermost run).
  public let nestingDepth: Int
  /// When the callout started (`LoopClock`).
  public let started: LoopClock.Instant
  /// Numbers this loop's callouts: the `.stillRunning` and `.ended` reports of one callout share
  /// it.
  public let calloutNumber: UInt64
  /// Still running, or ended.
  public let phase: Phase

  public var description: String {
    let what = label.map { "\(kind) '\($0)'" } ?? "\(kind)"
    let when: String
    switch phase {
    case .stillRunning(let elapsed): when = "still running after \(LoopHistogram.format(elapsed))"
    case .ended(let duration): when = "ran \(LoopHistogram.format(duration))"
    }
    return "loop '\(loopName)': \(what) \(when) (mode \(mode.rawValue), depth \(nestingDepth), #\(calloutNumber))"
  }
}
