import CAsyncRunLoop
import Glibc

/// The one thread that watches every loop with a stall watch on: it sleeps until the earliest
/// moment a watched callout could pass its threshold, reads each loop's stamp (`LoopObservation`),
/// and reports the callouts stuck past it — with no help from the stuck threads. Started the first
/// time a watch is made; it then stays (asleep while no loop is watched).
///
/// It wakes at most once per threshold per watched loop while that loop runs, once more after a
/// loop's watch ends (to stop looking at it), and not at all while no loop is watched.
final class StallWatcher: @unchecked Sendable {  // Safety: proof below
  // Safety: `watched`, `started` and `changed` are only touched with `lock` held; `condition`
  // only through pthread_cond_* with `lock` held or after it (signalling).

  static let shared = StallWatcher()

  private let lock = PthreadLock.make()
  private let condition: UnsafeMutablePointer<pthread_cond_t>
  private var watched: [ObjectIdentifier: LoopObservation] = [:]
  private var started = false
  /// A loop was added since the watcher last looked: look again before sleeping.
  private var changed = false

  private init() {
    condition = .allocate(capacity: 1)
    pthread_cond_init(condition, nil)
  }

  /// Watches `observation`'s loop from now on (starting the thread the first time). Any thread.
  func add(_ observation: LoopObservation) {
    let start: Bool = lock.withLock {
      watched[ObjectIdentifier(observation)] = observation
      changed = true
      defer { started = true }
      return !started
    }
    pthread_cond_signal(condition)
    if start { startThread() }
  }

  /// Whether the watcher looks at `observation`'s loop. Any thread.
  func watches(_ observation: LoopObservation) -> Bool {
    lock.withLock { watched[ObjectIdentifier(observation)] != nil }
  }

  /// Stops looking at `observation`'s loop if no watch is on it. Decided under this lock and then
  /// the loop's (never the other way round): a watch installed before this look keeps the loop
  /// watched, and one installed after it is followed by its `add`, which comes after this.
  private func dropIfUnwatched(_ observation: LoopObservation) {
    lock.withLock {
      if !observation.hasWatch { watched.removeValue(forKey: ObjectIdentifier(observation)) }
    }
  }

  private func startThread() {
    var thread = pthread_t()
    let rc = pthread_create(
      &thread, nil,
      { _ in
        _ = carl_set_thread_name("stall-watcher")
        StallWatcher.shared.run()  // never returns
      }, nil)
    precondition(rc == 0, "AsyncRunLoop: could not start the stall watcher thread (\(rc))")
    pthread_detach(thread)
  }

  /// The watcher's life: look, report (outside the lock), sleep until the next possible stall.
  private func run() -> Never {
    while true {
      let next = lookAtEveryWatchedLoop()
      lock.lock()
      if !changed { sleep(until: next) }
      lock.unlock()
    }
  }

  /// One look at every watched loop: reports what is stuck, drops the loops with no watch, and
  /// returns when the next stall could be due. A function of its own, so the loops it looked at
  /// are released before the watcher sleeps (a dropped loop is not kept alive by a sleeping look).
  private func lookAtEveryWatchedLoop() -> Int64 {
    let loops: [LoopObservation] = lock.withLock {
      changed = false
      return Array(watched.values)
    }
    let now = LoopClock.monotonicNanoseconds()
    var next = Int64.max
    for observation in loops {
      let (report, watch, nextCheck) = observation.check(now: now)
      // A loop whose watch was cancelled, or which ended, is dropped here, not by the cancel
      // or the end: one of those racing a new watch's `add` could drop the new watch's loop.
      guard let watch else {
        dropIfUnwatched(observation)
        continue
      }
      next = min(next, nextCheck)
      guard let report else { continue }
      watch.deliver(report)  // the handler runs here, on this thread
      // The `.ended` report the loop's thread left meanwhile, then (the loop ended while these
      // were on their way) the end of the watch behind them.
      while true {
        let after = observation.watcherDelivered()
        if let ended = after.ended {
          ended.watch.deliver(ended.report)
          continue
        }
        after.finish?.finish()
        break
      }
    }
    return next
  }

  /// A watch was cancelled or its loop ended: look again now (and drop that loop), instead of at
  /// the next time a stall could have been due. Any thread.
  func lookAgain() {
    lock.withLock { changed = true }
    pthread_cond_signal(condition)
  }

  /// With `lock` held: waits on the condition until `deadline` (`LoopClock`; `Int64.max`: until
  /// signalled).
  private func sleep(until deadline: Int64) {
    guard deadline != Int64.max else {
      lock.wait(on: condition)
      return
    }
    let delay = max(0, deadline - LoopClock.monotonicNanoseconds())
    var wake = timespec()
    clock_gettime(CLOCK_REALTIME, &wake)
    let total = Int64(wake.tv_nsec) + delay
    wake.tv_sec += Int(total / 1_000_000_000)
    wake.tv_nsec = Int(total % 1_000_000_000)
    _ = lock.wait(on: condition, until: wake)
  }
}
