/// The loop-thread side of one member on one loop: which of the loop's modes hold it and the
/// kind's loop-thread state (a timer's heap generation, a descriptor's epoll token). Created when
/// the loop applies the member's first `add`, dropped when it leaves its last mode. Loop thread
/// only (owned by one `ModeTable`); never shared by two loops.
///
/// Every pass reads these, so they skip dynamic exclusivity checks: they are confined to the loop
/// thread, and no access spans a callout.
final class MemberRecord {
  enum Kind {
    case source(InputSource)
    case descriptor(DescriptorSource)
    case timer(LoopTimer)
    case observer(LoopObserver)
  }

  let kind: Kind
  /// The member's identity (the key of `ModeTable.records`).
  let key: ObjectIdentifier
  /// The modes holding the member on this loop.
  @exclusivity(unchecked) var modes: [Membership] = []

  /// Timer: bumped whenever its fire date or its modes change (so a pass can tell that a callout
  /// moved or removed the timer it is firing).
  @exclusivity(unchecked) var generation: UInt64 = 0
  /// Timer: a callout of it is running (so a nested run never fires it inside its own callout).
  @exclusivity(unchecked) var isFiring = false
  /// Descriptor: the epoll token of its registration (0 when not registered).
  @exclusivity(unchecked) var token: UInt64 = 0
  /// Descriptor: whether epoll reports its events now (false while the loop runs a mode that does
  /// not hold it, or a sequence consumer asked for a pause).
  @exclusivity(unchecked) var isArmed = false
  /// Descriptor: a sequence consumer paused it (its buffer is full); the loop does not re-arm it
  /// on a mode switch until the consumer resumes it.
  @exclusivity(unchecked) var isPaused = false

  init(kind: Kind) {
    self.kind = kind
    switch kind {
    case .source(let member): key = ObjectIdentifier(member)
    case .descriptor(let member): key = ObjectIdentifier(member)
    case .timer(let member): key = ObjectIdentifier(member)
    case .observer(let member): key = ObjectIdentifier(member)
    }
  }

  /// Whether `contents` holds the member.
  @inline(__always)
  func isIn(_ contents: ModeContents) -> Bool {
    for entry in modes where entry.contents === contents { return true }
    return false
  }

  /// The member, as a `LoopMember`.
  var member: any LoopMember {
    switch kind {
    case .source(let member): return member
    case .descriptor(let member): return member
    case .timer(let member): return member
    case .observer(let member): return member
    }
  }

  /// The ordering key among members of the same kind (sources and observers: their `order`).
  var order: Int {
    switch kind {
    case .source(let member): return member.order
    case .descriptor(let member): return member.order
    case .timer: return 0
    case .observer(let member): return member.order
    }
  }
}

/// One mode holding a member: the member's slot in that mode's ordered observer list (-1 for
/// the other kinds), and a timer's entry in that mode's heap.
struct Membership {
  let contents: ModeContents
  var slot: Int
  var timerEntry: TimerEntry?
}

/// A timer's place in one mode's timer heap (one per timer and mode), so the loop can remove or
/// move it in O(log n) instead of leaving stale entries behind. Loop thread only.
final class TimerEntry: TimerHeapElement {
  /// Safety of `unowned(unsafe)`: the record owns its entries (through `modes`) and takes them out
  /// of their heaps before it drops them, so a heap never holds an entry whose record is gone.
  unowned(unsafe) let record: MemberRecord
  @exclusivity(unchecked) var heapIndex = -1

  init(record: MemberRecord) { self.record = record }

  var timer: LoopTimer {
    guard case .timer(let timer) = record.kind else { preconditionFailure("AsyncRunLoop: not a timer record") }
    return timer
  }
}
