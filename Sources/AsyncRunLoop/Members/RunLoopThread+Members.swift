import Glibc

/// Adding and removing sources, timers and observers. Every method may be called from any
/// thread: on the loop thread the change happens at once; from other threads it is handed to the
/// loop, which applies it at the start of its next pass (before it checks whether the mode has
/// anything to watch, and before it runs any block or executor job sent after the change), and
/// woken to do so.
///
/// Adding anything to a loop that has terminated (shut down and drained) invalidates it at once,
/// so that whoever waits on it (a sleeping task, an async sequence) ends instead of hanging.
extension RunLoopThread {
  // MARK: Custom input sources

  /// Schedules `source` in `mode` (every common mode for `.common`). The first time it joins
  /// this loop its `schedule` routine runs on the loop thread. Adding it twice is a no-op; an
  /// invalidated source is ignored. Any thread.
  public func add(_ source: InputSource, to mode: RunLoopMode = .default) {
    let accepted = onLoopThread { [self] in
      // Attach first, every time: it traps if the source is scheduled on another loop (whose
      // thread owns `memberships`), and refuses an invalidated source.
      switch source.attach(to: self) {
      case .refused:
        return
      case .attached(let schedule, let signalled):
        let joinsLoop = source.memberships.isEmpty
        modeTable.add(source, to: mode)
        guard joinsLoop else { return }  // already here in another mode: schedule ran then
        if signalled { deferredSignalled.append(source) }
        schedule?(source, self, mode == .common ? .default : mode)
      }
    }
    if !accepted { source.invalidate() }
  }

  /// Removes `source` from `mode`; when that was its last mode here, its `cancel` routine runs on
  /// the loop thread. Removing a source that is not there is a no-op. Any thread.
  public func remove(_ source: InputSource, from mode: RunLoopMode = .default) {
    onLoopThread { [self] in
      if modeTable.remove(source, from: mode) { detach(source) }
    }
  }

  // MARK: Timers

  /// Schedules `timer` in `mode` (every common mode for `.common`). Adding it twice is a no-op;
  /// an invalidated timer is ignored. Any thread.
  public func add(_ timer: LoopTimer, to mode: RunLoopMode = .default) {
    // On the loop thread, call directly: an escaping closure would cost an allocation per timer.
    if isOnLoopThread { return addOnLoopThread(timer, to: mode) }
    let accepted = onLoopThread { [self] in addOnLoopThread(timer, to: mode) }
    if !accepted { timer.invalidate() }
  }

  private func addOnLoopThread(_ timer: LoopTimer, to mode: RunLoopMode) {
    guard timer.attach(to: self) else { return }
    let before = timer.memberships.count
    modeTable.add(timer, to: mode)
    if timer.memberships.count != before { pushTimerEntries(timer) }
  }

  /// Removes `timer` from `mode`; it stays valid and can be added again. Any thread.
  public func remove(_ timer: LoopTimer, from mode: RunLoopMode = .default) {
    onLoopThread { [self] in
      modeTable.remove(timer, from: mode)
      pushTimerEntries(timer)
    }
  }

  /// Loop side of `LoopTimer.setFireDate`. Any thread.
  func rescheduleTimer(_ timer: LoopTimer) {
    onLoopThread { [self] in pushTimerEntries(timer) }
  }

  // MARK: Observers

  /// Adds `observer` to `mode` (every common mode for `.common`). Any thread.
  public func add(_ observer: LoopObserver, to mode: RunLoopMode = .default) {
    let accepted = onLoopThread { [self] in
      guard observer.attach(to: self) else { return }
      modeTable.add(observer, to: mode)
    }
    if !accepted { observer.invalidate() }
  }

  /// Removes `observer` from `mode`. Any thread.
  public func remove(_ observer: LoopObserver, from mode: RunLoopMode = .default) {
    onLoopThread { [self] in modeTable.remove(observer, from: mode) }
  }

  // MARK: Readiness sources

