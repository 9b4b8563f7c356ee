/// What kind of work a loop's thread was running: one unit of work, as the stall watchdog reports
/// it (see `StallReport`).
public enum LoopCalloutKind: Sendable, Hashable, CustomStringConvertible {
  /// An executor job: a slice of an actor's or a task's work between two suspension points.
  case job
  /// A block handed to the loop with `perform` or `performAndWait`.
  case performedBlock
  /// A custom source's `perform` routine (`InputSource`, `CommandSource`, the async sequences).
  case sourceHandler
  /// A readiness handler (`DescriptorSource`).
  case readinessHandler
  /// A timer's handler (`LoopTimer`, timer sequences, sleeps on the loop's clock).
  case timer
  /// An observer's callout (`LoopObserver`), with the activity it was told.
  case observer(LoopActivity)

  public var description: String {
    switch self {
    case .job: return "job"
    case .performedBlock: return "performed block"
    case .sourceHandler: return "source handler"
    case .readinessHandler: return "readiness handler"
    case .timer: return "timer"
    case .observer(let activity): return "observer (\(activity))"
    }
  }
}
