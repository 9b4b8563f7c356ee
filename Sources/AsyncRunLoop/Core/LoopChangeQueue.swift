/// The registration changes other threads sent (adds, removals, invalidations, new timer dates)
/// that the loop's thread took from its inbox and has not applied yet, and the rule that orders
/// them with everything else the loop runs. Loop thread only (a part of `LoopCore`).
///
/// The ordering rule. The inbox numbers every change, block, job and signal as it arrives
/// (`LoopInbox.sequence`, one counter for all of them):
/// - Changes are applied one at a time, in the order they were sent; `appliedThrough` is the
///   number of the last one applied.
/// - `barrier` is the number of the oldest change not applied yet (`UInt64.max`: none waits). A
///   block, job or signal numbered at or after it waits (it may have been sent after that change,
///   and so may depend on it); one numbered before it may run although later changes wait.
/// - A pass applies at most `perPass` changes, however many calls apply them (the run's start,
///   step 2, each work point, the one after the wake): `passBudget` is what those calls have left,
///   so a burst of 100k changes is spread over passes and timers and descriptors keep their turn.
///   A nested run has a budget of its own (`beginRun`) and gives the outer pass back what it had.
/// - A callout of a change may run the loop nested, or make a loop-thread call that applies
///   changes: the queue is one list with one cursor, so the nested application continues where
///   the outer one is, and no change is applied twice or overtaken. `depth` counts applications on
///   the stack; batches that were applied are freed only when it returns to 0.
/// - A loop-thread add or removal comes after every change sent before it began: it applies the
///   queue first (`LoopCore.applyControlsIfAny`, or inside an application only as far as the
///   member's own last sent change, `LoopCore.changeBindingInOrder`).
///
/// Storage: a list of batches, each a chunk of the inbox's queue as the loop took it (moved whole,
/// so taking 100k changes costs O(chunks), not a copy), applied from `index` of batch
/// `batchIndex`. No batch in the list is empty. An applied slot is cleared at once, so what the
/// change holds (closures, members) is released as it is applied, not all together at the end.
struct LoopChangeQueue {
  /// The most changes one pass applies (its bounded calls together).
  static let perPass = 256

  private var batches: [[SequencedChange]] = []
  private var batchIndex = 0
  private var index = 0
  /// How many applications are on the stack (see the type's comment).
  private(set) var depth = 0
  /// The number of the last change applied.
  private(set) var appliedThrough: UInt64 = 0
  /// What the current pass's bounded calls may still apply (see the type's comment).
  private(set) var passBudget = LoopChangeQueue.perPass
  /// An applied batch kept (emptied, small) to hand the inbox its next array with capacity.
  private var spareBatch: [SequencedChange] = []

  /// Changes taken and not applied yet.
  @inline(__always)
  var hasWaiting: Bool { batchIndex < batches.count }

  /// Blocks, jobs and signals numbered at or after this wait (see the type's comment).
  @inline(__always)
  var barrier: UInt64 { hasWaiting ? batches[batchIndex][index].sequence : UInt64.max }

  /// A change's callout is running (an application is on the stack).
  @inline(__always)
  var isApplying: Bool { depth > 0 }

  /// Under the inbox lock: moves the inbox's changes out behind those still waiting (each change
  /// is moved once). Returns whether it took any.
  @inline(__always)
  mutating func take(from inbox: inout ChunkedQueue<SequencedChange>) -> Bool {
    guard !inbox.isEmpty else { return false }  // (its chunks are never empty: `takeNext` indexes into each)
    inbox.takeAll(appendingTo: &batches, spare: &spareBatch)
    return true
  }

  /// The allowance of one application: the pass's budget left when `bounded`, else no limit.
  @inline(__always)
  func allowance(bounded: Bool) -> Int { bounded ? passBudget : Int.max }

  /// An application begins (call `endApplying()` when it ends).
  @inline(__always)
  mutating func beginApplying() { depth += 1 }

  /// An application ends; the outermost one frees the batches applied, keeping a small one for the
  /// inbox to fill next.
  mutating func endApplying() {
    depth -= 1
    guard depth == 0, batchIndex > 0 else { return }
    ChunkedQueue.recycle(&batches[0], asSpare: &spareBatch)
    batches.removeFirst(batchIndex)
    batchIndex = 0
  }

  /// The next change to apply, taken out of its slot, when one waits, is numbered at most
  /// `through`, and `allowance` is not used up; counts it against `allowance` (and, `bounded`,
  /// against the pass's budget, before the change calls out: a nested run restores it).
  @inline(__always)
  mutating func takeNext(through: UInt64, allowance: inout Int, bounded: Bool) -> RegistrationChange? {
    guard allowance > 0, hasWaiting, batches[batchIndex][index].sequence <= through else { return nil }
    appliedThrough = batches[batchIndex][index].sequence
    let change = batches[batchIndex][index].change
    batches[batchIndex][index] = SequencedChange(sequence: 0, change: .applied)
    index += 1
    if index == batches[batchIndex].count {
      batchIndex += 1
      index = 0
    }
    allowance -= 1
    if bounded { passBudget = allowance }
    return change
  }

  /// Whether a change numbered `sequence` may still wait (it was not applied yet).
  @inline(__always)
  func mayWait(_ sequence: UInt64) -> Bool { sequence > appliedThrough }

  /// A run begins: it gets a pass budget of its own. Returns the outer pass's, for `endRun`.
  @inline(__always)
  mutating func beginRun() -> Int {
    defer { passBudget = Self.perPass }
    return passBudget
  }

  /// A run ends: the outer pass gets its budget back.
  @inline(__always)
  mutating func endRun(restoring outerBudget: Int) { passBudget = outerBudget }

  /// A pass ended: the next one gets a full budget.
  @inline(__always)
  mutating func beginPass() { passBudget = Self.perPass }
}
