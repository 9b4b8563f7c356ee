/// The loop-thread side of one member on one loop: which of the loop's modes hold it and the
/// kind's loop-thread state (a timer's heap entries, a descriptor's epoll token).
///
/// The member's binding creates it (on the thread that adds the member, under the member's lock)
/// when the member joins a loop, and every change sent to that loop for the member carries it, so
/// the loop never looks a member up: no table keyed by member, no hashing per add, remove or fire.
/// From then on only that loop's thread touches its fields (the inbox's lock hands it over).
/// Never shared by two loops: a member that moves gets a new record for the new loop.
///
/// Ownership: while attached (in the loop's registry), the record holds its member strongly, so a
/// member in a mode stays alive with the loop, as in CF; detaching drops that reference, so the
/// member's binding, which holds the record, forms no cycle with it once the member left its loop.
///
/// A timer's record doubles as its entry in the heap of its first mode (`TimerEntry`): one
/// allocation per timer instead of two; a timer in more modes gets an entry object for each other.
///
/// Every pass reads these, so they skip dynamic exclusivity checks: they are confined to the loop
/// thread, and no access spans a callout.
final class MemberRecord: TimerEntry {
  enum Kind {
    case source(InputSource)
    /// With its registration's state, which only descriptors need (kept out of every record).
    case descriptor(DescriptorRegistration)
    case timer(LoopTimer)
    case observer(LoopObserver)
  }

  // Field order and widths keep the object at 72 bytes (an 80-byte heap block, down from 160):
  // one is allocated per member, and filling a loop with 100k members touches that much fresh
  // memory, whose page faults were most of what an add cost at 100k. The flags and the kind's tag
  // fill the gap after the inherited 32-bit heap slot, the two 32-bit numbers the next eight bytes.

  /// Which case the member is (`Kind` without its payload).
  enum KindTag: UInt8 {
    case source, descriptor, timer, observer
  }

  /// Timer: a callout of it is running (so a nested run never fires it inside its own callout).
  @exclusivity(unchecked) var isFiring = false
  /// Left its loop (detached) once: final. A record stands for one stay of its member on its
  /// loop (the binding makes a new one each time the member joins a loop), so an add still on its
  /// way with this record (made before the member was invalidated, or removed and re-added) is
  /// stale and must not attach it again.
  @exclusivity(unchecked) private(set) var hasLeft = false
  @exclusivity(unchecked) private var kindTag = KindTag.source
  /// The record's slot in `ModeTable`'s registry while attached; -1 when not attached.
  @exclusivity(unchecked) private var storedRegistrySlot: Int32 = -1
  /// Nonzero while the member is in `.common`: the order it was added there in (a mode joining
  /// the common set later receives the common members in that order). `ModeTable` renumbers the
  /// common members before the count wraps.
  @exclusivity(unchecked) var commonOrder: UInt32 = 0
  /// The member (a descriptor's `DescriptorRegistration`), while the record is attached to its
  /// loop; nil before and after. A plain reference and a tag rather than a stored `Kind?`: an enum
  /// with payloads keeps its case in the pointer's spare bits, which hides the pointer from
  /// LeakSanitizer (a member the main loop holds until the process exits read as leaked).
  @exclusivity(unchecked) private var attachedMember: AnyObject?
  /// The modes holding the member on this loop.
  @exclusivity(unchecked) var modes = MembershipList()

  /// The record's slot in `ModeTable`'s registry while attached; -1 when not attached.
  @inline(__always)
  var registrySlot: Int {
    get { Int(storedRegistrySlot) }
    set { storedRegistrySlot = Int32(newValue) }  // traps past 2^31 members, which no memory holds
  }

  /// Descriptor: its registration (nil for the other kinds, and once detached).
  @inline(__always)
  var registration: DescriptorRegistration? { attached(.descriptor, as: DescriptorRegistration.self) }

  // The registration's state, through the record (defaults for the other kinds and once detached;
  // setting them on those is a no-op). See `DescriptorRegistration`.
  var token: UInt64 {
    get { registration?.token ?? 0 }
    set { registration?.token = newValue }
  }
  var isArmed: Bool {
    get { registration?.isArmed ?? false }
    set { registration?.isArmed = newValue }
  }
  var file: FileIdentity? {
    get { registration?.file }
    set { registration?.file = newValue }
  }
  var isPaused: Bool {
    get { registration?.isPaused ?? false }
    set { registration?.isPaused = newValue }
  }
  /// Descriptor: the registration can never report its own file again (the descriptor was
  /// closed, its number reused): never armed again.
  @inline(__always)
  func markRegistrationLost() {
    isArmed = false
    file = nil
  }

