/// The custom sources signalled and not fired yet, as the loop's thread holds them. Loop thread
/// only (a part of `LoopCore`).
///
/// Invariants:
/// - `collected` holds the signals taken from the inbox since the last step 4, in the order they
///   were sent, behind those a step 4 kept (numbered 0: they wait for no change). Step 4 fires a
///   signal only once every change sent before it was applied (its number is before the change
///   barrier); the others stay in front, in order.
/// - `deferred` holds sources signalled while the mode being run did not hold them: they fire when
///   a run of one of their modes reaches step 4. It may hold records detached since (a removal does
///   not search it): the next sort skips and drops them.
/// - While `deferredScannedMode` and `deferredScannedJoins` still match the mode being run and
///   `ModeTable.sourceJoins`, no source in `deferred` is in that mode (a pass sorted them out, and
///   no source joined a mode since), so its passes need not look at them again: with many sources
///   signalled in other modes, a pass costs O(1) for them.
/// - `unfired` is the rest of the ready list of the step 4 on the stack: a run nested in one of
///   its handlers considers those sources too (they are still signalled), so it does not wait for
///   them.
/// - No method calls out: step 4 sorts the sources out here, then fires them outside any access.
struct SignalledSources {
  private(set) var collected: [SignalledRecord] = []
  private(set) var deferred: [MemberRecord] = []
  private var deferredScannedMode: ModeContents?
  private var deferredScannedJoins: UInt64 = 0
  /// The ready sources of the step 4 on the stack that have not fired yet.
  var unfired: ArraySlice<MemberRecord> = []
  /// Warm buffers for runs' ready lists (a nested run takes one, gives it back when it ends).
  private var spareReadyBuffers: [[MemberRecord]] = []

  /// Signals collected and not sorted out by a step 4 yet.
  @inline(__always)
  var hasCollected: Bool { !collected.isEmpty }

  /// Under the inbox lock: takes the inbox's signals, behind those already collected.
  @inline(__always)
  mutating func take(from inbox: inout [SignalledRecord]) {
    guard !inbox.isEmpty else { return }
    if collected.isEmpty {
      swap(&collected, &inbox)  // the usual case: O(1), and both buffers stay warm
    } else {
      collected.append(contentsOf: inbox)
      inbox.removeAll(keepingCapacity: true)
    }
  }

  /// The number of the oldest signal collected that waits for a change (`UInt64.max`: none).
  var oldestWaitingSequence: UInt64 {
    collected.first { $0.sequence > 0 }?.sequence ?? UInt64.max
  }

  /// `record` was signalled while none of its modes runs (or before it joined the loop).
  @inline(__always)
  mutating func deferSource(_ record: MemberRecord) { deferred.append(record) }

  /// A nested run begins inside a step 4's handler: the sources that step has not fired yet are
  /// still signalled, and the nested run considers them. Returns what to restore with
  /// `endNestedRun`.
  mutating func beginNestedRun() -> ArraySlice<MemberRecord> {
    for record in unfired { collected.append(SignalledRecord(record: record, sequence: 0)) }
    return unfired
  }

  /// The nested run ended: the step 4 further out continues with its own list.
  @inline(__always)
  mutating func endNestedRun(restoring outerUnfired: ArraySlice<MemberRecord>) { unfired = outerUnfired }

  /// A buffer for a run's ready list (empty).
  mutating func takeReadyBuffer() -> [MemberRecord] { spareReadyBuffers.popLast() ?? [] }

  /// A run's ready list, given back when the run ends.
  mutating func returnReadyBuffer(_ buffer: [MemberRecord]) { spareReadyBuffers.append(buffer) }

  /// Whether every source in `deferred` is known to be out of `contents`' mode (see the type's
  /// comment; `sourceJoins` is `ModeTable.sourceJoins`).
  @inline(__always)
  func deferredAreElsewhere(than contents: ModeContents, sourceJoins: UInt64) -> Bool {
    deferredScannedMode === contents && deferredScannedJoins == sourceJoins
  }

