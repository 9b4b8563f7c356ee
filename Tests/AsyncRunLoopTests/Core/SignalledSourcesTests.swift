import Testing

@testable import AsyncRunLoop

/// `SignalledSources` as a plain value (with a mode table holding the records, no loop): step 4's
/// sorting fires the sources of the running mode in order, defers the others, keeps the signals
/// that wait for a change, and remembers when the deferred ones need no second look.
@Suite struct SignalledSourcesTests {
  static let other = RunLoopMode("other")

  /// A mode table holding one attached source record per entry of `orders`, in `mode`.
  static func records(_ orders: [Int], in mode: RunLoopMode, table: ModeTable) -> [MemberRecord] {
    orders.map { order in
      let record = MemberRecord()
      table.attach(record, .source(InputSource(order: order) { _ in }))
      _ = table.add(record, to: mode)
      return record
    }
  }

  static func signals(_ records: [MemberRecord], numberedFrom first: UInt64) -> [SignalledRecord] {
    records.enumerated().map { SignalledRecord(record: $1, sequence: first + UInt64($0)) }
  }

  @Test func readySourcesAreSortedByOrderThenSignallingOrder() {
    let table = ModeTable()
    let records = Self.records([2, 1, 2, 0], in: .default, table: table)
    var sources = SignalledSources()
    var inbox = Self.signals(records, numberedFrom: 1)
    sources.take(from: &inbox)
    #expect(inbox.isEmpty)
    var ready: [MemberRecord] = []
    let looked = sources.sortOut(
      for: table.contents(for: .default), sourceJoins: table.sourceJoins, barrier: .max, into: &ready)
    #expect(looked)
    #expect(ready.map { ObjectIdentifier($0) } == [3, 1, 0, 2].map { ObjectIdentifier(records[$0]) })
    #expect(!sources.hasCollected)
  }

  /// Signals sent after a change that still waits stay, in order; those sent before fire.
  @Test func signalsAfterTheBarrierWaitInOrder() {
    let table = ModeTable()
    let records = Self.records([0, 0, 0], in: .default, table: table)
    var sources = SignalledSources()
    var inbox = Self.signals(records, numberedFrom: 4)  // 4, 5, 6
    sources.take(from: &inbox)
    #expect(sources.oldestWaitingSequence == 4)
    var ready: [MemberRecord] = []
    _ = sources.sortOut(for: table.contents(for: .default), sourceJoins: table.sourceJoins, barrier: 5, into: &ready)
    #expect(ready.map { ObjectIdentifier($0) } == [ObjectIdentifier(records[0])])
    #expect(sources.collected.map(\.sequence) == [5, 6])
    #expect(sources.oldestWaitingSequence == 5)
  }

  /// Sources signalled in other modes are deferred; a pass in the same mode does not look at them
  /// again until a source joins a mode; a pass in their mode fires them.
  @Test func deferredSourcesAreSortedOutOncePerModeAndJoin() {
    let table = ModeTable()
    let elsewhere = Self.records([0], in: Self.other, table: table)
    var sources = SignalledSources()
    var inbox = Self.signals(elsewhere, numberedFrom: 1)
    sources.take(from: &inbox)
    var ready: [MemberRecord] = []
    let defaultContents = table.contents(for: .default)
    _ = sources.sortOut(for: defaultContents, sourceJoins: table.sourceJoins, barrier: .max, into: &ready)
    #expect(ready.isEmpty)
    #expect(sources.deferred.count == 1)
    #expect(sources.deferredAreElsewhere(than: defaultContents, sourceJoins: table.sourceJoins))
    let lookedAgain = sources.sortOut(
      for: defaultContents, sourceJoins: table.sourceJoins, barrier: .max, into: &ready)
    #expect(!lookedAgain)  // known to be out of this mode: O(1)
    _ = table.add(elsewhere[0], to: .default)  // joins the running mode, already signalled
    #expect(sources.hasDeferred(in: defaultContents, sourceJoins: table.sourceJoins))
    let otherContents = table.contents(for: Self.other)
    _ = sources.sortOut(for: otherContents, sourceJoins: table.sourceJoins, barrier: .max, into: &ready)
    #expect(ready.map { ObjectIdentifier($0) } == [ObjectIdentifier(elsewhere[0])])
    #expect(sources.deferred.isEmpty)
  }

  /// A source that left the loop (detached) is dropped by the sort, wherever it waited.
  @Test func detachedSourcesAreDropped() {
    let table = ModeTable()
    let records = Self.records([0, 0], in: .default, table: table)
    table.removeEverywhere(records[0])
    var sources = SignalledSources()
    var inbox = Self.signals(records, numberedFrom: 1)
    sources.take(from: &inbox)
    var ready: [MemberRecord] = []
    _ = sources.sortOut(
      for: table.contents(for: .default), sourceJoins: table.sourceJoins, barrier: .max, into: &ready)
    #expect(ready.map { ObjectIdentifier($0) } == [ObjectIdentifier(records[1])])
    #expect(!sources.hasCollected && sources.deferred.isEmpty)
  }

  /// A run nested in a handler of step 4 considers the sources that step has not fired yet, and
  /// the step continues with its own list afterwards.
  @Test func aNestedRunConsidersTheOuterStepsUnfiredSources() {
    let records = (0..<3).map { _ in MemberRecord() }
    var sources = SignalledSources()
    sources.unfired = records[1...]
    let outer = sources.beginNestedRun()
    #expect(sources.collected.map { ObjectIdentifier($0.record) } == records[1...].map { ObjectIdentifier($0) })
    #expect(sources.collected.allSatisfy { $0.sequence == 0 })  // they wait for no change
    sources.unfired = []
    sources.endNestedRun(restoring: outer)
    #expect(sources.unfired.count == 2)
  }
}
