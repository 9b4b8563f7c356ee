/// A weak reference to a sequence, captured by the routines of the loop member the sequence owns
/// (source, timer, descriptor source, observer). The member lives in its loop's modes; holding the
/// sequence weakly means dropping the sequence (and its iterator) frees it, and its `deinit`
/// invalidates the member.
@usableFromInline
final class WeakOwner<Owner: AnyObject>: @unchecked Sendable {  // Safety: proof below
  // Safety: `value` is written once, in the owner's initializer, before the member is added to a
  // loop (the add goes through the loop's inbox lock, which orders the write before every read
  // on the loop thread); afterwards it is only read. The runtime zeroes weak references
  // atomically when the owner is freed. No dynamic exclusivity checks (a thread-local lookup on
  // every fire, in the client that inlines the member's routines): no write overlaps a read.
  @exclusivity(unchecked) @usableFromInline weak var value: Owner?

  @usableFromInline
  init() {}
}
