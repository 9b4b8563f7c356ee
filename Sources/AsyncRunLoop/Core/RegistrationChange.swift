/// A registration change that another thread sent to a loop, applied on the loop thread in the
/// order sent (`LoopCore.applyControls`).
///
/// The frequent changes (a member's add, removal, invalidation, a timer's new date) are values,
/// not closures: a closure's context was one more heap block per cross-thread change, allocated
/// by the sender and freed by the loop thread. Filling a loop with 100k members from another
/// thread made 100k of them.
enum RegistrationChange {
  /// An accepted `add` of `member` to a mode, with its record on this loop (`RunLoopThread.bind`).
  case add(any LoopMember, MemberRecord, RunLoopMode)
  /// An accepted removal from a mode (`RunLoopThread.unbind`).
  case remove(MemberRecord, RunLoopMode)
  /// An invalidated member leaves the loop (`LoopShared.detachInvalidated`); its record, or nil
  /// when it was removed from here before.
  case invalidate(any LoopMember, MemberRecord?)
  /// A timer's fire date moved (`LoopShared.rescheduleTimer`).
  case reschedule(MemberRecord)
  /// Any other change (rare: common modes, sequences' hooks).
  case custom((LoopCore) -> Void)
  /// The slot of a change already applied (what it held is released as it is applied).
  case applied

  /// An invalidation: a shutdown drain past its cap still takes these (`LoopInbox.control`).
  var isInvalidation: Bool {
    if case .invalidate = self { return true }
    return false
  }
}

extension LoopCore {
  /// Loop thread: applies one change.
  func apply(_ change: RegistrationChange) {
    switch change {
    case .add(let member, let record, let mode):
      // Applied after the record left this loop (the member was invalidated, or removed and
      // added again, meanwhile): a stale add (see `MemberRecord.hasLeft`).
      guard !record.hasLeft else { return }
      _ = member.applyAdd(on: self, record: record, mode: mode, callerWaits: false)
    case .remove(let record, let mode):
      applyRemove(record, from: mode)
    case .invalidate(let member, let record):
      applyInvalidate(member, record)
    case .reschedule(let record):
      applyReschedule(record)
    case .custom(let body):
      body(self)
    case .applied:
      break
    }
  }
}
