/// The loop-thread half of a loop's observability: what the pass hooks call. Not `Sendable`:
/// only the loop's thread touches it (or the code that creates the loop, before its thread runs).
///
/// Off (no metrics, no stall watch) a callout costs one test of `isActive`. On, a callout costs
/// two clock reads, and with a stall watch two short critical sections on the stamp's lock.
final class LoopMonitor {
  /// Whether metrics are on (metrics non-nil) or a stall watch is (watch non-nil).
  @exclusivity(unchecked) private(set) var isActive = false
  @exclusivity(unchecked) private var metrics: LoopMetricsStorage?
  /// Kept when metrics are switched off, so that switching them on again keeps counting.
  @exclusivity(unchecked) private var keptMetrics: LoopMetricsStorage?
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

  /// Whether metrics are on for new loops: off, because the benchmark's A/B measured them at 3–5%
  /// of a wake-up's or an actor hop's round trip, above the 3% that "always on" was to cost (see
  /// "Diagnostics" in the DocC catalog).
  static let metricsOnByDefault = false

  init(observation: LoopObservation) {
    self.observation = observation
    runModes.reserveCapacity(4)
    if Self.metricsOnByDefault { setMetrics(enabled: true) }
  }

  // MARK: Switches (loop thread)

  func setMetrics(enabled: Bool) {
    if enabled {
      let storage = keptMetrics ?? LoopMetricsStorage()
      keptMetrics = storage
      metrics = storage
    } else {
      metrics = nil
    }
    if let keptMetrics { observation.publishMetrics(keptMetrics, enabled: enabled) }
    isActive = metrics != nil || watch != nil
  }

  func setWatch(_ watch: StallWatch?) {
    self.watch = watch
    isActive = metrics != nil || watch != nil
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
    if watch != nil && !stamps.isEmpty { observation.publish(nil) }
  }

  /// The run ended: the callout it was nested in is the thread's work again, stuck from now on
  /// if it does not return.
  @inline(__always)
  func runEnded() {
    runModes.removeLast()
    guard watch != nil, let top = stamps.last, top.depth == runModes.count else { return }
    let resumed = CalloutStamp(
      kind: top.kind, label: top.label, priority: top.priority, mode: top.mode, depth: top.depth, number: top.number,
      started: top.started, stuckSince: LoopClock.monotonicNanoseconds())
    stamps[stamps.count - 1] = resumed
    observation.publish(resumed)
  }

  /// A pass begins: its start and the sleep counted so far (zero when metrics are off).
  @inline(__always)
  func passBegan() -> (start: Int64, slept: Int64) {
    guard metrics != nil else { return (0, 0) }
    return (LoopClock.monotonicNanoseconds(), slept)
  }

  /// The pass that `passBegan` returned `pass` for ends: counted, with its busy time.
  @inline(__always)
  func passEnded(_ pass: (start: Int64, slept: Int64)) {
    guard let metrics, pass.start != 0 else { return }
    metrics.count(.passes)
    metrics.record(.passDuration, LoopClock.monotonicNanoseconds() - pass.start - (slept - pass.slept))
  }

  /// The thread is about to block.
  @inline(__always)
  func willSleep() {
    guard metrics != nil else { return }
    sleepStarted = LoopClock.monotonicNanoseconds()
  }

  /// The thread woke.
  @inline(__always)
  func didWake() {
    guard let metrics, sleepStarted != 0 else { return }
    metrics.count(.wakeUps)
    slept += LoopClock.monotonicNanoseconds() - sleepStarted
    sleepStarted = 0
  }

  // MARK: Callouts

  /// What `begin` hands `end`.
  struct CalloutToken {
    let kind: LoopCalloutKind
    let start: Int64
    /// The stamp's number, when a watch stamped it (0: not stamped).
    let number: UInt64
  }

  /// A callout begins. `since`: when what it answers arrived (a job's enqueue, a source's signal,
  /// a timer's fire date; 0: unknown).
  func begin(_ kind: LoopCalloutKind, label: String?, priority: TaskPriority?, since: Int64) -> CalloutToken {
    let start = LoopClock.monotonicNanoseconds()
    if let metrics {
      switch kind {
      case .job:
        metrics.count(.jobs)
        if since != 0 { metrics.record(.jobQueueDelay, start - since) }
      case .performedBlock:
        metrics.count(.performedBlocks)
      case .sourceHandler:
        metrics.count(.sourcesFired)
        if since != 0 { metrics.record(.signalLatency, start - since) }
      case .readinessHandler:
        metrics.count(.readinessEvents)
      case .timer:
        metrics.count(.timersFired)
        if since != 0 { metrics.record(.timerLateness, start - since) }
      case .observer:
        metrics.count(.observerCallouts)
      }
    }
    guard watch != nil else { return CalloutToken(kind: kind, start: start, number: 0) }
    calloutNumber &+= 1
    let stamp = CalloutStamp(
      kind: kind, label: label, priority: priority, mode: runModes.last ?? .default, depth: runModes.count,
      number: calloutNumber, started: start, stuckSince: start)
    stamps.append(stamp)
    observation.publish(stamp)
    return CalloutToken(kind: kind, start: start, number: calloutNumber)
  }

  /// The callout `token` came from returned.
  func end(_ token: CalloutToken) {
    let now = LoopClock.monotonicNanoseconds()
    metrics?.record(.calloutDuration, now - token.start)
    // (A watch switched off meanwhile left nothing to pop, or to report.)
    guard token.number != 0, let stamp = stamps.last, stamp.number == token.number else { return }
    stamps.removeLast()
    if let ended = observation.calloutEnded(stamp, now: now) { ended.watch.deliver(ended.report) }
  }
}
