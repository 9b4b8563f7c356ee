/// The loop's readiness registrations and what it knows about their state in epoll. Loop thread
/// only (a part of `LoopCore`; the epoll calls themselves are `LoopCore`'s, in
/// `LoopPass+Readiness`).
///
/// Invariants:
/// - `registry` holds every registration by token and names the one that owns each descriptor
///   number (see `DescriptorRegistry`).
/// - `armedMode` is the mode whose registrations are armed in epoll; nil forces the next pass to
///   arm its mode again. Registrations of other modes are silenced lazily, when they report.
/// - `silenced` lists exactly the attached registrations taken out of the epoll set (silenced in a
///   mode that does not hold them, or paused), each knowing its index here
///   (`DescriptorRegistration.silencedIndex`, -1 when not listed). A mode switch looks at these
///   only, so running a nested mode costs the same with 20k descriptors on the loop as with none.
/// - Unknown tokens: a token a wait reports that names no registration (or a silenced one) is
///   noted for one more wait. A registration removed by an earlier handler of the same wait shows
///   up once; one epoll keeps for a closed number (a `dup` keeps the file open) shows up in every
///   wait while ready, and its second sighting sets `needsPurge`: the loop rebuilds its epoll set
///   after the wait.
struct LoopDescriptors {
  /// Readiness registrations by epoll token, and the owner of each descriptor number.
  var registry = DescriptorRegistry()
  private(set) var armedMode: RunLoopMode?
  private(set) var silenced: [MemberRecord] = []
  private var unknownTokensLastWait: Set<UInt64> = []
  private var unknownTokensThisWait: Set<UInt64> = []
  /// A wait reported a registration that must go: rebuild the epoll set after the wait.
  private(set) var needsPurge = false

  /// The registrations held.
  var count: Int { registry.count }

  @inline(__always)
  var isEmpty: Bool { registry.isEmpty }

  /// A pass in `mode` begins: true when `mode`'s registrations must be armed (the mode armed last
  /// was another); `mode` is the armed one from now on.
  @inline(__always)
  mutating func switchArmedMode(to mode: RunLoopMode) -> Bool {
    guard armedMode != mode else { return false }
    armedMode = mode
    return true
  }

  /// A registration may have to be armed in the running mode (a silenced one joined it, or a mode
  /// joined the common set): the next pass arms its mode again.
  @inline(__always)
  mutating func forgetArmedMode() { armedMode = nil }

  /// Lists a registration that left the epoll set (a no-op when it is listed already).
  mutating func listSilenced(_ record: MemberRecord, _ registration: DescriptorRegistration) {
    guard registration.silencedIndex < 0 else { return }
    registration.silencedIndex = silenced.count
    silenced.append(record)
  }

  /// Takes a registration off the silenced list (a no-op when it is not listed): it is armed
  /// again, can never be armed again, or is detached. O(1): the last entry takes its place.
  mutating func unlistSilenced(_ registration: DescriptorRegistration) {
    let index = registration.silencedIndex
    guard index >= 0 else { return }
    registration.silencedIndex = -1
    let last = silenced.removeLast()
    guard index < silenced.count else { return }  // it was the last
    silenced[index] = last
    last.registration?.silencedIndex = index  // (listed entries are attached: detaching unlists)
  }

  /// A wait reported `token`, which names no registration or a silenced one (see the type's
  /// comment).
  mutating func noteUnknownToken(_ token: UInt64) {
    if unknownTokensLastWait.contains(token) { needsPurge = true }
    unknownTokensThisWait.insert(token)
  }

  /// A wait reported a registration that must go at once (its number belongs to a newer one).
  mutating func requestPurge() { needsPurge = true }

  /// After a wait (and after the purge, if one was needed): this wait's unknown tokens become the
  /// last wait's. Free unless a wait reported one.
  @inline(__always)
  mutating func endWait() {
    guard !unknownTokensThisWait.isEmpty || !unknownTokensLastWait.isEmpty else { return }
    swap(&unknownTokensLastWait, &unknownTokensThisWait)
    unknownTokensThisWait.removeAll(keepingCapacity: true)
  }

  /// The epoll set is being rebuilt: what was noted about the old one is forgotten.
  mutating func beginPurge() {
    needsPurge = false
    unknownTokensLastWait.removeAll()
    unknownTokensThisWait.removeAll()
  }
}
