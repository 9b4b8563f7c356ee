/// Something that can be scheduled in a loop's modes: an input source, a readiness source, a
/// timer or an observer. Loop thread only: `memberships` and the insert/remove hooks are touched
/// only by the `ModeTable` of the loop the member is scheduled on.
protocol ModeMember: AnyObject {
  /// The modes (their contents) this member is in, on its loop. Loop thread.
  var memberships: [ModeContents] { get set }
  /// Adds the member to one mode's storage. Loop thread.
  func insert(into contents: ModeContents)
  /// Removes the member from one mode's storage. Loop thread.
  func remove(from contents: ModeContents)
}

/// The members of one mode on one loop. Loop thread only (owned by `ModeTable`).
///
/// Every pass reads these, so they skip dynamic exclusivity checks (a thread-local lookup each):
/// they are confined to the loop thread, and the pass copies a list (or collects due timers)
/// before calling out, so no access overlaps one made from a callout.
final class ModeContents {
  let mode: RunLoopMode
  /// Custom sources, sorted by `order` (stable: equal orders keep insertion order).
  @exclusivity(unchecked) var sources: [InputSource] = []
  /// Readiness sources, in insertion order.
  @exclusivity(unchecked) var descriptors: [DescriptorSource] = []
  /// Observers, sorted by `order` (stable).
  @exclusivity(unchecked) var observers: [LoopObserver] = []
  /// Union of the activities the observers want; lets a pass skip empty notifications cheaply.
  @exclusivity(unchecked) var observedActivities: LoopActivity = []
  /// The timers in this mode.
  @exclusivity(unchecked) var timerCount = 0
  /// Those timers' pending fire dates (plus stale entries, see `TimerHeap`).
  @exclusivity(unchecked) var timers = TimerHeap<TimerHeapPayload>()

  init(mode: RunLoopMode) { self.mode = mode }

  /// SPEC §1: a mode with no sources and no timers gives the run nothing to wait for.
  var hasNothingToWatch: Bool {
    sources.isEmpty && descriptors.isEmpty && timerCount == 0
  }

  func recomputeObservedActivities() {
    observedActivities = observers.reduce(into: []) { $0.formUnion($1.activities) }
  }

  /// Inserts `element` after every element whose order is not greater (a stable sort by order).
  static func insertOrdered<Element: AnyObject>(
    _ element: Element, into array: inout [Element], order: (Element) -> Int
  ) {
    let key = order(element)
    let index = array.lastIndex { order($0) <= key }.map { $0 + 1 } ?? 0
    array.insert(element, at: index)
  }
}

/// A timer-heap entry's payload: the timer and the generation it was scheduled under.
struct TimerHeapPayload {
  let timer: LoopTimer
  let generation: UInt64
}

/// A loop's modes and the common-modes set. Loop thread only (owned by one `RunLoopThread`).
final class ModeTable {
  private(set) var contentsByMode: [RunLoopMode: ModeContents] = [:]
  /// The modes in the common set; `.default` is always one of them.
  private(set) var commonModes: Set<RunLoopMode> = [.default]
  /// Members added to `.common`, keyed by identity, with the order they were added in, so that a
  /// mode joining the common set later receives them too (in that order). A dictionary, because
  /// removal happens for every one-shot timer and must not scan.
  private var commonMembers: [ObjectIdentifier: (order: UInt64, member: any ModeMember)] = [:]
  private var commonOrder: UInt64 = 0

  /// The contents of `mode`, created on first use. `mode` must not be `.common`.
  func contents(for mode: RunLoopMode) -> ModeContents {
    precondition(mode != .common, "AsyncRunLoop: .common is a set of modes and cannot be run")
    if let existing = contentsByMode[mode] { return existing }
    let created = ModeContents(mode: mode)
    contentsByMode[mode] = created
    return created
  }

  func existingContents(for mode: RunLoopMode) -> ModeContents? { contentsByMode[mode] }

  /// Adds `member` to `mode` (to every common mode for `.common`).
  /// - Returns: true when this was the member's first mode on the loop (it just got attached).
  @discardableResult
  func add(_ member: any ModeMember, to mode: RunLoopMode) -> Bool {
    let wasDetached = member.memberships.isEmpty
    if mode == .common {
      let key = ObjectIdentifier(member)
      if commonMembers[key] == nil {
        commonOrder &+= 1
        commonMembers[key] = (commonOrder, member)
      }
      for commonMode in commonModes { insert(member, into: contents(for: commonMode)) }
    } else {
      insert(member, into: contents(for: mode))
    }
    return wasDetached && !member.memberships.isEmpty
  }

  /// Removes `member` from `mode` (from every common mode, and from the common set, for `.common`).
  /// Removing something that is not there is a no-op.
  /// - Returns: true when the member left its last mode on the loop (it just got detached).
  @discardableResult
  func remove(_ member: any ModeMember, from mode: RunLoopMode) -> Bool {
    let wasAttached = !member.memberships.isEmpty
    if mode == .common {
      commonMembers[ObjectIdentifier(member)] = nil
      for commonMode in commonModes {
        if let contents = contentsByMode[commonMode] { extract(member, from: contents) }
      }
    } else if let contents = contentsByMode[mode] {
      extract(member, from: contents)
    }
    return wasAttached && member.memberships.isEmpty
  }

  /// Removes `member` from every mode and from the common set.
  /// - Returns: true when it was attached before.
  @discardableResult
  func removeEverywhere(_ member: any ModeMember) -> Bool {
    let wasAttached = !member.memberships.isEmpty
    if !commonMembers.isEmpty { commonMembers[ObjectIdentifier(member)] = nil }
    for contents in member.memberships { member.remove(from: contents) }
    member.memberships.removeAll()
    return wasAttached
  }

  /// Adds `mode` to the common set; every member already in `.common` joins it.
  /// Adding `.common` itself or a mode already in the set is a no-op.
  /// - Returns: the members that joined the mode.
  @discardableResult
  func addToCommonModes(_ mode: RunLoopMode) -> [any ModeMember] {
    guard mode != .common, commonModes.insert(mode).inserted else { return [] }
    let contents = contents(for: mode)
    var joined: [any ModeMember] = []
    let ordered = commonMembers.values.sorted { $0.order < $1.order }.map(\.member)
    for member in ordered where !member.memberships.contains(where: { $0 === contents }) {
      insert(member, into: contents)
      joined.append(member)
    }
    return joined
  }

  /// Every member scheduled anywhere on the loop (each once).
  func allMembers() -> [any ModeMember] {
    var seen = Set<ObjectIdentifier>()
    var result: [any ModeMember] = []
    for contents in contentsByMode.values {
      let members: [any ModeMember] =
        contents.sources + contents.descriptors + contents.observers
        + contents.timers.entries.map { $0.payload.timer }
      for member in members where seen.insert(ObjectIdentifier(member)).inserted {
        if !member.memberships.isEmpty { result.append(member) }
      }
    }
    return result
  }

  private func insert(_ member: any ModeMember, into contents: ModeContents) {
    guard !member.memberships.contains(where: { $0 === contents }) else { return }
    member.memberships.append(contents)
    member.insert(into: contents)
  }

  private func extract(_ member: any ModeMember, from contents: ModeContents) {
    guard let index = member.memberships.firstIndex(where: { $0 === contents }) else { return }
    member.memberships.remove(at: index)
    member.remove(from: contents)
  }
}