  /// An empty record, not attached. Any thread (the binding makes it, under the member's lock).
  override init() {}

  /// The record itself is its timer's entry in its first mode.
  override var record: MemberRecord { self }

  /// Whether the record is on its loop (attached and not detached since).
  @inline(__always)
  var isAttached: Bool { registrySlot >= 0 }
  /// Not on its loop (never attached, or detached since): a pass holding it can tell without a
  /// lookup.
  @inline(__always)
  var isDetached: Bool { registrySlot < 0 }

  /// Loop thread (`ModeTable.attach`): the record joins its loop, holding `kind`'s member.
  func attach(_ kind: Kind, slot: Int) {
    switch kind {
    case .source(let member): (attachedMember, kindTag) = (member, .source)
    case .descriptor(let registration): (attachedMember, kindTag) = (registration, .descriptor)
    case .timer(let member): (attachedMember, kindTag) = (member, .timer)
    case .observer(let member): (attachedMember, kindTag) = (member, .observer)
    }
    registrySlot = slot
  }

  /// The kind of member while attached, without the member (nil before and after): for the
  /// paths that only branch on it, which need not build a `Kind` (and retain its payload).
  @inline(__always)
  var attachedKind: KindTag? { attachedMember == nil ? nil : kindTag }

  /// The timer, while this is an attached timer's record.
  @inline(__always)
  var attachedTimer: LoopTimer? { attached(.timer, as: LoopTimer.self) }

  /// The observer, while this is an attached observer's record.
  @inline(__always)
  var attachedObserver: LoopObserver? { attached(.observer, as: LoopObserver.self) }

  /// The attached member as `type` when it is of kind `tag` (the hot paths' accessors: no `Kind`
  /// is built).
  @inline(__always)
  private func attached<Member: AnyObject>(_ tag: KindTag, as type: Member.Type) -> Member? {
    guard kindTag == tag, let member = attachedMember else { return nil }
    return unsafeDowncast(member, to: type)
  }

  /// The member, while the record is attached to its loop; nil before and after.
  @inline(__always)
  var kind: Kind? {
    guard let member = attachedMember else { return nil }
    switch kindTag {
    case .source: return .source(unsafeDowncast(member, to: InputSource.self))
    case .descriptor: return .descriptor(unsafeDowncast(member, to: DescriptorRegistration.self))
    case .timer: return .timer(unsafeDowncast(member, to: LoopTimer.self))
    case .observer: return .observer(unsafeDowncast(member, to: LoopObserver.self))
    }
  }

  /// The record's identity as a dictionary key (one record per member and loop: it names the
  /// member there).
  @inline(__always)
  var key: MemberKey { MemberKey(self) }

  /// Loop thread (`ModeTable.removeEverywhere`): the record left its loop; drops the member.
  func markDetached() {
    hasLeft = true
    registrySlot = -1
    commonOrder = 0
    attachedMember = nil
  }

  /// How the record is in `contents`' mode (nil when it is not): what a callout there checks
  /// against the member's binding (`MemberBinding.keeps`).
  @inline(__always)
  func claim(in contents: ModeContents) -> ModeClaim? { modes.claim(in: contents) }

  /// Whether `contents` holds the member.
  @inline(__always)
  func isIn(_ contents: ModeContents) -> Bool { modes.claim(in: contents) != nil }

  /// An observer's slot in `contents` (see `ModeContents.insertObserver`), nil when not in it.
  func observerSlot(in contents: ModeContents) -> Int? {
    for entry in modes where entry.contents === contents { return entry.slot }
    return nil
  }

  /// The member, as a `LoopMember` (nil when not attached).
  var member: (any LoopMember)? {
    switch kind {
    case .source(let member): return member
    case .descriptor(let registration): return registration.source
    case .timer(let member): return member
    case .observer(let member): return member
    case nil: return nil
    }
  }

  /// The custom source, when this is an attached source's record.
  @inline(__always)
  var source: InputSource? { attached(.source, as: InputSource.self) }

  /// The ordering key among members of the same kind (sources and observers: their `order`).
  var order: Int {
    switch kind {
    case .source(let member): return member.order
    case .descriptor(let registration): return registration.source.order
    case .observer(let member): return member.order
    case .timer, nil: return 0
    }
  }
}

