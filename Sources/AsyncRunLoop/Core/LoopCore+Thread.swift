import CAsyncRunLoop
import Glibc

/// The owned thread's life, and how a loop whose last handle is released gets reclaimed.
///
/// The thread holds one reference to its `RunLoopThread` handle while it is awake (so callouts
/// always see a live handle) and lets go of it around each top-level sleep. So the user's last
/// release can only happen while the thread sleeps (or on the thread itself, when it lets go):
/// `handleWillDeinit` then installs a stand-in handle for the same loop, starts the shutdown and
/// wakes the thread, which drains with the stand-in and exits, detached. Nothing polls.
extension LoopCore {
  /// The owned thread's body: runs the loop until shutdown, drains it, and exits.
  func threadMain(holding handle: Unmanaged<RunLoopThread>, started: BlockingGate) {
    heldHandle = handle
    shared.inboxLock.withLock { shared.threadHoldsHandle = true }
    RunLoopThread.nameCallingThread(shared.name)  // pinned already, if asked
    carl_set_current_loop(shared.identity)
    started.open()
    while true {
      _ = run(mode: .default, deadline: Int64.max, returnAfterSourceHandled: false, keepsAlive: true)
      if shared.isShutDown { break }
    }
    letGoOfHandleIfDropped()
    drainForShutdown()
    carl_set_current_loop(nil)
    // From here on a last release of the handle installs no stand-in (see `handleWillDeinit`).
    let dropped = shared.inboxLock.withLock {
      shared.threadIsEnding = true
      return shared.handleDropped
    }
    shared.threadLock.withLock {
      switch shared.threadState {
      case .running(let thread):
        if dropped {
          pthread_detach(thread)  // nobody will join a dropped loop's thread
          shared.threadState = .reaped
        } else {
          shared.threadState = .finished(thread)  // a later shutdownAndWait (or deinit) joins it
        }
      case .notStarted, .joinerRegistered, .finished, .reaped:
        break
      }
    }
    shared.terminatedGate.open()
    standIn = nil
    // Last: this may be the handle's last reference (its deinit then detaches this thread).
    releaseHeldHandle()
  }

  /// Before a top-level sleep of the owned thread: lets go of the handle, so that the user's last
  /// release can reclaim the loop while it sleeps. May run the handle's deinit right here.
  func releaseHandleForSleep() {
    guard heldHandle != nil else { return }
    releaseHeldHandle()
  }

  /// After that sleep, before anything calls out: holds the handle again, unless it was dropped
  /// meanwhile (then `loop` is the stand-in, which the core holds).
  func reacquireHandleAfterSleep() {
    guard heldHandle == nil else { return }
    shared.inboxLock.lock()
    installStandInIfDropped()
    if !shared.handleDropped, let handle = shared.handle {
      // Alive or, if its last release is racing this line, not yet past its deinit's first step,
      // which waits (`handleLetGo`) until this thread lets go again.
      heldHandle = Unmanaged.passRetained(handle)
      shared.threadHoldsHandle = true
    }
    shared.inboxLock.unlock()
  }

  /// The run ended because the handle was dropped while this thread held it again: let go now
  /// (the dropping deinit waits for that), and drain with the stand-in.
  private func letGoOfHandleIfDropped() {
    let dropped: Bool = shared.inboxLock.withLock {
      installStandInIfDropped()
      return shared.handleDropped
    }
    if dropped { releaseHeldHandle() }
  }

  /// Under `inboxLock`, on the loop thread: points `loop` at the stand-in a dropping deinit on
  /// another thread left (only this thread writes `shared.handle`, so its unlocked reads of `loop`
  /// never race that deinit).
  private func installStandInIfDropped() {
    if shared.handleDropped, let standIn { shared.handle = standIn }
  }

  private func releaseHeldHandle() {
    guard let handle = heldHandle else { return }
    heldHandle = nil
    let waiter: BlockingGate? = shared.inboxLock.withLock {
      shared.threadHoldsHandle = false
      defer { shared.handleLetGo = nil }
      return shared.handleLetGo
    }
    handle.release()
    waiter?.open()
  }

  /// The handle's deinit (an owned loop's last reference was released). Any thread.
  func handleWillDeinit(makeStandIn: () -> RunLoopThread) {
    let state = shared.threadLock.withLock { shared.threadState }
    switch state {
    case .running:
      break  // the thread lives: it drains with a stand-in, below
    case .finished(let thread):
      // Shut down and drained already, and nobody joined: reap the thread now (on its own thread,
      // which drops the last reference as it ends, detach instead).
      if pthread_equal(thread, pthread_self()) != 0 { pthread_detach(thread) } else { pthread_join(thread, nil) }
      shared.threadLock.withLock { shared.threadState = .reaped }
      return
    case .notStarted, .joinerRegistered, .reaped:
      return
    }
    let standIn = makeStandIn()
    let onLoopThread = shared.isOnLoopThread
    let handOver: (wake: LoopInbox.WakeAction, waitFor: BlockingGate?)? = shared.arrive {
      // The thread ended its drain since the look at its state: a stand-in set now would hold the
      // core, and the core it, with no thread left to let go (a leak LeakSanitizer saw).
      guard !shared.threadIsEnding else { return nil }
      shared.handleDropped = true
      // Under the lock the loop thread takes before it installs the stand-in (on this very
      // thread, the loop thread itself, at once).
      self.standIn = standIn
      if onLoopThread { shared.handle = standIn }
      var gate: BlockingGate?
      if shared.threadHoldsHandle && !onLoopThread {
        // The thread took the handle again in the instant of its last release: it lets go at the
        // end of its run (this shutdown ends it).
        gate = BlockingGate()
        shared.handleLetGo = gate
      }
      return (shared.inbox.beginShutdown().wake, gate)
    }
    guard let handOver else {
      // It finishes without the handle: reap it as a finished one, once it has said so.
      shared.terminatedGate.wait()
      if case .finished(let thread) = shared.threadLock.withLock({ shared.threadState }) {
        pthread_join(thread, nil)
        shared.threadLock.withLock { shared.threadState = .reaped }
      }
      return
    }
    shared.perform(handOver.wake)
    handOver.waitFor?.wait()
  }
}