  /// Whether a source in `deferred` is in `contents`' mode: it joined the mode after step 4 of this
  /// pass, already signalled. Its signal is kept only here, not in the inbox, so sleeping would
  /// strand it.
  func hasDeferred(in contents: ModeContents, sourceJoins: UInt64) -> Bool {
    guard !deferred.isEmpty, !deferredAreElsewhere(than: contents, sourceJoins: sourceJoins) else { return false }
    return deferred.contains { $0.isIn(contents) }
  }

  /// Step 4's sorting: fills `ready` (emptied first) with the signalled sources in `contents`'
  /// mode that may fire now (numbered before `barrier`), lower orders first, equal orders in
  /// signalling order; moves the sources signalled in other modes to `deferred`; keeps, in order,
  /// the signals that wait for a change; drops the ones whose source left the loop. Returns false,
  /// leaving `ready` alone, when there is nothing to look at. Allocates nothing in the steady
  /// state (unless orders differ).
  mutating func sortOut(
    for contents: ModeContents, sourceJoins: UInt64, barrier: UInt64, into ready: inout [MemberRecord]
  ) -> Bool {
    // Deferred sources known to be out of this mode stay where they are.
    let scansDeferred = !deferred.isEmpty && !deferredAreElsewhere(than: contents, sourceJoins: sourceJoins)
    if collected.isEmpty && !scansDeferred { return false }
    if !ready.isEmpty { ready.removeAll(keepingCapacity: true) }
    if scansDeferred {
      // Signalled before everything collected since: first, so equal orders keep signalling order.
      collected.insert(contentsOf: deferred.lazy.map { SignalledRecord(record: $0, sequence: 0) }, at: 0)
      deferred.removeAll(keepingCapacity: true)
    }
    var sameOrder = true
    var waiting = 0
    for index in collected.indices {
      let signalled = collected[index]
      if signalled.sequence >= barrier {
        collected[waiting] = signalled  // kept, in order, at the front
        waiting += 1
        continue
      }
      let record = signalled.record
      // Not on this loop (removed, or moved away): the signal stays on the source for the loop it
      // joins next. A source listed twice fires once (`consumeSignal` answers once per signal).
      guard record.isAttached else { continue }
      if record.isIn(contents) {
        if let first = ready.first, first.order != record.order { sameOrder = false }
        ready.append(record)
      } else {
        deferred.append(record)  // in other modes: fires when one of them runs
      }
    }
    collected.removeSubrange(waiting...)
    // Sorted out for this mode (before any handler runs: one that adds a source to a mode ends
    // this knowledge).
    deferredScannedMode = contents
    deferredScannedJoins = sourceJoins
    if !sameOrder {
      // Stable: equal orders keep signalling order.
      let sorted = ready.enumerated().sorted { lhs, rhs in
        lhs.element.order != rhs.element.order ? lhs.element.order < rhs.element.order : lhs.offset < rhs.offset
      }
      ready = sorted.map(\.element)
    }
    return true
  }

  /// Whether `record` is the only source with a signal waiting here for `contents`' mode: every
  /// collected signal is its own, no step 4 on the stack has sources left to fire, and `deferred`
  /// holds neither `record` nor a source of that mode (see `LoopCore+EarlyFire`).
  func onlySignalled(_ record: MemberRecord, in contents: ModeContents, sourceJoins: UInt64) -> Bool {
    unfired.isEmpty && collected.allSatisfy { $0.record === record }
      && !deferred.contains { $0 === record } && !hasDeferred(in: contents, sourceJoins: sourceJoins)
  }

  /// Drops the collected signals (they were all the one source's that fired early; see
  /// `onlySignalled`) and returns how many there were.
  mutating func dropCollected() -> Int {
    let dropped = collected.count
    collected.removeAll(keepingCapacity: true)
    return dropped
  }

  /// Drops every signal (the loop has terminated: its sources are detached).
  mutating func removeAll() {
    deferred.removeAll()
    collected.removeAll()
  }
}
