/// Readiness sources in a pass: delivering epoll's events, arming the registrations of the mode
/// that runs and silencing the others, and dropping what epoll kept for closed descriptors.
/// Loop thread only.
extension LoopCore {
  /// Delivers one readiness event; silences a registration that is not in the running mode.
  func handleReadiness(token: UInt64, events: UInt32, contents: ModeContents) -> Bool {
    guard let record = descriptorsByToken[token], let source = record.registration?.source else {
      // Removed already (by a handler earlier in this wait), or kept by epoll for a closed number.
      if unknownTokensLastWait.contains(token) { needsEpollPurge = true }
      unknownTokensThisWait.insert(token)
      return false
    }
    guard tokenByDescriptor[source.descriptor] == token else {
      // The number was closed and now belongs to a newer registration, but epoll still reports
      // this one (a `dup` keeps its file open): it reports another file than the number names,
      // so it never fires again, and epoll must forget it.
      record.markRegistrationLost()
      needsEpollPurge = true
      return false
    }
    guard record.isIn(contents) else {
      setArmed(record, false)  // level-triggered: would fire forever in a mode that ignores it
      return false
    }
    source.fire(DescriptorEvents(rawValue: events), on: shared)
    return true
  }

  /// Arms the readiness registrations of `contents`' mode after a mode switch (lazy: the loop
  /// silences registrations of other modes only when they report events).
  func armDescriptors(for contents: ModeContents) {
    guard armedMode != contents.mode else { return }
    armedMode = contents.mode
    for record in contents.descriptors.values where !record.isArmed && !record.isPaused {
      setArmed(record, true)
    }
  }

  /// After a wait: keeps this wait's unknown tokens for the next one, and rebuilds the epoll set
  /// when one of them must go (`unknownTokensLastWait`). Free unless a wait reported one.
  func noteUnknownTokensAfterWait() {
    if needsEpollPurge { purgeLingeringRegistrations() }
    guard !unknownTokensThisWait.isEmpty || !unknownTokensLastWait.isEmpty else { return }
    swap(&unknownTokensLastWait, &unknownTokensThisWait)
    unknownTokensThisWait.removeAll(keepingCapacity: true)
  }

  /// Rebuilds the epoll set with the registrations that are armed and still own their numbers:
  /// what epoll kept for closed numbers is dropped with the old set (see `EpollPoller.rebuild`).
  func purgeLingeringRegistrations() {
    needsEpollPurge = false
    unknownTokensLastWait.removeAll()
    unknownTokensThisWait.removeAll()
    var keep: [(descriptor: Int32, events: UInt32, token: UInt64)] = []
    for (token, record) in descriptorsByToken where record.isArmed {
      guard let source = record.registration?.source, tokenByDescriptor[source.descriptor] == token else {
        record.markRegistrationLost()
        continue
      }
      keep.append((source.descriptor, source.epollEvents, token))
    }
    guard let refused = poller.rebuild(keeping: keep) else { return }
    for token in refused {
      descriptorsByToken[token]?.markRegistrationLost()  // closed meanwhile
    }
  }

  /// Listens to a readiness registration again, or silences it. Silencing takes it out of the
  /// epoll set: a registration with no interest bits still reports errors and hang-ups (the
  /// kernel always adds them), so in a mode that ignores it a hung-up descriptor would end every
  /// wait at once.
  func setArmed(_ record: MemberRecord, _ armed: Bool) {
    guard record.token != 0, record.isArmed != armed, let source = record.registration?.source else { return }
    guard armed else {
      // Only while the number is still this registration's: if the descriptor was closed and
      // the number reused, epoll dropped this one already, and the number's set entry belongs
      // to the newer registration. The file is noted only if the registration was still in the
      // set (the number still named its file); gone already, the descriptor was closed and the
      // source can never fire again.
      record.file = nil
      if tokenByDescriptor[source.descriptor] == record.token, poller.deregister(descriptor: source.descriptor) {
        record.file = SystemCall.fileIdentity(of: source.descriptor)
      }
      record.isArmed = false
      return
    }
    // The number may belong to a newer registration by now (this descriptor was closed and the
    // number reused): then this one can never fire again.
    guard tokenByDescriptor[source.descriptor] == record.token else { return }
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
