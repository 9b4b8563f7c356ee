import Glibc

/// A producer of a `SourceSequence` waiting for room in its `.bounded` buffer: an async task
/// (`send`) or a plain thread (`post(_:timeout:)`). The state machine keeps both in one queue,
/// oldest first; whoever takes one out resumes it, after releasing the sequence's lock.
@usableFromInline
enum SourceProducer: Sendable {
  /// A task suspended in `send(_:)`.
  case task(UnsafeContinuation<SourcePostResult, Never>)
  /// A thread blocked in `post(_:timeout:)`.
  case thread(BlockedPoster)

  /// Tells the producer what became of its element. Exactly once per producer.
  @inlinable
  func resume(returning result: SourcePostResult) {
    switch self {
    case .task(let continuation): continuation.resume(returning: result)
    case .thread(let poster): poster.finish(result)
    }
  }
}

/// A thread blocked in `SourceSequence.post(_:timeout:)`: it waits on a condition until a
/// consumer, `invalidate()` or the loop's shutdown hands it its answer, or its deadline passes.
/// `finish` from any thread; `wait` only by the posting thread.
@usableFromInline
final class BlockedPoster: @unchecked Sendable {  // Safety: proof below
  // Safety: `result` is only read or written with `lock` held; `condition` is only touched through
  // pthread_cond_* calls (thread-safe), and both live as long as the object. The posting thread
  // and the thread that finishes it each hold a reference, so the condition outlives the signal.
  private let lock = PthreadLock.make()
  private let condition: UnsafeMutablePointer<pthread_cond_t>
  private var result: SourcePostResult?

  init() {
    condition = .allocate(capacity: 1)
    var attributes = pthread_condattr_t()
    pthread_condattr_init(&attributes)
    pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)  // deadlines do not move with the wall clock
    pthread_cond_init(condition, &attributes)
    pthread_condattr_destroy(&attributes)
  }

  deinit {
    pthread_cond_destroy(condition)
    condition.deallocate()
  }

  /// Hands the poster its answer and wakes it. Any thread; once.
  @usableFromInline
  func finish(_ result: SourcePostResult) {
    lock.withLock { self.result = result }
    pthread_cond_signal(condition)
  }

  /// Blocks until `finish` or, when given, until `deadline` (CLOCK_MONOTONIC) passes: nil then.
  func wait(until deadline: timespec?) -> SourcePostResult? {
    lock.lock()
    defer { lock.unlock() }
    while result == nil {
      if let deadline {
        guard lock.wait(on: condition, until: deadline) else { return result }  // timed out
      } else {
        lock.wait(on: condition)
      }
    }
    return result
  }

  /// The CLOCK_MONOTONIC time `timeout` from now; a negative timeout is now, a huge one
  /// saturates (at thousands of years) instead of overflowing.
  static func deadline(after timeout: Duration) -> timespec {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    guard timeout > .zero else { return now }
    let (seconds, attoseconds) = timeout.components
    let cappedSeconds = min(seconds, Int64(Int32.max) * 64)
    let nanoseconds = Int(now.tv_nsec) + Int(attoseconds / 1_000_000_000)
    var deadline = timespec()
    deadline.tv_sec = now.tv_sec + Int(cappedSeconds) + nanoseconds / 1_000_000_000
    deadline.tv_nsec = nanoseconds % 1_000_000_000
    return deadline
  }
}

extension SourceSequence {
  /// Buffers `element`, blocking the calling thread while a `.bounded` buffer is full: until the
  /// consumer makes room, `timeout` passes, or the sequence ends. For plain threads and C
  /// callbacks that must not lose an element and cannot await `send(_:)`. With other buffering it
  /// never blocks and answers as `post(_:)`. Producers that wait, blocked or suspended in `send`,
  /// are admitted oldest first.
  ///
  /// **Never on the loop's own thread, never from async code.** The loop thread is what moves
  /// posted elements to the consumer (and may be the consumer's executor): blocking it would wait
  /// for itself. A task blocking its thread can hold the very thread its consumer needs; async
  /// code calls `send(_:)`. Both are refused with an error instead of blocking. (Blocking another
  /// loop's thread is allowed but stalls that loop: do it only when its consumer runs elsewhere.)
  /// - Parameters:
  ///   - element: The element to buffer.
  ///   - timeout: How long to wait for room at most; `.zero` waits not at all (as `post(_:)`).
  /// - Returns: `.enqueued` once the element was taken (at once, or when the consumer made room);
  ///   `.full` when `timeout` passed first (the element was not taken); `.terminated` when the
  ///   sequence ended first (invalidated, its consumer stopped, its loop shut down: the element
  ///   was not taken); `.enqueuedDroppingOldest` or `.dropped` for dropping buffers, as `post(_:)`.
  /// - Throws: `RunLoopError.wouldDeadlock`, without taking the element, when called on the
  ///   sequence's loop thread or from a task.
  public func post(_ element: Element, timeout: Duration) throws(RunLoopError) -> SourcePostResult {
    if loop.isOnLoopThread {
      throw RunLoopError.wouldDeadlock(
        "post(_:timeout:) on the thread of loop '\(loop.name)', which would have to release the buffer it waits for")
    }
    if withUnsafeCurrentTask(body: { $0 != nil }) {
      throw RunLoopError.wouldDeadlock(
        "post(_:timeout:) from a task would block a thread the consumer may need: await send(_:) instead")
    }
    let first = post(element)
    guard first == .full else { return first }
    let poster = BlockedPoster()
    lock.lock()
    let id = machine.makeProducerID()
    let action = machine.suspendProducer(id: id, element: element, continuation: .thread(poster), isCancelled: false)
    lock.unlock()
    switch action {
    case .resume(let result, let signalSource):
      if signalSource { source.signal() }
      return result
    case .suspended:
      break
    }
    if let result = poster.wait(until: BlockedPoster.deadline(after: timeout)) { return result }
    // Timed out: leave the queue, unless whoever took the poster out is about to answer it.
    lock.lock()
    let cancel = machine.cancelProducer(id: id)
    lock.unlock()
    switch cancel {
    case .resume:
      return .full  // left the queue untaken
    case .none:
      return poster.wait(until: nil) ?? .full  // already taken out: its answer is on the way
    }
  }
}
