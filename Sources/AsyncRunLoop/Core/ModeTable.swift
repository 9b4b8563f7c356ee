/// The members of one mode on one loop. Loop thread only (owned by `ModeTable`).
///
/// Every operation is O(1) but for observers' (O(log k) for k distinct observer orders in the
/// mode, plus O(k) when an order is new to it): custom sources are only counted (the pass fires
/// the *signalled* ones, found through their records), descriptors are keyed by identity (their
/// order only matters to epoll, which has none), and observers, told in order every pass, sit in
/// one bucket per order (`ObserverBucket`), in insertion order within it, whose removed slots are
/// left empty and compacted once they outnumber the live ones.
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
  /// Observers' records by `order`, lowest first: one bucket per order present, equal orders in
  /// insertion order.
  @exclusivity(unchecked) var observerBuckets: [ObserverBucket] = []
  @exclusivity(unchecked) var observerCount = 0
  /// Notifications of these observers in progress (nested runs nest them). While one is, slots
  /// keep their numbers and buckets stay (`observersNeedCleanup` defers the compaction), so that
  /// an observer's slot tells the notification whether it is the membership it started with.
  @exclusivity(unchecked) private var notificationDepth = 0
  @exclusivity(unchecked) private var observersNeedCleanup = false
  /// Union of the activities the observers want; lets a pass skip empty notifications cheaply.
  @exclusivity(unchecked) var observedActivities: LoopActivity = []
  /// The timers in this mode.
  @exclusivity(unchecked) var timerCount = 0
  /// Those timers' pending fire dates, one entry per timer (removed or moved in O(log n)).
  @exclusivity(unchecked) var timers = IndexedTimerHeap<TimerEntry>()

  /// The mode is in the loop's common set (which only grows): a member added to `.common` is in it.
  @exclusivity(unchecked) var isInCommonSet = false

  init(mode: RunLoopMode) { self.mode = mode }

  /// A mode with no sources and no timers gives the run nothing to wait for.
  var hasNothingToWatch: Bool {
    sourceCount == 0 && descriptors.isEmpty && timerCount == 0
  }

  /// Inserts an observer's record after every observer of a lower or equal order; returns its
  /// slot in the bucket of its order (found again from `record.order`).
  func insertObserver(_ record: MemberRecord) -> Int {
    let index = bucketIndex(of: record.order)
    if index == observerBuckets.count || observerBuckets[index].order != record.order {
      observerBuckets.insert(ObserverBucket(order: record.order), at: index)  // O(k): an order new here
    }
    observerCount += 1
    observedActivities.formUnion(Self.activities(of: record))
    observerBuckets[index].slots.append(record)
    observerBuckets[index].live += 1
    return observerBuckets[index].slots.count - 1
  }

  /// Empties an observer's slot; compacts its bucket when empty slots outnumber live ones, and
  /// drops the bucket once it is empty.
  func removeObserver(_ record: MemberRecord, at slot: Int) {
    let index = bucketIndex(of: record.order)
    precondition(index < observerBuckets.count && observerBuckets[index].order == record.order)
    observerBuckets[index].slots[slot] = nil
    observerBuckets[index].live -= 1
    observerCount -= 1
    if notificationDepth > 0 {
      if observerBuckets[index].live == 0 || observerBuckets[index].isWasteful { observersNeedCleanup = true }
    } else if observerBuckets[index].live == 0 {
      observerBuckets.remove(at: index)
    } else if observerBuckets[index].isWasteful {
      compactObservers(at: index)
    }
    recomputeObservedActivities()
  }

  /// A notification of these observers begins (`LoopPass.notifyObservers`).
  func beginObserverNotification() { notificationDepth += 1 }

  /// The notification ended: the outermost one does the cleanup removals deferred meanwhile.
  func endObserverNotification() {
    notificationDepth -= 1
    guard notificationDepth == 0, observersNeedCleanup else { return }
    observersNeedCleanup = false
    observerBuckets.removeAll { $0.live == 0 }
    for index in observerBuckets.indices where observerBuckets[index].isWasteful { compactObservers(at: index) }
  }

  private func compactObservers(at index: Int) {
    observerBuckets[index].slots.removeAll { $0 == nil }
    renumberObservers(in: observerBuckets[index])
  }

  /// The index of the bucket for `order`, or where it would be inserted. O(log k).
  private func bucketIndex(of order: Int) -> Int {
    var low = 0
    var high = observerBuckets.count
    while low < high {
      let middle = (low + high) / 2
      if observerBuckets[middle].order < order { low = middle + 1 } else { high = middle }
    }
    return low
  }

  private func renumberObservers(in bucket: ObserverBucket) {
    for (index, record) in bucket.slots.enumerated() {
      guard let record else { continue }
      for position in record.modes.indices where record.modes[position].contents === self {
        record.modes[position].slot = index
      }
    }
  }

  private func recomputeObservedActivities() {
    // Many observers: the union only grows on insert, and shrinking it lazily is harmless (the
    // pass then iterates and finds nobody interested), so recompute only while it is cheap.
    guard observerCount <= 64 else { return }
    observedActivities = []
    for bucket in observerBuckets {
      for case let record? in bucket.slots { observedActivities.formUnion(Self.activities(of: record)) }
    }
  }

  private static func activities(of record: MemberRecord) -> LoopActivity {
    if let observer = record.attachedObserver { return observer.activities }
    return []
  }
}

