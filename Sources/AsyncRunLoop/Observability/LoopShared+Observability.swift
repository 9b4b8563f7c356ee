/// The end of a loop, as its observability sees it.
extension LoopShared {
  /// The loop ended: it terminated (its drain made its last callout), or, for a current loop, its
  /// jobs left its thread at shutdown (`LoopLifecycle.divertIfOutOfRun`). Its stall watch ends
  /// after every report already made (a report the watcher is delivering right now goes first),
  /// the watcher stops looking at the loop, and a watch made from now on comes back finished.
  /// Metrics stay readable. Any thread, with no lock held; later calls do nothing more.
  func endObservation() {
    // (The watcher stops looking at the loop on its next look, which finds no watch.)
    guard let watch = observation.loopEnded() else { return }
    watch.finish()
    StallWatcher.shared.lookAgain()
  }
}
