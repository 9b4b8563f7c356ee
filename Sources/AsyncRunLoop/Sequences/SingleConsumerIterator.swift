/// The iterator of this module's async sequences (`SourceSequence`, `SignalSequence`,
/// `TimerSequence`, `ReadinessSequence`, `ActivitySequence`; each names it `Iterator`). It belongs
/// to the sequence's single consumer. Not `Sendable`: iterate from one task.
///
/// It takes everything the sequence has ready in one go into a local batch, hands elements out from
/// there without a lock, and suspends only when that batch is empty. Dropping it (`break` out of
/// `for await`) stops the consumption, as does cancelling the consuming task.
///
/// Use one iterator, not copies of it: as with any Swift iterator, advancing one copy invalidates
/// the others. A copy holds its own copy of the batch, so it would hand out again the elements
/// of that batch that another copy already delivered.
public struct SingleConsumerIterator<Base: AsyncSequence>: AsyncIteratorProtocol {
  public typealias Element = Base.Element
  /// The sequence's `nextBatch`, made where the sequence's type is known (for `SourceSequence`,
  /// in the client: it is then specialized for the element type).
  /// Runs in the caller's isolation, as `next` does (see there).
  @usableFromInline typealias NextBatch = nonisolated(nonsending) (inout ElementBatch<Element>) async -> Element?

  @usableFromInline let lifetime: ConsumerLifetime
  @usableFromInline let nextBatch: NextBatch
  /// The batch taken from the sequence; elements are handed out from here without a lock.
  @usableFromInline var batch = ElementBatch<Element>()

  @usableFromInline
  init(_ storage: any StoppableConsumption, nextBatch: @escaping NextBatch) {
    lifetime = ConsumerLifetime(storage)
    self.nextBatch = nextBatch
  }

  /// The next element, or nil once the sequence has ended or the task was cancelled. Call it from
  /// the consuming task, in any isolation: it runs in the caller's isolation, and a suspension for
  /// the next batch resumes there.
  ///
  /// `nonisolated(nonsending)`, and `actor` is not used: an `isolated` parameter would make the
  /// compiler hop to it on entry and hop back to the caller's actor after the return — for a
  /// `for await` in an actor, two executor switches per element, even when the element comes from
  /// the local batch. The runtime reads the task's executor preference at each switch, which for a
  /// task started with `Task(executorPreference:)` takes the task's status-record lock, and a task
  /// that prefers another executor than its actor's loop even re-enqueues itself at each switch.
  /// Running in the caller's isolation needs no switch until the batch runs out (Swift 6.3; see
  /// Benchmarks/results/analysis-preference-and-futex.md). `for await` passes its own isolation, so
  /// the two agree.
  ///
  /// `@inlinable`: the per-element path is specialized for the element type in the caller.
  @inlinable
  nonisolated(nonsending) public mutating func next(isolation actor: (any Actor)? = #isolation) async -> Element? {
    if let element = batch.popFirst(), !Task.isCancelled { return element }
    return await nextBatch(&batch)
  }

  /// The next element, or nil once the sequence has ended or the task was cancelled. Runs in the
  /// caller's isolation, as `next(isolation:)` (an actor that calls `next()` itself does not leave
  /// its executor for it).
  @inlinable
  nonisolated(nonsending) public mutating func next() async -> Element? {
    await next(isolation: nil)
  }
}

/// A sequence class whose cross-thread state is a `SingleConsumerStateMachine` under a
/// `PthreadLock`: the consumer side (`nextBatch`, `stopConsuming`, `makeSingleConsumerIterator`)
/// and the member's end (`memberEnded`) are implemented once, below. Each sequence supplies the
/// side effects that are its own, which run after the lock is released.
@usableFromInline
protocol SingleConsumerStorage: StoppableConsumption {
  associatedtype Element
  associatedtype Machine: SingleConsumerStateMachine
  where Machine.Element == Element, Machine.Consumer == UnsafeContinuation<Void, Never>

  /// Guards `machine`.
  var lock: PthreadLock { get }
  /// Only touched with `lock` held. Conformers declare it `@exclusivity(unchecked)`: the
  /// per-element paths are inlined into the client, where whole-module optimization cannot drop
  /// the dynamic checks, and each check is a thread-local lookup. No access can overlap another:
  /// each is one call of the pure state machine under the lock, which never reaches `machine`
  /// again and releases no element (what it drops goes out through its results, freed after the
  /// lock is released).
  var machine: Machine { get set }

