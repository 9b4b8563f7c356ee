/// The members of one mode on one loop. Loop thread only (owned by `ModeTable`).
///
/// Every operation is O(1) (observers: amortized O(1) for members added in order): custom sources
/// are only counted (the pass fires the *signalled* ones, found through their records),
/// descriptors are keyed by identity (their order only matters to epoll, which has none), and
/// observers, told in order every pass, sit in an ordered slot list whose removed slots are left
/// empty and compacted once they outnumber the live ones.
///
/// Every pass reads these, so they skip dynamic exclusivity checks (a thread-local lookup each):
/// they are confined to the loop thread, and the pass iterates a copy (or pops timers one by
/// one) when it calls out, so no access overlaps one made from a callout.
final class ModeContents {
  let mode: RunLoopMode
  /// How many custom sources the mode holds.
  @exclusivity(unchecked) var sourceCount = 0
  /// Readiness sources' records, by member identity.
  @exclusivity(unchecked) var descriptors: [MemberKey: MemberRecord] = [:]
  /// Observers' records in `order` (stable: equal orders keep insertion order); nil slots are
  /// removed observers waiting for compaction.
  @exclusivity(unchecked) var observers: [MemberRecord?] = []
  @exclusivity(unchecked) var observerCount = 0
  /// Union of the activities the observers want; lets a pass skip empty notifications cheaply.
  @exclusivity(unchecked) var observedActivities: LoopActivity = []
  /// The timers in this mode.
  @exclusivity(unchecked) var timerCount = 0
  /// Those timers' pending fire dates, one entry per timer (removed or moved in O(log n)).
  @exclusivity(unchecked) var timers = IndexedTimerHeap<TimerEntry>()

  init(mode: RunLoopMode) { self.mode = mode }

  /// SPEC §1: a mode with no sources and no timers gives the run nothing to wait for.
  var hasNothingToWatch: Bool {
    sourceCount == 0 && descriptors.isEmpty && timerCount == 0
  }

  /// Inserts an observer's record in order; returns its slot.
  func insertObserver(_ record: MemberRecord) -> Int {
    let key = record.order
    // The common case (equal or rising orders): append.
    if let lastIndex = observers.lastIndex(where: { $0 != nil }), let last = observers[lastIndex], last.order > key {
      // Out of order: insert after the last slot whose order is not greater, and renumber.
      let index = observers.lastIndex { $0.map { $0.order <= key } ?? false }.map { $0 + 1 } ?? 0
      observers.insert(record, at: index)
      renumberObservers(from: index)
      observerCount += 1
      observedActivities.formUnion(Self.activities(of: record))
      return index
    }
    observers.append(record)
    observerCount += 1
    observedActivities.formUnion(Self.activities(of: record))
    return observers.count - 1
  }

  /// Empties an observer's slot; compacts when empty slots outnumber live ones.
  func removeObserver(at slot: Int) {
    observers[slot] = nil
    observerCount -= 1
    if observerCount == 0 {
      observers.removeAll(keepingCapacity: true)
    } else if observers.count > 32 && observers.count > 2 * observerCount {
      observers.removeAll { $0 == nil }
      renumberObservers(from: 0)
    }
    recomputeObservedActivities()
  }

  private func renumberObservers(from start: Int) {
    for index in start..<observers.count {
      guard let record = observers[index] else { continue }
      for position in record.modes.indices where record.modes[position].contents === self {
        record.modes[position].slot = index
      }
    }
  }

  private func recomputeObservedActivities() {
    // Many observers: the union only grows on insert, and shrinking it lazily is harmless (the
    // pass then iterates and finds nobody interested), so recompute only while it is cheap.
    guard observerCount <= 64 else { return }
    observedActivities = observers.reduce(into: []) { union, record in
      if let record { union.formUnion(Self.activities(of: record)) }
    }
  }

  private static func activities(of record: MemberRecord) -> LoopActivity {
    if case .observer(let observer) = record.kind { return observer.activities }
    return []
  }
}

/// A loop's modes, the common-modes set and the records of its members. Loop thread only (owned by
/// one `LoopCore`). No dynamic exclusivity checks (see `ModeContents`): confined to the loop
/// thread, and no access spans a callout.
final class ModeTable {
  @exclusivity(unchecked) private(set) var contentsByMode: [RunLoopMode: ModeContents] = [:]
  /// The modes in the common set; `.default` is always one of them.
  @exclusivity(unchecked) private(set) var commonModes: Set<RunLoopMode> = [.default]
  /// Every member on this loop, by identity.
  @exclusivity(unchecked) private(set) var records: [MemberKey: MemberRecord] = [:]
  /// Members added to `.common`, keyed by identity, with the order they were added in, so that a
  /// mode joining the common set later receives them too (in that order).
  @exclusivity(unchecked) private var commonMembers: [MemberKey: (order: UInt64, record: MemberRecord)] = [:]
  @exclusivity(unchecked) private var commonOrder: UInt64 = 0

  /// The mode last looked up: adds and runs nearly always name the same mode, and hashing a mode's
  /// name was a visible part of every add.
  @exclusivity(unchecked) private var lastContents: ModeContents?

