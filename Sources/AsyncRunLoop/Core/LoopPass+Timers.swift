/// Step 9 of a pass: firing a mode's due timers, and keeping each timer's heap entries at its fire
/// date (see the DocC article "One pass of the loop"). Loop thread only.
extension LoopCore {
  /// Step 9: fires the mode's due timers in (date, scheduling) order, popping them one by one, so
  /// a run nested in a callout still finds the other due timers. A timer scheduled by a callout
  /// waits for the next pass, and a timer never fires inside its own callout (a nested run in
  /// another of its modes leaves it). Returns whether any fired.
  func fireDueTimers(in contents: ModeContents) -> Bool {
    guard let head = contents.timers.firstDeadline else { return false }
    let now = shared.nowNanoseconds  // (one clock read per pass and mode with timers)
    guard head <= now else { return false }
    let newest = timerSequence
    // With their records (held: a callout may invalidate a set-aside timer, freeing the record
    // that an extra entry only points at).
    var setAside: [(entry: IndexedTimerHeap<TimerEntry>.Entry, record: MemberRecord)] = []
    var fired = false
    while let deadline = contents.timers.firstDeadline, deadline <= now {
      let first = contents.timers.popFirst().unsafelyUnwrapped
      let record = first.element.record
      if record.isFiring {
        // Its callout is running further out: the entry stays out of the heap (a due entry left
        // in would arm the timerfd in the past and make this nested run spin) until the callout
        // returns and `fire` puts the timer's entries back. (A new record of the timer, or one on
        // another loop, is told by `LoopTimer.fire`: `.busy`.)
        continue
      }
      if first.sequence > newest {
        setAside.append((first, record))  // scheduled by a callout of this pass
        continue
      }
      fired = true
      if !fire(record, first.element.timer, firedAt: first.deadline, in: contents) {
        // Refused in this mode (a removal from it is on its way): back in the heap after this
        // loop, never lost. The removal takes it out; if the timer stays in the mode after all,
        // it fires on a later pass.
        setAside.append((first, record))
      }
    }
    for (entry, record) in setAside where entry.element.heapSlot < 0 && record.isAttached {
      // Still this mode's entry of the timer (not removed, or replaced by a remove and re-add)
      // and not re-timed meanwhile: back in the heap as it was.
      guard let membership = record.modes.first(where: { $0.contents === contents }),
        membership.timerEntry(of: record) === entry.element
      else { continue }
      contents.timers.insert(entry.element, deadline: entry.deadline, sequence: entry.sequence)
    }
    return fired
  }

  /// Step 9 for the timers of executor jobs due later (`RunLoopMode.everyMode`), in every run
  /// other than one of that mode itself: jobs run in every mode, and so do the timers that
  /// enqueue them. Returns whether any fired.
  @inline(__always)
  func fireEveryModeTimers(besides contents: ModeContents) -> Bool {
    guard let every = modeTable.everyModeContents, every !== contents, every.timerCount > 0 else { return false }
    return fireDueTimers(in: every)
  }

  /// Fires one timer, then moves a repeating timer to the next point of its grid, keeps a fire
  /// date set during the callout, or invalidates a one-shot timer, whatever the callout did to the
  /// timer's modes (as CF does). The timer's entries then all follow its date: the one this pass
  /// popped and any a nested run parked go back into their heaps, and so do those of a new record
  /// when the callout removed the timer and added it here again. A timer whose handler did not run
  /// (moved to another loop, invalidated, or moved later by a `setFireDate` not applied yet) is
  /// left to the change on its way here.
  ///
  /// A timer whose callout is running already (`LoopTimer.FireOutcome.busy`: this record is new,
  /// made by a callout further out that removed the timer and added it again, or the timer was
  /// moved here from a callout on another loop) is not run: its entry stays out of the heap until
  /// that callout returns and re-times it.
  /// Returns false when the timer refused to fire in `contents`' mode (`.leftMode`): its entry
  /// goes back into that heap (the caller puts it back).
  @discardableResult
  func fire(_ record: MemberRecord, _ timer: LoopTimer, firedAt fireDate: Int64, in contents: ModeContents) -> Bool {
    guard let claim = record.claim(in: contents) else { return true }  // (popped from this mode's heap)
    record.isFiring = true
    let outcome = timer.fire(on: shared, dueAt: fireDate, record: record, in: claim)
    record.isFiring = false
    let after: LoopTimer.AfterFire
    let recordHere: MemberRecord?
    switch outcome {
    case .ran(let left, let record):
      (after, recordHere) = (left, record)
    case .busy:
      return true
    case .leftMode:
      return false
    case .skipped:
      if record.isAttached && timer.isBound(to: shared) { pushTimerEntries(record) }  // back at its date
      return true
    }
    let current: MemberRecord? = record.isAttached ? record : recordHere
    switch after {
    case .rescheduled, .advanced:
      if let current, current.isAttached { pushTimerEntries(current) }
    case .finished:
      // One-shot: done (`afterFire` invalidated it); also its new record, if it came back here.
      detach(record)
      if let current { detach(current) }
    }
    return true
  }

  /// Makes a timer's heap entries match its fire date and modes: each mode's entry is moved to
  /// the date (or put back, after a fire popped it), in O(log n).
  func pushTimerEntries(_ record: MemberRecord) {
    guard !record.modes.isEmpty, let timer = record.attachedTimer else { return }
    let date = timer.fireDateNanoseconds
    for membership in record.modes {
      guard let entry = membership.timerEntry(of: record) else { continue }
      timerSequence &+= 1
      if entry.heapSlot >= 0 {
        membership.contents.timers.update(entry, deadline: date, sequence: timerSequence)
      } else {
        membership.contents.timers.insert(entry, deadline: date, sequence: timerSequence)
      }
    }
  }
}