/// The observers of one order in one mode, in insertion order; nil slots are removed observers
/// waiting for compaction. Loop thread only (part of `ModeContents`).
struct ObserverBucket {
  let order: Int
  var slots: [MemberRecord?] = []
  /// The non-nil slots.
  var live = 0

  init(order: Int) { self.order = order }

  /// Empty slots outnumber live ones (and there are enough to be worth a copy).
  var isWasteful: Bool { slots.count > 32 && slots.count > 2 * live }
}

/// A loop's modes, the common-modes set and the records of its members. Loop thread only (owned by
/// one `LoopCore`). No dynamic exclusivity checks (see `ModeContents`): confined to the loop
/// thread, and no access spans a callout.
///
/// Members are never looked up here: every change carries its member's record (see
/// `MemberRecord`). The registry only holds the attached records, for the loop to enumerate at
/// shutdown and when a mode joins the common set: a slot array with a free list, so attaching and
/// detaching touch one slot and no other record.
final class ModeTable {
  @exclusivity(unchecked) private(set) var contentsByMode: [RunLoopMode: ModeContents] = [:]
  /// The modes in the common set; `.default` is always one of them.
  @exclusivity(unchecked) private(set) var commonModes: Set<RunLoopMode> = [.default]
  /// The attached records (they hold their members); nil slots are free, listed in `freeSlots`.
  @exclusivity(unchecked) private var registry: [MemberRecord?] = []
  @exclusivity(unchecked) private var freeSlots: [Int] = []
  /// Counts members added to `.common` (each record keeps its own `commonOrder`).
  @exclusivity(unchecked) private var commonOrder: UInt32 = 0
  @exclusivity(unchecked) private var commonCount = 0
  /// Counts custom sources joining a mode (by any way): a signalled source deferred because its
  /// modes were not running may be in a mode it was not in before (see
  /// `SignalledSources`).
  @exclusivity(unchecked) private(set) var sourceJoins: UInt64 = 0

  /// The mode last looked up: adds and runs nearly always name the same mode, and hashing a mode's
  /// name was a visible part of every add.
  @exclusivity(unchecked) private var lastContents: ModeContents?
  /// The contents of `RunLoopMode.everyMode` once used (every pass looks at its timers).
  @exclusivity(unchecked) private(set) var everyModeContents: ModeContents?

  /// The contents of `mode`, created on first use. `mode` must not be `.common`.
  func contents(for mode: RunLoopMode) -> ModeContents {
    if let last = lastContents, last.mode == mode { return last }
    precondition(mode != .common, "AsyncRunLoop: .common is a set of modes and cannot be run")
    let contents: ModeContents
    if let existing = contentsByMode[mode] {
      contents = existing
    } else {
      contents = ModeContents(mode: mode)
      contents.isInCommonSet = commonModes.contains(mode)
      contentsByMode[mode] = contents
      if mode == .everyMode { everyModeContents = contents }
    }
    lastContents = contents
    return contents
  }

  /// The contents of `mode` if it was ever used (the last one looked up without hashing its name).
  func existingContents(for mode: RunLoopMode) -> ModeContents? {
    if let last = lastContents, last.mode == mode { return last }
    return contentsByMode[mode]
  }

  /// Attaches a record that is not on the loop yet (in no mode yet), holding `kind`'s member.
  func attach(_ record: MemberRecord, _ kind: MemberRecord.Kind) {
    precondition(!record.isAttached && record.modes.isEmpty, "AsyncRunLoop: attaching a record twice")
    let slot: Int
    if let free = freeSlots.popLast() {
      slot = free
      registry[slot] = record
    } else {
      slot = registry.count
      registry.append(record)
    }
    record.attach(kind, slot: slot)
  }

  /// Adds the record to `mode` (to every common mode for `.common`).
  /// - Returns: whether the record joined any mode (false when it was in all of them already).
  @discardableResult
  func add(_ record: MemberRecord, to mode: RunLoopMode) -> Bool {
    guard mode == .common else { return insert(record, into: contents(for: mode), viaCommon: false) }
    if record.commonOrder == 0 {
      if commonOrder == UInt32.max { renumberCommonOrders() }
      commonOrder += 1
      record.commonOrder = commonOrder
      commonCount += 1
    }
    var joined = false
    for commonMode in commonModes where insert(record, into: contents(for: commonMode), viaCommon: true) {
      joined = true
    }
    return joined
  }