  /// After the consumer took a batch (the consumer's task, lock released).
  func tookElements(_ effect: Machine.TakeEffect)
  /// Resumes or releases what the machine handed back (any thread, lock released).
  func dispose(_ leftovers: Machine.Leftovers)
  /// The consumer stopped while the member was still on its loop: take it off (any thread).
  func detachMember()
  /// The consumer found nothing to take: when it runs in one of the member's loop's jobs and the
  /// loop has nothing else to do before it would fire the member (see `LoopCore+EarlyFire`), fires
  /// it now and returns true (what was posted meanwhile is then there to take); otherwise false,
  /// and the consumer suspends. Consumer's task, lock released.
  func fireEarly() -> Bool
}

extension SingleConsumerStorage {
  /// Members that only the loop fires (timers, descriptors, observers): the consumer waits.
  @inlinable
  func fireEarly() -> Bool { false }
}

extension SingleConsumerStorage where Machine.TakeEffect == Void {
  @inlinable
  func tookElements(_ effect: Void) {}
}

extension SingleConsumerStorage where Machine.Leftovers == Void {
  @usableFromInline
  func dispose(_ leftovers: Void) {}
}

extension SingleConsumerStorage {
  /// The consumer's batch ran out: takes the next batch, suspending until there is one. Returns
  /// its first element, or nil once the sequence has ended or the task was cancelled. The
  /// consumer's task, in its isolation (`nonisolated(nonsending)`: with an `isolated` parameter
  /// here and in the iterator's closure, each cost an executor switch per suspension).
  @inlinable
  nonisolated(nonsending) func nextBatch(_ batch: inout ElementBatch<Element>) async -> Element? {
    batch.removeAll()  // release the consumed values outside the lock
    while true {
      if Task.isCancelled {
        stopConsuming()
        return nil
      }
      lock.lock()
      let action = machine.take(into: &batch)
      lock.unlock()
      switch action {
      case .took(let effect):
        tookElements(effect)
        return batch.popFirst()
      case .end:
        return nil
      case .suspend:
        if fireEarly() { continue }
        await waitForConsumerWake(
          isolation: #isolation,
          register: { continuation in
            lock.lock()
            defer { lock.unlock() }
            switch machine.suspendConsumer(continuation) {
            case .suspended: return true
            case .resume: return false
            }
          },
          onCancel: { self.stopConsuming() })
      }
    }
  }

  /// The consumer stopped (cancelled, or dropped its iterator). Any thread; idempotent.
  @usableFromInline
  func stopConsuming() {
    lock.lock()
    let action = machine.stopConsuming()
    lock.unlock()
    switch action {
    case .none:
      break
    case .stop(let consumer, let detach, let leftovers):
      consumer?.resume()
      dispose(leftovers)
      if detach { detachMember() }
    }
  }

  /// The member is gone (invalidated, detached from its loop, the loop shut down): what was
  /// accepted is still delivered, then the sequence ends. Any thread; idempotent.
  @usableFromInline
  func memberEnded() {
    lock.lock()
    let action = machine.memberEnded()
    lock.unlock()
    switch action {
    case .none:
      break
    case .end(let consumer, let leftovers):
      dispose(leftovers)
      consumer?.resume()
    }
  }

  /// Makes the iterator of the sequence's single consumer. Traps when called a second time.
  /// `@inlinable`: a generic sequence's `nextBatch` is then specialized in the client.
  @inlinable
  func makeSingleConsumerIterator<Base: AsyncSequence>() -> SingleConsumerIterator<Base>
  where Base.Element == Element {
    claimSingleConsumer()
    return SingleConsumerIterator(self) { batch in await self.nextBatch(&batch) }
  }

  /// Traps unless this is the first iterator.
  @usableFromInline
  func claimSingleConsumer() {
    let (first, name) = lock.withLock { (machine.makeIterator(), machine.lifecycle.sequenceName) }
    precondition(first, singleConsumerViolation("\(name)"))
  }
}
