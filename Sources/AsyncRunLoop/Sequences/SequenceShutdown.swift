/// Where a new async sequence meets its loop's shutdown.
extension RunLoopThread {
  /// Called by each factory after the sequence's member was added: a loop that has shut down ends
  /// the sequence now (it may never reach the loop), and a `RunLoopThread.current` loop ends it as
  /// soon as its jobs leave its parked thread (`LoopLifecycle`), rather than when that thread
  /// next runs the loop or exits: the consumer gets what was accepted, then the end. (The member's
  /// detach, on the loop's thread later, finds the sequence ended.) Any thread.
  @usableFromInline
  func adoptSequence<Sequence: SingleConsumerStorage>(_ sequence: Sequence, invalidate: () -> Void) {
    if isShutDown { invalidate() }  // it may never reach the loop: end it now
    guard shared.divertsJobsAtShutdown else { return }
    let registered = shared.registerSequenceEnding(sequence) { [weak sequence] in sequence?.memberEnded() }
    if !registered { sequence.memberEnded() }
  }
}