/// An attached readiness source and the state of its epoll registration on the loop (the
/// payload of its record's kind, so that the other kinds' records do not carry these fields).
/// Loop thread only.
final class DescriptorRegistration {
  let source: DescriptorSource
  /// The epoll token of the registration (0 once deregistered).
  @exclusivity(unchecked) var token: UInt64 = 0
  /// Whether epoll reports its events now (false while the loop runs a mode that does not hold
  /// it, or a sequence consumer asked for a pause).
  @exclusivity(unchecked) var isArmed = false
  /// A sequence consumer paused it (its buffer is full); the loop does not re-arm it on a mode
  /// switch until the consumer resumes it.
  @exclusivity(unchecked) var isPaused = false
  /// While silenced: the file its descriptor referred to when it was taken out of the epoll set
  /// (nil: the registration was gone already, its descriptor closed). Out of the set, only this
  /// tells, when it is re-armed or another source claims the same number, whether the number
  /// still names that file.
  @exclusivity(unchecked) var file: FileIdentity?
  /// Its index in the loop's list of silenced registrations (`LoopDescriptors.silenced`)
  /// while listed there; -1 when not listed.
  @exclusivity(unchecked) var silencedIndex = -1

  init(_ source: DescriptorSource) { self.source = source }
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
/// the other kinds), and a timer's entry in that mode's heap: the record itself
/// (`usesRecordEntry`, at most one membership per record) or an entry object of its own.
/// A mode the loop holds a record in, as a callout there checks it against the member's binding
/// (`MemberBinding.keeps`): its name, and whether it is in the common set (then a member added to
/// `.common` is in it too). Only the mode counts, not the way the loop holds the record there: a
/// member re-added by the other way (by name instead of through `.common`, say) behind a burst is
/// still in the mode, though the loop has not applied that add yet. A pure value.
struct ModeClaim {
  let mode: RunLoopMode
  let modeIsCommon: Bool

  @inline(__always)
  init(_ contents: ModeContents) {
    mode = contents.mode
    modeIsCommon = contents.isInCommonSet
  }
}

struct Membership {
  let contents: ModeContents
  /// 32 bits, with the flags after it, keep a membership at 24 bytes (one is inline in every
  /// record).
  private var storedSlot: Int32
  /// Added to this mode by its name.
  var byName: Bool
  /// Added to this mode through `.common` (the mode is in the common set).
  var viaCommon: Bool
  var usesRecordEntry = false
  var extraEntry: ExtraTimerEntry?

  init(contents: ModeContents, slot: Int, byName: Bool, viaCommon: Bool) {
    self.contents = contents
    storedSlot = Int32(slot)
    self.byName = byName
    self.viaCommon = viaCommon
  }

  /// The observer's slot in the mode's list (-1 for the other kinds).
  @inline(__always)
  var slot: Int {
    get { Int(storedSlot) }
    set { storedSlot = Int32(newValue) }
  }

  /// A timer's entry for this mode (nil for the other kinds).
  @inline(__always)
  func timerEntry(of record: MemberRecord) -> TimerEntry? { usesRecordEntry ? record : extraEntry }
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

  /// The claim of the membership in `contents`, or nil when there is none: read in place
  /// (iterating copies each membership, retaining its references, on every callout).
  @inline(__always)
  func claim(in contents: ModeContents) -> ModeClaim? {
    if head?.contents === contents { return ModeClaim(contents) }
    for index in tail.indices where tail[index].contents === contents { return ModeClaim(contents) }
    return nil
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
/// move it in O(log n) instead of leaving stale entries behind. Loop thread only. Abstract: a
/// `MemberRecord` is its timer's entry in its first mode, an `ExtraTimerEntry` one in each other
/// mode.
class TimerEntry: TimerHeapElement {
  /// 32 bits, so that a record's own fields start right after it (see `MemberRecord`).
  @exclusivity(unchecked) private final var storedHeapSlot: Int32 = -1

  @inline(__always)
  final var heapSlot: Int {
    get { Int(storedHeapSlot) }
    set { storedHeapSlot = Int32(newValue) }  // traps past 2^31 timers in one heap
  }

  /// The record this entry belongs to (overridden by both kinds of entry).
  var record: MemberRecord { preconditionFailure("AsyncRunLoop: TimerEntry is abstract") }

  /// The timer (the entry is in a heap only while its record is attached).
  final var timer: LoopTimer {
    guard let timer = record.attachedTimer else { preconditionFailure("AsyncRunLoop: not a timer record") }
    return timer
  }
}

/// A timer's entry in a mode other than its first (see `Membership.extraEntry`).
final class ExtraTimerEntry: TimerEntry {
  /// Safety of `unowned(unsafe)`: the record owns its extra entries (through `modes`) and takes
  /// them out of their heaps before it drops them, so a heap never holds an entry whose record is
  /// gone.
  private unowned(unsafe) let owner: MemberRecord

  init(record: MemberRecord) { owner = record }

  override var record: MemberRecord { owner }
}
