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
  let key: MemberKey
  /// Set when the record is detached (left its loop): a pass holding it can tell without a lookup.
  @exclusivity(unchecked) var isDetached = false
  /// Already out of the registry (`ModeTable.takeRecord`), on its way to `detach`.
  @exclusivity(unchecked) var isTaken = false
  /// The modes holding the member on this loop.
  @exclusivity(unchecked) var modes = MembershipList()

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
    case .source(let member): key = MemberKey(member)
    case .descriptor(let member): key = MemberKey(member)
    case .timer(let member): key = MemberKey(member)
    case .observer(let member): key = MemberKey(member)
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

/// A member's identity as a dictionary key, hashed with one multiply instead of SipHash: the keys
/// are object addresses chosen by the allocator, not by an adversary, and a lookup per add, remove
/// and fire made SipHash the largest item of the timers-100k profile.
struct MemberKey: Hashable {
  let address: UInt

  @inline(__always)
  init(_ member: AnyObject) { address = UInt(bitPattern: Unmanaged.passUnretained(member).toOpaque()) }

  @inline(__always)
  static func == (lhs: MemberKey, rhs: MemberKey) -> Bool { lhs.address == rhs.address }

  func hash(into hasher: inout Hasher) { hasher.combine(address) }

  /// Fibonacci hashing of the address (its low bits are alignment zeros; the multiply spreads the
  /// high ones down). The seed keeps distinct dictionaries' orders apart, as the protocol expects.
  @inline(__always)
  func _rawHashValue(seed: Int) -> Int {
    Int(bitPattern: (address ^ UInt(bitPattern: seed)) &* 0x9E37_79B9_7F4A_7C15)
  }
}

/// One mode holding a member: the member's slot in that mode's ordered observer list (-1 for
/// the other kinds), and a timer's entry in that mode's heap.
struct Membership {
  let contents: ModeContents
  var slot: Int
  var timerEntry: TimerEntry?
}

/// The modes holding one member: nearly always one, so the first is stored inline (no allocation
/// per member), the others in an array.
struct MembershipList: RandomAccessCollection {
  private var head: Membership?
  private var tail: [Membership] = []

  var startIndex: Int { 0 }
  var endIndex: Int { head == nil ? 0 : 1 + tail.count }

  subscript(position: Int) -> Membership {
    get { position == 0 ? head.unsafelyUnwrapped : tail[position - 1] }
    set {
      if position == 0 { head = newValue } else { tail[position - 1] = newValue }
    }
  }

  mutating func append(_ membership: Membership) {
    if head == nil { head = membership } else { tail.append(membership) }
  }

  mutating func remove(at position: Int) {
    if position == 0 {
      head = tail.isEmpty ? nil : tail.removeFirst()
    } else {
      tail.remove(at: position - 1)
    }
  }
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
