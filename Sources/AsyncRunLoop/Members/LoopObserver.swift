/// The points of a loop pass at which observers are told (see "One pass of the loop").
public struct LoopActivity: OptionSet, Sendable, Hashable, CustomStringConvertible {
  public let rawValue: UInt8
  public init(rawValue: UInt8) { self.rawValue = rawValue }

  /// A run is starting (step 1).
  public static let entry = LoopActivity(rawValue: 1 << 0)
  /// Timers are about to be processed (step 2).
  public static let beforeTimers = LoopActivity(rawValue: 1 << 1)
  /// Custom sources are about to fire (step 3).
  public static let beforeSources = LoopActivity(rawValue: 1 << 2)
  /// The thread is about to sleep (step 6); not sent for a zero time limit.
  public static let beforeWaiting = LoopActivity(rawValue: 1 << 3)
  /// The thread woke (step 8).
  public static let afterWaiting = LoopActivity(rawValue: 1 << 4)
  /// A run is ending (step 10).
  public static let exit = LoopActivity(rawValue: 1 << 5)
  /// Every activity.
  public static let all: LoopActivity = [.entry, .beforeTimers, .beforeSources, .beforeWaiting, .afterWaiting, .exit]

  public var description: String {
    let names: [(LoopActivity, String)] = [
      (.entry, "entry"), (.beforeTimers, "beforeTimers"), (.beforeSources, "beforeSources"),
      (.beforeWaiting, "beforeWaiting"), (.afterWaiting, "afterWaiting"), (.exit, "exit"),
    ]
    let present = names.filter { contains($0.0) }.map(\.1)
    return present.count == 1 ? present[0] : "[" + present.joined(separator: ", ") + "]"
  }
}

/// Watches a loop's activities. The callout runs on the loop thread, synchronously, at
/// each activity it asked for, while the loop runs in one of the observer's modes.
///
/// A repeating observer is told every pass; a one-shot observer invalidates itself after its
/// first callout. An observer may invalidate itself (or others) from its own callout. As in CF, an
/// observer is never told inside its own callout: a run nested in the callout skips it (so a
/// one-shot observer is told exactly once, and a callout that runs the loop does not recurse).
public final class LoopObserver: LoopMember, @unchecked Sendable {  // Safety: proof below
  // Safety: `activities`, `repeats` and `order` are immutable. `state` (binding, callout) and
  // `isFiring` are only touched with `lock` held. The loop-thread side (the modes holding it)
  // lives in the loop's `MemberRecord`.

  static var kindName: String { "LoopObserver" }

  /// The activities the observer is told about.
  public let activities: LoopActivity
  /// Whether the observer stays after its first callout.
  public let repeats: Bool
  /// Among observers of the same activity, lower orders are told first.
  public let order: Int
  /// A name for diagnostics: stall reports name the member by it (see `StallReport.label`).
  public let label: String?

  private let lock = PthreadLock.make()
  // No dynamic exclusivity checks (a thread-local lookup each, on every fire): these are only
  // touched under `lock`, and no access spans a callout.
  @exclusivity(unchecked) private var state: CalloutMemberState<Callout>
  /// The callout, in a concrete struct (see `CalloutMemberState`).
  private struct Callout { let run: @Sendable (LoopObserver, LoopActivity) -> Void }
  /// A callout of this observer is running (on the loop thread that told it).
  @exclusivity(unchecked) private var isFiring = false

  /// Creates an observer.
  /// - Parameters:
  ///   - activities: What to be told about.
  ///   - repeats: false to be told once and then invalidated.
  ///   - order: Lower orders are told first.
  ///   - label: A name for diagnostics (stall reports).
  ///   - callout: Runs on the loop thread with the activity that occurred.
  public convenience init(
    activities: LoopActivity, repeats: Bool = true, order: Int = 0, label: String? = nil,
    callout: @escaping @Sendable (LoopObserver, LoopActivity) -> Void
  ) {
    self.init(
      activities: activities, repeats: repeats, order: order, label: label, callout: callout, onInvalidate: nil)
  }

  init(
    activities: LoopActivity, repeats: Bool, order: Int, label: String? = nil,
    callout: @escaping @Sendable (LoopObserver, LoopActivity) -> Void, onInvalidate: (@Sendable () -> Void)?
  ) {
    self.activities = activities
    self.repeats = repeats
    self.order = order
    self.label = label
    self.state = CalloutMemberState(callout: Callout(run: callout), onInvalidate: onInvalidate)
  }

  func withBinding<Result>(_ body: (inout MemberBinding) -> Result) -> Result {
    lock.lock()
    defer { lock.unlock() }
    return body(&state.binding)
  }

  /// Stops the observer: no callout starts after this returns, and the loop drops it from its
  /// modes (at once on the loop thread, on its next pass from other threads). Any thread;
  /// idempotent; never blocks. Releases the callout.
  public func invalidate() {
    lock.withLock { state.invalidate() }.finish(self)
  }

  /// False once invalidated. Any thread.
  public var isValid: Bool { lock.withLock { state.binding.isValid } }

  /// Loop thread of `loop`: tells the observer (unless it was invalidated, left `loop` or the mode
  /// the loop holds `record` in as `claim` says, or its callout is running: a run nested in it
  /// skips it); a one-shot observer invalidates itself afterwards.
  func notify(_ activity: LoopActivity, on loop: LoopShared, record: MemberRecord, in claim: ModeClaim) {
    let current: Callout? = lock.withLock {
      guard !isFiring, let callout = state.callout(on: loop, for: record, in: claim) else { return nil }
      isFiring = true
      return callout
    }
    guard let current else { return }
    loop.observed(.observer(activity), label: label) { current.run(self, activity) }
    // The callout's end and a one-shot observer's invalidation in one critical section: between
    // two, another loop the callout moved the observer to would find it valid and not firing, and
    // tell it a second time.
    let invalidation = lock.withLock {
      isFiring = false
      return repeats ? nil : state.invalidate()
    }
    invalidation?.finish(self)
  }
}