  /// Schedules a readiness source in `mode`: registers its descriptor with the loop's epoll the
  /// first time. Any thread.
  /// - Throws: `SystemCallError` with `EBADF` when the descriptor is not open, `EPERM` when it
  ///   cannot be polled (a regular file or directory), or what epoll reports when called on the
  ///   loop thread. From other threads, a failure that only epoll can detect invalidates the
  ///   source and reports `[.error]` to its handler on the loop thread.
  public func add(_ source: DescriptorSource, to mode: RunLoopMode = .default) throws(SystemCallError) {
    var status = stat()
    guard fstat(source.descriptor, &status) == 0 else {
      throw SystemCallError(call: "fstat(fd \(source.descriptor))", errno: EBADF)
    }
    let kind = status.st_mode & S_IFMT
    if kind == S_IFREG || kind == S_IFDIR {
      throw SystemCallError(call: "epoll_ctl(ADD, fd \(source.descriptor))", errno: EPERM)
    }
    if isOnLoopThread {
      try attachAndRegister(source, to: mode)
    } else {
      let accepted = onLoopThread { [self] in
        do {
          try attachAndRegister(source, to: mode)
        } catch {
          // Nobody is waiting for an answer: tell the handler, and drop the source.
          source.fire(.error)
          source.invalidate()
        }
      }
      if !accepted { source.invalidate() }
    }
  }

  /// Loop thread: attaches and registers on the first add, then adds to the mode.
  private func attachAndRegister(_ source: DescriptorSource, to mode: RunLoopMode) throws(SystemCallError) {
    // Attach first, every time: it traps if the source is scheduled on another loop.
    guard source.attach(to: self) else { return }
    if source.memberships.isEmpty {
      let token = nextToken
      nextToken += 1
      do {
        try poller.register(descriptor: source.descriptor, events: source.epollEvents, token: token)
      } catch {
        source.detach()
        throw error
      }
      source.token = token
      source.isArmed = true
      descriptorsByToken[token] = source
      tokenByDescriptor[source.descriptor] = token
    }
    modeTable.add(source, to: mode)
    armedMode = nil  // re-evaluate which registrations the running mode needs
  }

  /// Removes a readiness source from `mode`; when that was its last mode, its descriptor is
  /// deregistered. Any thread.
  public func remove(_ source: DescriptorSource, from mode: RunLoopMode = .default) {
    onLoopThread { [self] in
      if modeTable.remove(source, from: mode) { detach(source) }
    }
  }

  // MARK: Common modes

  /// Adds `mode` to the common set: everything already in `.common` joins it. Any thread.
  public func addModeToCommonModes(_ mode: RunLoopMode) {
    onLoopThread { [self] in
      for case let timer as LoopTimer in modeTable.addToCommonModes(mode) {
        pushTimerEntries(timer)  // the timer needs an entry in the new mode's heap
      }
      armedMode = nil
    }
  }

  /// The modes in the common set. Loop thread only.
  public var commonModes: Set<RunLoopMode> {
    preconditionOnLoopThread()
    return modeTable.commonModes
  }

  // MARK: Detaching (loop thread)

  /// Removes `member` from every mode and runs its detach side effects. Any thread.
  func detachEverywhere(_ member: any ModeMember) {
    // On the loop thread (every one-shot timer after it fires), call directly: no allocation.
    if isOnLoopThread { return detachEverywhereOnLoopThread(member) }
    onLoopThread { [self] in detachEverywhereOnLoopThread(member) }
  }

  private func detachEverywhereOnLoopThread(_ member: any ModeMember) {
    let wasAttached = modeTable.removeEverywhere(member)
    switch member {
    case let source as InputSource:
      if wasAttached { detach(source) } else { _ = source.detach() }
    case let source as DescriptorSource:
      if wasAttached { detach(source) } else { source.detach() }
    case let timer as LoopTimer:
      pushTimerEntries(timer)  // makes its heap entries stale
    default:
      break
    }
  }

  /// A custom source left its last mode: tell it, then call its cancel routine.
  private func detach(_ source: InputSource) {
    deferredSignalled.removeAll { $0 === source }
    if let cancel = source.detach() { cancel(source, self) }
  }

  /// A readiness source left its last mode: deregister its descriptor (unless the number now
  /// belongs to a newer registration: the old descriptor was closed and the number reused).
  private func detach(_ source: DescriptorSource) {
    if source.token != 0 {
      descriptorsByToken[source.token] = nil
      if tokenByDescriptor[source.descriptor] == source.token {
        tokenByDescriptor[source.descriptor] = nil
        poller.deregister(descriptor: source.descriptor)
      }
      source.token = 0
      source.isArmed = false
    }
    source.detach()
  }
}
