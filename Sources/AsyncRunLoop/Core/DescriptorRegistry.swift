/// The loop's readiness registrations: by epoll token (what a wait reports) and by descriptor
/// number (which registration owns a number now). Loop thread only (a part of `LoopCore`).
///
/// Both lookups are array indexing, not hashing: a token names a slot of `slots` and the slot's
/// generation when the token was issued, and descriptor numbers are small and dense (the kernel
/// hands out the lowest free one), so `liveTokens` is indexed by the number itself. Several
/// registrations can hold one number: one whose descriptor was closed and the number reused
/// stays until its source is detached, but only the newest owns the number.
struct DescriptorRegistry {
  private struct Slot {
    var record: MemberRecord?
    /// Bumped when the slot is freed, so a token of an earlier registration (which epoll may
    /// still report: a `dup` keeps a closed descriptor's file open) never names its successor.
    var generation: UInt32 = 1
  }

  private var slots: [Slot] = []
  /// Freed slots, reused last in first out.
  private var freeSlots: [UInt32] = []
  /// The token that owns each descriptor number (0: none), indexed by the number.
  private var liveTokens: [UInt64] = []
  /// The registrations held.
  private(set) var count = 0

  var isEmpty: Bool { count == 0 }

  // A token is (generation << 32) | slot. Generations start at 1, so a token is never one of the
  // poller's own tokens (0 and 1, `EpollPoller.wakeToken` and `timerToken`).
  @inline(__always)
  private static func token(slot: UInt32, generation: UInt32) -> UInt64 {
    UInt64(generation) << 32 | UInt64(slot)
  }

  /// The token the next `insert` will return: register it with epoll first, insert after epoll
  /// accepted it.
  var nextToken: UInt64 {
    guard let slot = freeSlots.last else { return Self.token(slot: UInt32(slots.count), generation: 1) }
    return Self.token(slot: slot, generation: slots[Int(slot)].generation)
  }

  /// Holds `record` under `nextToken`, which becomes the owner of `descriptor` (a valid, so
  /// non-negative, number: epoll accepted it).
  mutating func insert(_ record: MemberRecord, descriptor: Int32) -> UInt64 {
    let token = nextToken
    if freeSlots.isEmpty {
      precondition(slots.count < Int(UInt32.max), "AsyncRunLoop: more descriptor registrations than tokens")
      slots.append(Slot(record: record))
    } else {
      slots[Int(freeSlots.removeLast())].record = record
    }
    let index = Int(descriptor)
    if index >= liveTokens.count {
      liveTokens.append(contentsOf: repeatElement(0, count: index + 1 - liveTokens.count))
    }
    liveTokens[index] = token
    count += 1
    return token
  }

  /// The registration `token` names, nil if it was removed (or is not a registration's).
  @inline(__always)
  func record(for token: UInt64) -> MemberRecord? {
    let slot = Int(truncatingIfNeeded: token & 0xFFFF_FFFF)
    guard slot < slots.count, slots[slot].generation == UInt32(truncatingIfNeeded: token >> 32) else { return nil }
    return slots[slot].record
  }

  /// The token of the registration that owns `descriptor` now, 0 if none does.
  @inline(__always)
  func liveToken(for descriptor: Int32) -> UInt64 {
    let index = Int(descriptor)
    return index >= 0 && index < liveTokens.count ? liveTokens[index] : 0
  }

  /// Whether `token` is the registration that owns `descriptor` now.
  @inline(__always)
  func owns(_ token: UInt64, _ descriptor: Int32) -> Bool { token != 0 && liveToken(for: descriptor) == token }

  /// Drops the registration `token` (held for `descriptor`). Returns whether it owned the number
  /// (then the number is free, and the caller takes it out of the epoll set).
  mutating func remove(_ token: UInt64, descriptor: Int32) -> Bool {
    let slot = Int(truncatingIfNeeded: token & 0xFFFF_FFFF)
    guard slot < slots.count, slots[slot].generation == UInt32(truncatingIfNeeded: token >> 32),
      slots[slot].record != nil
    else { return false }
    slots[slot].record = nil
    slots[slot].generation &+= 1
    if slots[slot].generation == 0 { slots[slot].generation = 1 }
    freeSlots.append(UInt32(slot))
    count -= 1
    guard owns(token, descriptor) else { return false }
    liveTokens[Int(descriptor)] = 0
    return true
  }

  /// Every registration held, with its token (in slot order).
  func forEach(_ body: (UInt64, MemberRecord) -> Void) {
    for (index, slot) in slots.enumerated() {
      if let record = slot.record { body(Self.token(slot: UInt32(index), generation: slot.generation), record) }
    }
  }

  /// The numbers some registration owns, in increasing order (for tests and diagnostics).
  var ownedDescriptors: [Int32] {
    liveTokens.indices.compactMap { liveTokens[$0] != 0 ? Int32($0) : nil }
  }
}
