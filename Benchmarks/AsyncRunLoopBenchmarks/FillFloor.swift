import AsyncRunLoop
import Glibc

// churn's fill floor (issue 13): what the least any loop must do per member costs as it fills
// from empty, measured the way churn measures a loop-thread fill, so that the two can be read side
// by side. Its ratio (100k over 1k) says how flat a fill can be on this machine at all; the part
// of a loop's add above it is the loop's own.

/// A minimal member: a lock in its own allocation (as a loop member's is), the record its registry
/// gives it, and a callout. 48 bytes, smaller than every loop member (168–216 bytes), so the floor
/// touches less memory per member than any of them: it flatters no kind.
private final class FloorMember: @unchecked Sendable {
  // Safety: `record` is only touched with `lock` held; `lock` and `callout` are immutable.
  let lock = FloorLock.make()
  var record: FloorRecord?
  let callout: @Sendable () -> Void

  init(callout: @escaping @Sendable () -> Void) { self.callout = callout }
}

/// A record the size of the loop's per-member record (72 bytes: an 80-byte heap block).
private final class FloorRecord {
  var slot = -1
  var member: FloorMember?
  var words: (Int, Int, Int, Int, Int) = (0, 0, 0, 0, 0)
}

/// A pthread mutex in a `ManagedBuffer` element, as the library's members hold theirs.
private final class FloorLock: ManagedBuffer<Void, pthread_mutex_t> {
  static func make() -> FloorLock {
    let lock = unsafeDowncast(FloorLock.create(minimumCapacity: 1) { _ in () }, to: FloorLock.self)
    lock.withUnsafeMutablePointerToElements { _ = pthread_mutex_init($0, nil) }
    return lock
  }

  deinit { _ = withUnsafeMutablePointerToElements { pthread_mutex_destroy($0) } }

  func withLock<Result>(_ body: () -> Result) -> Result {
    _ = withUnsafeMutablePointerToElements { pthread_mutex_lock($0) }
    defer { _ = withUnsafeMutablePointerToElements { pthread_mutex_unlock($0) } }
    return body()
  }
}

/// The registry a fill builds: a slot array with a free list (as the loop's). Loop thread only.
private final class FloorRegistry: @unchecked Sendable {
  // Safety: only touched inside `performAndWait` blocks of one loop, which run on its thread.
  var slots: [FloorRecord?] = []
  var freeSlots: [Int] = []

  /// Under the member's lock a new record is made and bound to it; then it takes a slot, holding
  /// the member.
  func add(_ member: FloorMember) {
    let record = member.lock.withLock {
      let record = FloorRecord()
      member.record = record
      return record
    }
    record.member = member
    if let free = freeSlots.popLast() {
      record.slot = free
      slots[free] = record
    } else {
      record.slot = slots.count
      slots.append(record)
    }
  }

  /// Under the member's lock its record is taken; then the slot is freed and the record drops
  /// the member.
  func remove(_ member: FloorMember) {
    guard
      let record = member.lock.withLock({ () -> FloorRecord? in
        defer { member.record = nil }
        return member.record
      })
    else { return }
    slots[record.slot] = nil
    freeSlots.append(record.slot)
    record.member = nil
  }
}

/// `FloorMember`s, handed to the loop thread whole.
private struct FloorMembers: @unchecked Sendable {
  // Safety: created on the measuring thread before the block that uses them is sent, and used
  // only by that block afterwards (the send orders the two).
  let members: [FloorMember]
}

/// One count of the fill floor: on a fresh loop (its thread allocates, as a loop's does), `count`
/// floor members are created on the measuring thread, then added on the loop thread in one block
/// (timed there, with its minor page faults and their first-touch floor, as churn's loop-thread
/// side) and removed in another. Value: ns per add; extras as churn's (`remove_ns`,
/// `add_faults_per_1k`, `add_first_touch_ns`, `add_minus_first_touch_ns`, `n`). Median of up to
/// `rounds` rounds, a discarded warm-up round for counts up to 1k.
final class FillFloorSession: FigureSession {
  private let count: Int
  private let rounds: Int
  private let cpu: Int?

  init(count: Int, rounds: Int, cpu: Int?) {
    self.count = count
    self.rounds = rounds
    self.cpu = cpu
  }

  private struct Round {
    var add = 0.0
    var remove = 0.0
    var faultsPer1k = 0.0
    var firstTouch = 0.0
  }

  func measure() -> Figure {
    if count <= 1_000 { _ = measureRound() }  // warm-up
    let measured = (0..<rounds).map { _ in measureRound() }
    func medianOf(_ value: (Round) -> Double) -> Double { median(measured.map(value)) }
    return Figure(
      value: medianOf(\.add),
      extras: [
        ("remove_ns", medianOf(\.remove)), ("add_faults_per_1k", medianOf(\.faultsPer1k)),
        ("add_first_touch_ns", medianOf(\.firstTouch)),
        ("add_minus_first_touch_ns", medianOf { $0.add - $0.firstTouch }),
        ("n", Double(count)), ("rounds", Double(measured.count)),
      ])
  }

  private func measureRound() -> Round {
    let loop = try! RunLoopThread(name: "churn-floor", cpu: cpu)
    defer { loop.shutdownAndWait() }
    let members = FloorMembers(members: (0..<count).map { _ in FloorMember {} })
    let registry = FloorRegistry()
    let perMember = Double(count)
    let (add, faults, firstTouch) = try! loop.performAndWait { () -> (Int64, Int, Double) in
      let faultsBefore = threadMinorFaults()
      let start = monotonicNanoseconds()
      for member in members.members { registry.add(member) }
      let add = monotonicNanoseconds() - start
      let faults = threadMinorFaults() - faultsBefore
      return (add, faults, firstTouchNanosecondsPerPage(pages: faults) * Double(faults))
    }
    let remove = timedOnLoop(loop) { for member in members.members { registry.remove(member) } }
    return Round(
      add: Double(add) / perMember, remove: Double(remove) / perMember,
      faultsPer1k: Double(faults) * 1_000 / perMember, firstTouch: firstTouch / perMember)
  }

  func close() {}
}