  /// The contents of `mode`, created on first use. `mode` must not be `.common`.
  func contents(for mode: RunLoopMode) -> ModeContents {
    if let last = lastContents, last.mode == mode { return last }
    precondition(mode != .common, "AsyncRunLoop: .common is a set of modes and cannot be run")
    let contents: ModeContents
    if let existing = contentsByMode[mode] {
      contents = existing
    } else {
      contents = ModeContents(mode: mode)
      contentsByMode[mode] = contents
    }
    lastContents = contents
    return contents
  }

  func existingContents(for mode: RunLoopMode) -> ModeContents? { contentsByMode[mode] }

  /// The record of a member on this loop, if it is here.
  @inline(__always)
  func record(for member: AnyObject) -> MemberRecord? { records[MemberKey(member)] }

  /// Removes `member`'s record from the registry (one lookup) and returns it; `removeEverywhere`
  /// then takes it out of its modes.
  func takeRecord(for member: AnyObject) -> MemberRecord? {
    let record = records.removeValue(forKey: MemberKey(member))
    record?.isTaken = true
    return record
  }

  /// The record of `member`, created (not yet in any mode) if it is not here. `created` tells.
  func recordCreatingIfNeeded(_ member: AnyObject, _ kind: @autoclosure () -> MemberRecord.Kind)
    -> (record: MemberRecord, created: Bool)
  {
    let key = MemberKey(member)
    if let existing = records[key] { return (existing, false) }
    let record = MemberRecord(kind: kind())
    records[key] = record
    return (record, true)
  }

  /// Adds the record to `mode` (to every common mode for `.common`).
  /// - Returns: the modes the record joined (empty when it was in all of them already).
  @discardableResult
  func add(_ record: MemberRecord, to mode: RunLoopMode) -> [ModeContents] {
    var joined: [ModeContents] = []
    if mode == .common {
      if commonMembers[record.key] == nil {
        commonOrder &+= 1
        commonMembers[record.key] = (commonOrder, record)
      }
      for commonMode in commonModes where insert(record, into: contents(for: commonMode)) {
        joined.append(contents(for: commonMode))
      }
    } else if insert(record, into: contents(for: mode)) {
      joined.append(contents(for: mode))
    }
    return joined
  }

  /// Removes the record from `mode` (from every common mode, and from the common set, for
  /// `.common`). Removing it from a mode that does not hold it is a no-op.
  /// - Returns: true when the record left its last mode (the caller detaches it).
  func remove(_ record: MemberRecord, from mode: RunLoopMode) -> Bool {
    if mode == .common {
      commonMembers[record.key] = nil
      for commonMode in commonModes {
        if let contents = contentsByMode[commonMode] { extract(record, from: contents) }
      }
    } else if let contents = contentsByMode[mode] {
      extract(record, from: contents)
    }
    return record.modes.isEmpty
  }

  /// Removes the record from every mode, from the common set and from the registry.
  func removeEverywhere(_ record: MemberRecord) {
    if !commonMembers.isEmpty { commonMembers[record.key] = nil }
    while let last = record.modes.last { extract(record, from: last.contents) }
    if !record.isTaken { records[record.key] = nil }
    record.isDetached = true
  }

  /// Drops a record that is in no mode (left its last one) from the registry.
  func forget(_ record: MemberRecord) {
    precondition(record.modes.isEmpty, "AsyncRunLoop: forgetting a member that is still in a mode")
    commonMembers[record.key] = nil
    records[record.key] = nil
    record.isDetached = true
  }

  /// Adds `mode` to the common set; every member already in `.common` joins it.
  /// Adding `.common` itself or a mode already in the set is a no-op.
  /// - Returns: the records that joined the mode.
  @discardableResult
  func addToCommonModes(_ mode: RunLoopMode) -> [MemberRecord] {
    guard mode != .common, commonModes.insert(mode).inserted else { return [] }
    let contents = contents(for: mode)
    let ordered = commonMembers.values.sorted { $0.order < $1.order }.map(\.record)
    return ordered.filter { insert($0, into: contents) }
  }

  /// Every record on the loop.
  var allRecords: [MemberRecord] { Array(records.values) }

  /// Inserts the record into one mode; false when the mode holds it already.
  private func insert(_ record: MemberRecord, into contents: ModeContents) -> Bool {
    guard !record.isIn(contents) else { return false }
    var slot = -1
    var timerEntry: TimerEntry?
    switch record.kind {
    case .source: contents.sourceCount += 1
    case .descriptor: contents.descriptors[record.key] = record
    case .timer:
      contents.timerCount += 1
      timerEntry = TimerEntry(record: record)  // the loop puts it in the heap (`pushTimerEntries`)
    case .observer: slot = contents.insertObserver(record)
    }
    record.modes.append(Membership(contents: contents, slot: slot, timerEntry: timerEntry))
    return true
  }

  private func extract(_ record: MemberRecord, from contents: ModeContents) {
    guard let position = record.modes.firstIndex(where: { $0.contents === contents }) else { return }
    let slot = record.modes[position].slot
    let timerEntry = record.modes[position].timerEntry
    record.modes.remove(at: position)
    switch record.kind {
    case .source: contents.sourceCount -= 1
    case .descriptor: contents.descriptors[record.key] = nil
    case .timer:
      contents.timerCount -= 1
      if let timerEntry { contents.timers.remove(timerEntry) }
    case .observer: contents.removeObserver(at: slot)
    }
  }
}
