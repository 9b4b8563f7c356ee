import Glibc

/// The loop-thread half of a loop's observability: what the pass hooks call. Not `Sendable`:
/// only the loop's thread touches it (or the code that creates the loop, before its thread runs).
///
/// Off (no metrics, no stall watch) a callout costs one test of `isActive`. With metrics on, a
/// callout costs two `MetricsClock` readings and a pass one (its end is the next pass's start),
/// plus two around a sleep; a stall watch adds two `LoopClock` readings and two short critical
/// sections on the stamp's lock per callout.
final class LoopMonitor {
  /// Whether metrics are on or a stall watch is (`watch` non-nil).
  @exclusivity(unchecked) private(set) var isActive = false
  /// Whether metrics are on. The storage is the observation's, made with the loop: a `let`, so the
  /// hooks touch it without retaining it, and counts kept while off resume when switched on.
  @exclusivity(unchecked) private var metricsOn = false
  private let metrics: LoopMetricsStorage
  /// What the metrics time with (pass, sleep and callout times below are its readings).
  private let clock: MetricsClock
  @exclusivity(unchecked) private var watch: StallWatch?
  let observation: LoopObservation

  /// The modes of the runs on the stack, innermost last.
  @exclusivity(unchecked) private var runModes: [RunLoopMode] = []
  /// The callouts on the stack that a watch stamped, innermost last.
  @exclusivity(unchecked) private var stamps: [CalloutStamp] = []
  @exclusivity(unchecked) private var calloutNumber: UInt64 = 0
  /// Nanoseconds slept so far (metrics on), so a pass subtracts the sleeps inside it.
  @exclusivity(unchecked) private var slept: Int64 = 0
  @exclusivity(unchecked) private var sleepStarted: Int64 = 0
  /// When the last pass of the innermost run ended (0: no pass ended since a run began or ended):
  /// the next pass of the same run starts then, so one clock read serves both.
  @exclusivity(unchecked) private var passBoundary: Int64 = 0
  /// Bumped by every switch of the metrics: a pass that began before the last switch is not timed
  /// (it may have slept while they were off, uncounted).
  @exclusivity(unchecked) private var switches: UInt32 = 0

  /// Whether metrics are on for new loops: on, because the benchmark measures them within 3% of a
  /// wake-up's and an actor hop's round trip (see "Diagnostics" in the DocC catalog), unless the
  /// process's environment sets `ASYNC_RUN_LOOP_METRICS` to `off`, `0` or `false` (read once).
  static let metricsOnByDefault: Bool = {
    guard let raw = getenv("ASYNC_RUN_LOOP_METRICS") else { return true }
    return !["off", "0", "false"].contains(String(cString: raw).lowercased())
  }()

  init(observation: LoopObservation) {
    self.observation = observation
    clock = observation.metricsClock
    metrics = observation.metrics
    runModes.reserveCapacity(4)
    setMetrics(enabled: Self.metricsOnByDefault)
  }

  // MARK: Switches (loop thread)

  func setMetrics(enabled: Bool) {
    metricsOn = enabled
    // A pass or sleep that began with the other setting is not timed.
    switches &+= 1
    passBoundary = 0
    sleepStarted = 0
    observation.setStampsArrivals(enabled)
    isActive = metricsOn || watch != nil
  }

  func setWatch(_ watch: StallWatch?) {
    self.watch = watch
    isActive = metricsOn || watch != nil
    if watch == nil { stamps.removeAll() }
  }

  /// Takes `watch` off, if it is still the one on.
  func removeWatch(_ watch: StallWatch) {
    if self.watch === watch { setWatch(nil) }
  }

  // MARK: Runs and passes

  /// A run of `mode` begins (nested or not): the callout it is nested in, if any, is not stuck.
  @inline(__always)
  func runBegan(_ mode: RunLoopMode) {
    runModes.append(mode)
    passBoundary = 0
    if watch != nil && !stamps.isEmpty { observation.publish(nil) }
  }

  /// The run ended: the callout it was nested in is the thread's work again, stuck from now on
  /// if it does not return.
  @inline(__always)
  func runEnded() {
    runModes.removeLast()
    passBoundary = 0
    guard watch != nil, let top = stamps.last, top.depth == runModes.count else { return }
    let resumed = CalloutStamp(
      kind: top.kind, label: top.label, priority: top.priority, mode: top.mode, depth: top.depth, number: top.number,
      started: top.started, stuckSince: LoopClock.monotonicNanoseconds())
    stamps[stamps.count - 1] = resumed
    observation.publish(resumed)
  }

  /// What `passBegan` hands `passEnded`.
  struct PassToken {
    /// When the pass began (a `clock` reading; 0: metrics were off).
    let start: Int64
    /// `slept` then.
    let slept: Int64
    /// `switches` then.
    let switches: UInt32
  }

