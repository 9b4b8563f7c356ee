/// Readiness sources in a pass: delivering epoll's events, arming the registrations of the mode
/// that runs and silencing the others, and dropping what epoll kept for closed descriptors.
/// Loop thread only.
extension LoopCore {
  /// Delivers one readiness event; silences a registration that is not in the running mode.
  func handleReadiness(token: UInt64, events: UInt32, contents: ModeContents) -> Bool {
    guard let record = descriptors.registry.record(for: token), let source = record.registration?.source else {
      // Removed already (by a handler earlier in this wait), or kept by epoll for a closed number.
      descriptors.noteUnknownToken(token)
      return false
    }
    guard descriptors.registry.owns(token, source.descriptor) else {
      // The number was closed and now belongs to a newer registration, but epoll still reports
      // this one (a `dup` keeps its file open): it reports another file than the number names,
      // so it never fires again, and epoll must forget it.
      record.markRegistrationLost()
      descriptors.requestPurge()
      return false
    }
    guard record.isArmed else {
      // Silenced already, yet epoll reports it: taking it out of the set failed because its
      // number was closed while a `dup` keeps its file open, so epoll keeps it, out of reach by
      // number, and (level-triggered) it would end every wait of this mode at once. Treated as a
      // registration epoll keeps for a closed number: seen again in the next wait, the loop
      // rebuilds its epoll set without it. (A registration silenced by an earlier handler of
      // this same wait is reported once at most.)
      descriptors.noteUnknownToken(token)
      return false
    }
    guard let claim = record.claim(in: contents) else {
      setArmed(record, false)  // level-triggered: would fire forever in a mode that ignores it
      return false
    }
    // (Removed from this mode by a call the loop has not applied yet: not told; the removal,
    // on its way, silences it if the mode keeps running.)
    return source.fire(DescriptorEvents(rawValue: events), on: shared, record: record, in: claim)
  }

  /// Arms the readiness registrations of `contents`' mode after a mode switch (lazy: the loop
  /// silences registrations of other modes only when they report events). O(silenced
  /// registrations): only those can be out of the epoll set.
  func armDescriptors(for contents: ModeContents) {
    guard descriptors.switchArmedMode(to: contents.mode) else { return }
    // Downwards: arming one takes it off the list, moving the last entry (looked at already) here.
    var index = descriptors.silenced.count
    while index > 0 {
      index -= 1
      let record = descriptors.silenced[index]
      assert(record.registration?.silencedIndex == index, "AsyncRunLoop: silenced list out of step")
      if !record.isPaused && record.isIn(contents) { setArmed(record, true) }
    }
  }

  /// After a wait: rebuilds the epoll set when a registration must go, and keeps this wait's
  /// unknown tokens for the next one (see `LoopDescriptors`). Free unless a wait reported one.
  @inline(__always)
  func noteUnknownTokensAfterWait() {
    if descriptors.needsPurge { purgeLingeringRegistrations() }
    descriptors.endWait()
  }

  /// Rebuilds the epoll set with the registrations that are armed and still own their numbers:
  /// what epoll kept for closed numbers is dropped with the old set (see `EpollPoller.rebuild`).
  func purgeLingeringRegistrations() {
    descriptors.beginPurge()
    var keep: [(descriptor: Int32, events: UInt32, token: UInt64)] = []
    let registry = descriptors.registry
    registry.forEach { token, record in
      guard record.isArmed else { return }
      guard let source = record.registration?.source, registry.owns(token, source.descriptor) else {
        record.markRegistrationLost()
        return
      }
      keep.append((source.descriptor, source.epollEvents, token))
    }
    guard let refused = poller.rebuild(keeping: keep) else { return }
    for token in refused {
      registry.record(for: token)?.markRegistrationLost()  // closed meanwhile
    }
  }

  /// Listens to a readiness registration again, or silences it. Silencing takes it out of the
  /// epoll set: a registration with no interest bits still reports errors and hang-ups (the
  /// kernel always adds them), so in a mode that ignores it a hung-up descriptor would end every
  /// wait at once.
  func setArmed(_ record: MemberRecord, _ armed: Bool) {
    guard let registration = record.registration, registration.token != 0, registration.isArmed != armed else {
      return
    }
    let source = registration.source
    guard armed else {
      // Only while the number is still this registration's: if the descriptor was closed and
      // the number reused, epoll dropped this one already, and the number's set entry belongs
      // to the newer registration. The file is noted only if the registration was still in the
      // set (the number still named its file); gone already, the descriptor was closed and the
      // source can never fire again.
      record.file = nil
      if descriptors.registry.owns(record.token, source.descriptor), poller.deregister(descriptor: source.descriptor) {
        record.file = SystemCall.fileIdentity(of: source.descriptor)
      }
      record.isArmed = false
      descriptors.listSilenced(record, registration)
      return
    }
    // Armed again, or never again (below): either way off the silenced list.
    defer { descriptors.unlistSilenced(registration) }
    // The number may belong to a newer registration by now (this descriptor was closed and the
    // number reused): then this one can never fire again.
    guard descriptors.registry.owns(record.token, source.descriptor) else { return }
    // Silenced, the registration was out of the epoll set: if the number names another file now
    // (closed and reused meanwhile), registering it would report that file's events here.
    guard let file = record.file, SystemCall.fileIdentity(of: source.descriptor) == file else { return }
    do {
      try poller.register(descriptor: source.descriptor, events: source.epollEvents, token: record.token)
      record.isArmed = true
    } catch {
      // The descriptor was closed behind our back: it can never fire again.
      record.isArmed = false
    }
  }
}
