import Testing

@testable import AsyncRunLoop

/// The loop's descriptor registry as a plain value: tokens, the owner of each number, and what
/// an earlier registration's token names once its slot is reused.
@Suite("DescriptorRegistry")
struct DescriptorRegistryTests {
  @Test func aTokenNamesItsRecordAndItsNumberUntilRemoved() {
    var registry = DescriptorRegistry()
    let record = MemberRecord()
    let announced = registry.nextToken
    let token = registry.insert(record, descriptor: 7)
    #expect(token == announced)
    #expect(token > EpollPoller.timerToken && token != EpollPoller.wakeToken)
    #expect(registry.record(for: token) === record)
    #expect(registry.owns(token, 7) && !registry.owns(token, 6) && !registry.owns(token, 8))
    #expect(registry.liveToken(for: 7) == token && registry.liveToken(for: 100) == 0)
    #expect(registry.liveToken(for: -1) == 0)
    #expect(registry.count == 1 && registry.ownedDescriptors == [7])
    let owned = registry.remove(token, descriptor: 7)
    #expect(owned)
    #expect(registry.record(for: token) == nil && registry.liveToken(for: 7) == 0)
    #expect(registry.isEmpty && registry.ownedDescriptors.isEmpty)
    let again = registry.remove(token, descriptor: 7)
    #expect(!again, "a second removal finds nothing")
  }

  /// A number closed and reused: the newer registration owns it; the older one keeps its record
  /// (its source is still attached) but, removed, frees nothing the newer one holds.
  @Test func aNewerRegistrationOfANumberOwnsItAndTheOlderOneLetsGoOfNothing() {
    var registry = DescriptorRegistry()
    let old = MemberRecord()
    let new = MemberRecord()
    let oldToken = registry.insert(old, descriptor: 3)
    let newToken = registry.insert(new, descriptor: 3)
    #expect(oldToken != newToken)
    #expect(registry.record(for: oldToken) === old && registry.record(for: newToken) === new)
    #expect(!registry.owns(oldToken, 3) && registry.owns(newToken, 3))
    let oldOwned = registry.remove(oldToken, descriptor: 3)
    #expect(!oldOwned, "the older one did not own the number")
    #expect(registry.owns(newToken, 3) && registry.count == 1)
    let newOwned = registry.remove(newToken, descriptor: 3)
    #expect(newOwned)
    #expect(registry.isEmpty)
  }

  /// A freed slot is reused under a new generation: what epoll may still report for the old
  /// token (a `dup` keeps a closed descriptor's file open) names no registration.
  @Test func aReusedSlotsOldTokenNamesNothing() {
    var registry = DescriptorRegistry()
    let first = registry.insert(MemberRecord(), descriptor: 4)
    let firstOwned = registry.remove(first, descriptor: 4)
    #expect(firstOwned)
    let second = MemberRecord()
    let reused = registry.insert(second, descriptor: 4)
    #expect(reused != first && reused & 0xFFFF_FFFF == first & 0xFFFF_FFFF, "the same slot, a new generation")
    #expect(registry.record(for: first) == nil && registry.record(for: reused) === second)
    #expect(!registry.owns(first, 4) && registry.owns(reused, 4))
    let stale = registry.remove(first, descriptor: 4)
    #expect(!stale && registry.count == 1, "the old token removes nothing")
  }

  /// Many registrations added and removed in a scrambled order against a dictionary model:
  /// lookups by token and by number agree with it after every step, and every token is distinct.
  @Test func scrambledChurnAgreesWithAModel() {
    var registry = DescriptorRegistry()
    var model: [UInt64: (record: MemberRecord, descriptor: Int32)] = [:]
    var owner: [Int32: UInt64] = [:]
    var issued: Set<UInt64> = []
    var random = IndexedTimerHeapTests.SplitMix64(state: 13)
    for step in 0..<4_000 {
      if model.isEmpty || random.next() % 3 != 0 {
        let descriptor = Int32(random.next() % 200)
        let record = MemberRecord()
        let token = registry.insert(record, descriptor: descriptor)
        #expect(issued.insert(token).inserted, "step \(step): token \(token) issued twice")
        model[token] = (record, descriptor)
        owner[descriptor] = token
      } else {
        let token = model.keys.sorted()[Int(random.next() % UInt64(model.count))]
        let descriptor = model[token]!.descriptor
        let owned = registry.remove(token, descriptor: descriptor)
        #expect(owned == (owner[descriptor] == token), "step \(step)")
        if owned { owner[descriptor] = nil }
        model[token] = nil
      }
      #expect(registry.count == model.count)
    }
    for (token, entry) in model { #expect(registry.record(for: token) === entry.record) }
    for descriptor in Int32(0)..<200 { #expect(registry.liveToken(for: descriptor) == (owner[descriptor] ?? 0)) }
    #expect(registry.ownedDescriptors == owner.keys.sorted())
    var visited = 0
    registry.forEach { token, record in
      visited += 1
      #expect(model[token]?.record === record)
    }
    #expect(visited == model.count)
  }
}