  /// A pass begins: its start and the sleep counted so far (zero when metrics are off). The
  /// start is the end of the run's previous pass when there was one (nothing runs in between).
  @inline(__always)
  func passBegan() -> PassToken {
    guard metricsOn else { return PassToken(start: 0, slept: 0, switches: switches) }
    let start = passBoundary != 0 ? passBoundary : clock.now()
    passBoundary = 0
    return PassToken(start: start, slept: slept, switches: switches)
  }

  /// The pass that `passBegan` returned `pass` for ends: counted, with its busy time (not when
  /// metrics were switched meanwhile).
  @inline(__always)
  func passEnded(_ pass: PassToken) {
    guard metricsOn, pass.start != 0, pass.switches == switches else { return }
    let now = clock.now()
    passBoundary = now
    metrics.count(.passes)
    metrics.record(.passDuration, clock.nanoseconds(now &- pass.start &- (slept &- pass.slept)))
  }

  /// The thread is about to block.
  @inline(__always)
  func willSleep() {
    guard metricsOn else { return }
    sleepStarted = clock.now()
  }

  /// The thread woke.
  @inline(__always)
  func didWake() {
    guard metricsOn, sleepStarted != 0 else { return }
    metrics.count(.wakeUps)
    slept &+= clock.now() &- sleepStarted
    sleepStarted = 0
  }

  // MARK: Callouts

  /// What `begin` hands `end`.
  struct CalloutToken {
    /// When it started: a `clock` reading (0: metrics off).
    let start: Int64
    /// The stamp's number, when a watch stamped it (0: not stamped).
    let number: UInt64
  }

  /// A callout begins. `since`: when what it answers arrived (0: unknown): a job's enqueue or a
  /// source's signal as a `MetricsClock` reading (`LoopObservation.arrivalStamp()`), a timer's
  /// fire date as a `LoopClock` time. The label and priority are only computed for a watch.
  @inline(__always)
  func begin(
    _ kind: LoopCalloutKind, label: () -> String?, priority: () -> TaskPriority?, since: Int64
  ) -> CalloutToken {
    var start: Int64 = 0
    if metricsOn {
      start = clock.now()
      count(kind, at: start, since: since)
    }
    guard watch != nil else { return CalloutToken(start: start, number: 0) }
    return stamp(kind, label: label(), priority: priority(), start: start)
  }

  /// Counts a callout of `kind` starting at `start` (a `clock` reading), and the latency of what
  /// it answers.
  @inline(__always)
  private func count(_ kind: LoopCalloutKind, at start: Int64, since: Int64) {
    switch kind {
    case .job:
      metrics.count(.jobs)
      if since != 0 { metrics.record(.jobQueueDelay, clock.nanoseconds(start &- since)) }
    case .performedBlock:
      metrics.count(.performedBlocks)
    case .sourceHandler:
      metrics.count(.sourcesFired)
      if since != 0 { metrics.record(.signalLatency, clock.nanoseconds(start &- since)) }
    case .readinessHandler:
      metrics.count(.readinessEvents)
    case .timer:
      metrics.count(.timersFired)
      // A fire date is a `LoopClock` time: timers are few, so this reads that clock too.
      // (Saturating: a timer made with a huge negative delay has a fire date near `Int64.min`.)
      if since != 0 { metrics.record(.timerLateness, LoopClock.monotonicNanoseconds().subtractingSaturating(since)) }
    case .observer:
      metrics.count(.observerCallouts)
    }
  }

  /// Stamps a callout for the watch: the watcher sees it from now on (`LoopClock` times: the
  /// watcher compares them with its own readings).
  private func stamp(
    _ kind: LoopCalloutKind, label: String?, priority: TaskPriority?, start: Int64
  ) -> CalloutToken {
    calloutNumber &+= 1
    let started = LoopClock.monotonicNanoseconds()
    let stamp = CalloutStamp(
      kind: kind, label: label, priority: priority, mode: runModes.last ?? .default, depth: runModes.count,
      number: calloutNumber, started: started, stuckSince: started)
    stamps.append(stamp)
    observation.publish(stamp)
    return CalloutToken(start: start, number: calloutNumber)
  }

  /// The callout `token` came from returned.
  @inline(__always)
  func end(_ token: CalloutToken) {
    if token.start != 0 && metricsOn { metrics.record(.calloutDuration, clock.nanoseconds(clock.now() &- token.start)) }
    if token.number != 0 { unstamp(token, now: LoopClock.monotonicNanoseconds()) }
  }

  private func unstamp(_ token: CalloutToken, now: Int64) {
    // (A watch switched off meanwhile left nothing to pop, or to report.)
    guard let stamp = stamps.last, stamp.number == token.number else { return }
    stamps.removeLast()
    if let ended = observation.calloutEnded(stamp, now: now) { ended.watch.deliver(ended.report) }
  }
}
