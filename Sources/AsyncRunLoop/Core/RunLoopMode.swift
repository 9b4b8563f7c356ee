/// The name of a run-loop mode: a named set of sources, timers and observers.
///
/// Running a loop names one mode; only that mode's members are watched and only its observers
/// are told. `.common` is not a mode to run but a *set* of modes: adding an item to `.common`
/// adds it to every mode in the set, including modes added to the set later
/// (`RunLoopThread.addModeToCommonModes(_:)`). `.default` is in the common set from the start.
/// Removing an item from `.common` undoes exactly that: it leaves the common set and the common
/// modes it joined through it, but not a mode it was also added to by name.
public struct RunLoopMode: Hashable, Sendable, RawRepresentable, ExpressibleByStringLiteral,
  CustomStringConvertible
{
  public let rawValue: String
  /// The library's own modes (`everyMode`): never equal to a mode of the same name made from a
  /// string.
  private let isInternal: Bool

  public init(rawValue: String) { (self.rawValue, isInternal) = (rawValue, false) }
  public init(_ name: String) { (rawValue, isInternal) = (name, false) }
  public init(stringLiteral name: String) { (rawValue, isInternal) = (name, false) }
  private init(internal name: String) { (rawValue, isInternal) = (name, true) }

  // Spelled out: the defaults `RawRepresentable` brings would compare the names only.
  public static func == (lhs: RunLoopMode, rhs: RunLoopMode) -> Bool {
    lhs.rawValue == rhs.rawValue && lhs.isInternal == rhs.isInternal
  }

  public func hash(into hasher: inout Hasher) {
    hasher.combine(rawValue)
    hasher.combine(isInternal)
  }

  /// The mode a loop runs in unless told otherwise. Its name is CFRunLoop's,
  /// `"kCFRunLoopDefaultMode"` (Foundation's `RunLoop.Mode.default.rawValue`), so that a mode name
  /// read from, or compared with, Foundation or CF code means the same mode here.
  public static let `default` = RunLoopMode("kCFRunLoopDefaultMode")
  /// The common-modes pseudo-mode (a set of modes, never run itself). Its name is CFRunLoop's,
  /// `"kCFRunLoopCommonModes"` (Foundation's `RunLoop.Mode.common.rawValue`).
  public static let common = RunLoopMode("kCFRunLoopCommonModes")

  public var description: String { rawValue }

  /// Internal: the mode of the timers that run executor jobs later (`Task.sleep` under a loop's
  /// executor preference). Never run itself and never in the common set: every run, whatever its
  /// mode, fires its due timers, as it runs jobs in every mode.
  static let everyMode = RunLoopMode(internal: "AsyncRunLoop.everyMode")
}

/// Why a call to `RunLoopThread.run` returned (see "One pass of the loop").
public enum RunLoopRunResult: Sendable, Equatable, CustomStringConvertible {
  /// The mode held nothing to watch (no sources, no timers), and the loop is not shutting down.
  case finished
  /// `stop()` was called, or the loop is shutting down (`shutdown()` ends every run of the loop
  /// this way, at every nesting level).
  case stopped
  /// The run's time limit passed.
  case timedOut
  /// The run was asked to return after one input source fired, and one did.
  case handledSource

  public var description: String {
    switch self {
    case .finished: return "finished"
    case .stopped: return "stopped"
    case .timedOut: return "timedOut"
    case .handledSource: return "handledSource"
    }
  }
}
