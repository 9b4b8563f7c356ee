import Synchronization

/// The callout a loop's thread is stuck in, as the stall watcher sees it.
struct CalloutStamp {
  let kind: LoopCalloutKind
  let label: String?
  let priority: TaskPriority?
  let mode: RunLoopMode
  let depth: Int
  let number: UInt64
  /// When the callout started.
  let started: Int64
  /// Since when the thread has been in it without running a nested pass (`started`, or the end
  /// of the last run nested in it): a stall is measured from here.
  let stuckSince: Int64

  func report(loopName: String, phase: StallReport.Phase) -> StallReport {
    StallReport(
      loopName: loopName, kind: kind, label: label, priority: priority, mode: mode, nestingDepth: depth,
      started: LoopClock.Instant(nanoseconds: started), calloutNumber: number, phase: phase)
  }
}

/// The cross-thread half of a loop's observability: the metrics storage readers snapshot, the
/// stall watch, and the stamp of the callout the loop's thread is in, which the stall watcher
/// reads without the loop thread's help. Any thread.
final class LoopObservation: @unchecked Sendable {  // Safety: proof below
  // Safety: `watch`, `loopHasEnded`, `current`, `reportedCallout`, `reportedAt`,
  // `watcherDelivering`, `pendingEnd` and `finishAfterDelivery` are only touched with `lock` held;
  // `stampsArrivals` is an atomic; `loopName`, `metricsClock` and
  // `metrics` are immutable (the storage is safe to share: see `LoopMetricsStorage`).

  let loopName: String
  /// Metrics are on: producers stamp what they hand the loop (a job's enqueue, a source's
  /// signal). Relaxed: a stamp taken or skipped around the switch only adds or misses one sample.
  let stampsArrivals = Atomic<Bool>(false)
  /// The clock metrics time with (the process's).
  let metricsClock = MetricsClock.shared

  private let lock = PthreadLock.make()
  private var watch: StallWatch?
  /// The loop terminated (or, a current loop, its jobs left its thread at shutdown): no watch is
  /// installed from now on.
  private var loopHasEnded = false
  /// The callout the loop's thread is in, unless a run nested in it is running passes (then the
  /// loop is not stuck); only kept while a watch is on.
  private var current: CalloutStamp?
  /// The callout the watcher reported as still running (its `.ended` report is always made), and
  /// the time it saw it still running.
  private var reportedCallout: UInt64 = 0
  private var reportedAt: Int64 = 0
  /// The callout whose `.stillRunning` report the watcher is delivering now (0: none), and the
  /// `.ended` report the loop's thread left for the watcher to deliver after it (so that a
  /// callout's two reports never arrive in the wrong order, without calling out under a lock).
  private var watcherDelivering: UInt64 = 0
  private var pendingEnd: (report: StallReport, watch: StallWatch)?
  /// The watch the loop's end took off while the watcher was delivering one of its reports: the
  /// watcher finishes it after that report (and `pendingEnd`), so the sequence ends behind them.
  private var finishAfterDelivery: StallWatch?

  init(loopName: String) {
    self.loopName = loopName
  }

  // MARK: Metrics

  /// What a producer stamps on what it hands the loop: a `metricsClock` reading while metrics
  /// are on, else 0 (unknown). Any thread.
  @inline(__always)
  func arrivalStamp() -> Int64 {
    stampsArrivals.load(ordering: .relaxed) ? metricsClock.now() : 0
  }

  /// The loop's metrics: written by its thread (`LoopMonitor`), snapshot by any thread. Made with
  /// the loop, so reading it takes no lock.
  let metrics = LoopMetricsStorage()

  /// Loop thread (or before it starts): whether producers stamp what they hand the loop.
  func setStampsArrivals(_ enabled: Bool) {
    stampsArrivals.store(enabled, ordering: .relaxed)
  }

  // MARK: Stall watch

  /// Installs `watch`; returns the one it replaces (for the caller to finish), or nil with
  /// `installed` false when the loop has ended (the caller finishes `watch` itself). Any thread.
  func replaceWatch(with watch: StallWatch) -> (installed: Bool, replaced: StallWatch?) {
    lock.withLock {
      guard !loopHasEnded else { return (false, nil) }
      defer { self.watch = watch }
      return (true, self.watch)
    }
  }

