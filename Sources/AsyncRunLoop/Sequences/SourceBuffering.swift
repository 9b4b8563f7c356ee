/// How a `SourceSequence` buffers elements that its consumer has not taken yet.
///
/// The count includes elements posted but not yet released by the loop and elements released but
/// not yet taken by the consumer; elements the consumer has taken into its current batch no
/// longer count.
public enum SourceBuffering: Sendable, Hashable, CustomStringConvertible {
  /// Every post is accepted.
  case unbounded
  /// At most `capacity` elements: when full, `send` suspends the producing task until there is
  /// room, `post(_:timeout:)` blocks the posting thread until there is room (or the timeout), and
  /// `post` (which never waits) answers `.full` without taking the element.
  case bounded(Int)
  /// At most `capacity` elements: when full, a new element is accepted and the oldest buffered
  /// one is dropped (`.enqueuedDroppingOldest`, counted in `droppedCount`). Dropped elements are
  /// released in batches, when the buffer compacts (once at least 64 were dropped and at least
  /// as many as it holds), so up to `max(64, capacity)` of them may stay alive meanwhile.
  case dropOldest(Int)
  /// At most `capacity` elements: when full, the new element is dropped (`.dropped`, counted in
  /// `droppedCount`).
  case dropNewest(Int)

  public var description: String {
    switch self {
    case .unbounded: return "unbounded"
    case .bounded(let capacity): return "bounded(\(capacity))"
    case .dropOldest(let capacity): return "dropOldest(\(capacity))"
    case .dropNewest(let capacity): return "dropNewest(\(capacity))"
    }
  }

  /// The capacity (`Int.max` for unbounded); traps unless it is at least 1.
  var capacity: Int {
    switch self {
    case .unbounded:
      return Int.max
    case .bounded(let capacity), .dropOldest(let capacity), .dropNewest(let capacity):
      precondition(
        capacity >= 1, "AsyncRunLoop: a SourceSequence buffer needs a capacity of at least 1, not \(capacity)")
      return capacity
    }
  }
}

/// What became of an element handed to `SourceSequence.post(_:)` or `send(_:)`.
public enum SourcePostResult: Sendable, Hashable, CustomStringConvertible {
  /// Buffered: it will be delivered exactly once, unless the consumer stops first (cancelled, or
  /// dropped its iterator), which discards what is buffered, or (with `.dropOldest`) a later post
  /// drops it as the oldest buffered element.
  case enqueued
  /// Buffered, and the oldest buffered element was dropped to make room (`.dropOldest`).
  case enqueuedDroppingOldest
  /// The buffer was full and this element was dropped (`.dropNewest`).
  case dropped
  /// The buffer was full and the element was not taken (`.bounded`): `post` never waits; `send`
  /// answers this only when its task was cancelled (before or while it waited for room),
  /// `post(_:timeout:)` only when its timeout passed first.
  case full
  /// The sequence has ended (invalidated, its consumer stopped, or its loop shut down): the
  /// element was not taken.
  case terminated

  public var description: String {
    switch self {
    case .enqueued: return "enqueued"
    case .enqueuedDroppingOldest: return "enqueuedDroppingOldest"
    case .dropped: return "dropped"
    case .full: return "full"
    case .terminated: return "terminated"
    }
  }

  /// True when the element was taken (it will be delivered unless the consumer stops, or
  /// `.dropOldest` drops it later: see `enqueued`).
  public var isEnqueued: Bool {
    switch self {
    case .enqueued, .enqueuedDroppingOldest: return true
    case .dropped, .full, .terminated: return false
    }
  }
}