  /// Removes the record from `mode`. Removing it from a mode that does not hold it is a no-op.
  ///
  /// The loop agrees with the member's binding (a set of mode *names*, `.common` one of them) on
  /// when a member has left this loop: removing `.common` undoes adding to `.common` (the record
  /// leaves the common set and the common modes it joined only through it, not those it was also
  /// added to by name), and removing a mode by name takes the record out of that mode, while a
  /// record still in the common set stays on the loop (in no mode, perhaps, until a mode joins
  /// the common set).
  /// - Returns: true when the record left this loop: in no mode and not in the common set (the
  ///   caller detaches it).
  func remove(_ record: MemberRecord, from mode: RunLoopMode) -> Bool {
    if mode == .common {
      leaveCommonSet(record)
      var position = 0
      while position < record.modes.count {
        var membership = record.modes[position]
        guard membership.viaCommon else {
          position += 1
          continue
        }
        if membership.byName {
          membership.viaCommon = false
          record.modes[position] = membership
          position += 1
        } else {
          extract(record, from: membership.contents)
        }
      }
    } else if let contents = existingContents(for: mode) {
      extract(record, from: contents)
    }
    return record.modes.isEmpty && record.commonOrder == 0
  }

  /// Removes the record from every mode, from the common set and from the registry: it no longer
  /// holds its member. A record that is not attached is left as it is.
  func removeEverywhere(_ record: MemberRecord) {
    guard record.isAttached else { return }
    leaveCommonSet(record)
    while let last = record.modes.last { extract(record, from: last.contents) }
    let slot = record.registrySlot
    registry[slot] = nil
    if freeSlots.count + 1 == registry.count {
      // Empty: start over, so a loop that once held many members does not keep scanning them.
      registry.removeAll(keepingCapacity: true)
      freeSlots.removeAll(keepingCapacity: true)
    } else {
      freeSlots.append(slot)
    }
    record.markDetached()
  }

  /// Numbers the members in `.common` 1, 2, … in their order (the count of adds to `.common`
  /// reached 2^32 - 1; records keep 32 bits of it). O(members), once per 2^32 adds.
  private func renumberCommonOrders() {
    commonOrder = 0
    for record in commonRecordsInOrder() {
      commonOrder += 1
      record.commonOrder = commonOrder
    }
  }

  /// Tests: starts the count of adds to `.common` at `count` (to reach its wrap quickly).
  func setCommonOrderCountForTesting(_ count: UInt32) { commonOrder = count }

  /// The records in `.common`, in the order they were added there.
  private func commonRecordsInOrder() -> [MemberRecord] {
    registry.compactMap { $0 }.filter { $0.commonOrder != 0 }.sorted { $0.commonOrder < $1.commonOrder }
  }

  private func leaveCommonSet(_ record: MemberRecord) {
    guard record.commonOrder != 0 else { return }
    record.commonOrder = 0
    commonCount -= 1
  }

  /// Adds `mode` to the common set; every member already in `.common` joins it.
  /// Adding `.common` itself or a mode already in the set is a no-op. O(members on the loop).
  /// - Returns: the records that joined the mode.
  @discardableResult
  func addToCommonModes(_ mode: RunLoopMode) -> [MemberRecord] {
    guard mode != .common, mode != .everyMode, commonModes.insert(mode).inserted else { return [] }
    let contents = contents(for: mode)
    contents.isInCommonSet = true
    guard commonCount > 0 else { return [] }
    return commonRecordsInOrder().filter { insert($0, into: contents, viaCommon: true) }
  }

  /// Every record on the loop.
  var allRecords: [MemberRecord] { registry.compactMap { $0 } }

  /// How many records are on the loop, in O(1).
  var recordCount: Int { registry.count - freeSlots.count }

  /// Inserts the record into one mode (by name, or through `.common`); false when the mode holds
  /// it already (it then also remembers the new way it was added).
  private func insert(_ record: MemberRecord, into contents: ModeContents, viaCommon: Bool) -> Bool {
    if let position = record.modes.firstIndex(where: { $0.contents === contents }) {
      if viaCommon { record.modes[position].viaCommon = true } else { record.modes[position].byName = true }
      return false
    }
    var membership = Membership(contents: contents, slot: -1, byName: !viaCommon, viaCommon: viaCommon)
    switch record.attachedKind {
    case nil: return false
    case .source:
      contents.sourceCount += 1
      sourceJoins &+= 1
    case .descriptor: contents.descriptors[record.key] = record
    case .timer:
      contents.timerCount += 1
      // The loop puts the entry in the heap (`pushTimerEntries`): the record itself unless
      // another of its modes uses it already.
      if record.modes.contains(where: \.usesRecordEntry) {
        membership.extraEntry = ExtraTimerEntry(record: record)
      } else {
        membership.usesRecordEntry = true
      }
    case .observer: membership.slot = contents.insertObserver(record)
    }
    record.modes.append(membership)
    return true
  }

  private func extract(_ record: MemberRecord, from contents: ModeContents) {
    guard let position = record.modes.firstIndex(where: { $0.contents === contents }) else { return }
    let slot = record.modes[position].slot
    let timerEntry = record.modes[position].timerEntry(of: record)
    record.modes.remove(at: position)
    switch record.attachedKind {
    case nil: break
    case .source: contents.sourceCount -= 1
    case .descriptor: contents.descriptors[record.key] = nil
    case .timer:
      contents.timerCount -= 1
      if let timerEntry { contents.timers.remove(timerEntry) }
    case .observer: contents.removeObserver(record, at: slot)
    }
  }
}