  /// Whether a watch is on. Any thread.
  var hasWatch: Bool { lock.withLock { watch != nil } }

  /// The loop ended (see `loopHasEnded`): takes its watch off for good and returns it, for the
  /// caller to finish once the lock is released, unless the watcher is delivering one of its
  /// reports right now (then the watcher finishes it after that report, see `watcherDelivered`).
  /// Any thread; once per loop (later calls return nil).
  func loopEnded() -> StallWatch? {
    lock.withLock {
      loopHasEnded = true
      current = nil
      guard let watch else { return nil }
      self.watch = nil
      guard watcherDelivering == 0 else {
        finishAfterDelivery = watch
        return nil
      }
      return watch
    }
  }

  /// Takes `watch` off if it is still the one installed; true when it was. Any thread.
  func removeWatch(_ watch: StallWatch) -> Bool {
    lock.withLock {
      guard self.watch === watch else { return false }
      self.watch = nil
      current = nil
      return true
    }
  }

  /// Loop thread: the thread is now stuck in `stamp` (nil: it is running a pass).
  @inline(__always)
  func publish(_ stamp: CalloutStamp?) {
    lock.withLock { current = stamp }
  }

  /// Loop thread: the callout `stamp` ended at `now` (a pass runs again). Returns its `.ended`
  /// report to deliver, when it ran past the threshold or was reported as still running, unless
  /// the watcher is delivering that report right now (then the watcher delivers this one after).
  func calloutEnded(_ stamp: CalloutStamp, now: Int64) -> (report: StallReport, watch: StallWatch)? {
    lock.withLock {
      current = nil
      guard let watch else { return nil }
      // The loop's thread read `now` before it took the lock; if the watcher meanwhile saw the
      // callout still running, the callout ended no earlier than that (the thread was preempted
      // between its return and this call), so its duration is at least what was reported.
      let reported = reportedCallout == stamp.number
      let duration = (reported ? max(now, reportedAt) : now) - stamp.started
      guard reported || duration >= watch.thresholdNanoseconds else { return nil }
      let report = stamp.report(loopName: loopName, phase: .ended(duration: .nanoseconds(duration)))
      guard watcherDelivering != stamp.number else {
        pendingEnd = (report, watch)
        return nil
      }
      return (report, watch)
    }
  }

  /// The watcher delivered a report. Returns the `.ended` report the loop's thread left
  /// meanwhile, if any: the watcher is still delivering (a loop ending now leaves its watch for
  /// the watcher to finish) and calls this again once it has delivered that one. Otherwise the
  /// watcher is done, and gets the watch to finish when the loop ended meanwhile.
  func watcherDelivered() -> (ended: (report: StallReport, watch: StallWatch)?, finish: StallWatch?) {
    lock.withLock {
      if let pending = pendingEnd {
        pendingEnd = nil
        return (pending, nil)
      }
      watcherDelivering = 0
      defer { finishAfterDelivery = nil }
      return (nil, finishAfterDelivery)
    }
  }

  /// The watcher's look at `now`: a report for a callout stuck past the threshold (once per
  /// callout), and the time the next stall could be due.
  func check(now: Int64) -> (report: StallReport?, watch: StallWatch?, nextCheck: Int64) {
    lock.withLock {
      guard let watch else { return (nil, nil, Int64.max) }
      let threshold = watch.thresholdNanoseconds
      // Nothing running, or reported already: a callout starting from now stalls at now + threshold at
      // the earliest.
      guard let stamp = current, stamp.number != reportedCallout else {
        return (nil, watch, now.addingSaturating(threshold))
      }
      let due = stamp.stuckSince.addingSaturating(threshold)
      guard due <= now else { return (nil, watch, due) }
      reportedCallout = stamp.number
      reportedAt = now
      watcherDelivering = stamp.number
      let report = stamp.report(loopName: loopName, phase: .stillRunning(elapsed: .nanoseconds(now - stamp.started)))
      return (report, watch, now.addingSaturating(threshold))
    }
  }
}
