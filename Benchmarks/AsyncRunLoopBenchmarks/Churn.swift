import AsyncRunLoop
import CAsyncRunLoop
import Glibc

// churn (issue 13): what adding and removing a member costs as a loop fills up, per member kind,
// from the loop thread and from another thread; and how long the loop stays awake after a mass
// removal of timers. Public API only, so the scenario measures any core.

/// The member kinds churn adds and removes.
enum ChurnKind: String, CaseIterable, Sendable {
  case inputSource = "input-source"
  /// Each on its own eventfd (one descriptor per source).
  case descriptorSource = "descriptor-source"
  case timer
  case observer
}

/// Where the adds and removes are called.
enum ChurnSide: String, CaseIterable, Sendable {
  /// In a `performAndWait` block: the change happens at once.
  case loopThread = "loop-thread"
  /// From the measuring thread: each change is sent to the loop; a `performAndWait` barrier
  /// afterwards makes sure all of them were applied.
  case crossThread = "cross-thread"
  /// From the measuring thread while the loop is held in a block, so that every change waits in
  /// the inbox and the loop applies them as one batch once released: the sender's and the
  /// loop's costs apart, without the two threads' scheduling on a shared CPU (which decides how
  /// often the loop wakes for a few changes in `crossThread`).
  case crossThreadBatched = "cross-thread-batched"
}

/// `count` idle members of one kind: never signalled, never readable, due in an hour or more,
/// observing only `entry` (which a running owned loop does not report again). Observers have 64
/// different orders, in a scrambled sequence (as timers have scrambled dates), so that most adds
/// land between existing orders rather than after them.
enum IdleMembers: Sendable {
  case inputSources([InputSource])
  case descriptorSources([DescriptorSource])
  case timers([LoopTimer])
  case observers([LoopObserver])

  init(_ kind: ChurnKind, count: Int) {
    switch kind {
    case .inputSource:
      self = .inputSources((0..<count).map { _ in InputSource { _ in } })
    case .descriptorSource:
      self = .descriptorSources(
        (0..<count).map { _ in
          let descriptor = eventfd(0, Int32(EFD_CLOEXEC) | Int32(EFD_NONBLOCK))
          precondition(descriptor >= 0, "eventfd failed: \(carl_errno())")
          return DescriptorSource(descriptor: descriptor) { _, _ in }
        })
    case .timer:
      self = .timers(Self.farFutureTimers(count))
    case .observer:
      self = .observers(
        (0..<count).map { index in
          let order = Int((UInt64(index) &* 2_654_435_761) % 64) - 32
          return LoopObserver(activities: .entry, order: order) { _, _ in }
        })
    }
  }

  /// Timers due between one hour and one hour plus a second from now, in a scrambled order (so
  /// the heap is not filled in deadline order).
  static func farFutureTimers(_ count: Int) -> [LoopTimer] {
    let base = monotonicNanoseconds() + 3_600_000_000_000
    return (0..<count).map { index in
      let offset = Int64((UInt64(index) &* 2_654_435_761) % 1_000_000_000)
      return LoopTimer(fireAt: LoopClock.Instant(nanoseconds: base + offset)) { _ in }
    }
  }

  /// Adds every member to `loop`'s default mode, from the calling thread.
  func add(to loop: RunLoopThread) {
    switch self {
    case .inputSources(let sources): for source in sources { loop.add(source) }
    case .descriptorSources(let sources): for source in sources { try! loop.add(source) }
    case .timers(let timers): for timer in timers { loop.add(timer) }
    case .observers(let observers): for observer in observers { loop.add(observer) }
    }
  }

  /// Removes every member from `loop`'s default mode, from the calling thread.
  func remove(from loop: RunLoopThread) {
    switch self {
    case .inputSources(let sources): for source in sources { loop.remove(source) }
    case .descriptorSources(let sources): for source in sources { loop.remove(source) }
    case .timers(let timers): for timer in timers { loop.remove(timer) }
    case .observers(let observers): for observer in observers { loop.remove(observer) }
    }
  }

  /// Closes the descriptors (after the sources were removed).
  func close() {
    guard case .descriptorSources(let sources) = self else { return }
    for source in sources { _ = Glibc.close(source.descriptor) }
  }
}

/// Nanoseconds `body` takes on the loop thread (timed there, so the wake-up is not counted).
func timedOnLoop(_ loop: RunLoopThread, _ body: @escaping @Sendable () -> Void) -> Int64 {
  try! loop.performAndWait {
    let start = monotonicNanoseconds()
    body()
    return monotonicNanoseconds() - start
  }
}

/// Nanoseconds from calling `body` on this thread until the loop has applied every change it
/// sent (a `performAndWait` barrier after it: the loop applies changes in the order sent).
func timedAcross(_ loop: RunLoopThread, _ body: () -> Void) -> Int64 {
  let start = monotonicNanoseconds()
  body()
  try! loop.performAndWait {}
  return monotonicNanoseconds() - start
}

/// The sender's and the loop's nanoseconds for the changes `body` sends from this thread while
/// the loop is held in a block (`ChurnSide.crossThreadBatched`): `body` is timed on this thread,
/// then the loop is released and timed until a `performAndWait` barrier returns (it applies the
/// changes in the order sent, before that block).
func timedBatchAcross(_ loop: RunLoopThread, _ body: () -> Void) -> (send: Int64, apply: Int64) {
  let held = EventDoorbell()
  let release = EventDoorbell()
  defer {
    held.close()
    release.close()
  }
  loop.perform {
    held.ring()
    release.wait()
  }
  held.wait()
  let start = monotonicNanoseconds()
  body()
  let sent = monotonicNanoseconds()
  release.ring()
  try! loop.performAndWait {}
  return (sent - start, monotonicNanoseconds() - sent)
}

/// How long churn's rounds took per kind and side, so that a count whose round would take too long
/// is skipped: on a core whose add or remove scans, the cost per member grows with the count, and
/// 100k input sources would take minutes. Used by the measuring thread only.
final class ChurnTimeBudget {
  /// The longest predicted round that is still measured.
  let limitNanoseconds: Int64
  /// How long the rounds of one measurement may take together (at least one round runs).
  let measurementNanoseconds: Int64
  /// The largest count measured so far per "kind side", and how long its round took.
  private var measured: [String: (count: Int, nanoseconds: Int64)] = [:]

  init(mode: RunMode) {
    switch mode {
    case .smoke: (limitNanoseconds, measurementNanoseconds) = (1_000_000_000, 100_000_000)
    case .quick: (limitNanoseconds, measurementNanoseconds) = (3_000_000_000, 1_000_000_000)
    case .full: (limitNanoseconds, measurementNanoseconds) = (20_000_000_000, 4_000_000_000)
    }
  }

  func record(_ key: String, count: Int, nanoseconds: Int64) {
    if measured[key].map({ $0.count <= count }) ?? true { measured[key] = (count, nanoseconds) }
  }

  /// How long a round of `count` would take if the time per member grew linearly with the count
  /// (quadratic in total) from the largest smaller count measured; nil when none was.
  func predictedRound(_ key: String, count: Int) -> Int64? {
    guard let (smaller, nanoseconds) = measured[key], smaller < count else { return nil }
    let scale = Double(count) / Double(smaller)
    return Int64(Double(nanoseconds) * scale * scale)
  }
}

/// One (kind, side, count) of churn: on a fresh loop, create `count` members, add them all, then
/// remove them all. The value is ns per add; extras `remove_ns` and `create_ns` per member, and
/// `n`. Each measurement is the median of up to `rounds` rounds, as many as fit in the budget's
/// measurement time, after a discarded warm-up round for counts up to 1k. A count whose round
/// the budget predicts to be too long is not measured (NaN, reason on stderr).
///
/// Also per add: the minor page faults of the adds (`add_faults_per_1k`: fresh memory they
/// touched first) and what that many first touches of fresh pages cost the kernel on the same
/// thread right after (`add_first_touch_ns`, the page-fault floor of the same round); the rest,
/// `add_minus_first_touch_ns`, is what the loop's own code costs per add.
final class ChurnSession: FigureSession {
  private let kind: ChurnKind
  private let side: ChurnSide
  private let count: Int
  private let rounds: Int
  private let cpu: Int?
  private let budget: ChurnTimeBudget
  private var key: String { "\(kind.rawValue) \(side.rawValue)" }

  init(kind: ChurnKind, side: ChurnSide, count: Int, rounds: Int, cpu: Int?, budget: ChurnTimeBudget) {
    self.kind = kind
    self.side = side
    self.count = count
    self.rounds = rounds
    self.cpu = cpu
    self.budget = budget
  }

  /// One round's costs, ns per member (faults per 1,000 adds).
  private struct Round {
    var create = 0.0
    var add = 0.0
    var remove = 0.0
    var addFaultsPer1k = 0.0
    var addFirstTouch = 0.0
    /// Batched cross-thread: the sender's and the loop's parts of `add` and `remove`.
    var addSend = Double.nan
    var addApply = Double.nan
    var removeSend = Double.nan
    var removeApply = Double.nan
  }

  func measure() -> Figure {
    if let predicted = budget.predictedRound(key, count: count), predicted > budget.limitNanoseconds {
      progress(
        "churn: \(key) \(count) skipped: one round would take ~\(predicted / 1_000_000_000) s"
          + " (limit \(budget.limitNanoseconds / 1_000_000_000) s), extrapolated from the largest smaller count")
      return Figure(value: .nan)
    }
    if count <= 1_000 { _ = measureRound() }  // warm-up
    var measured: [Round] = []
    let start = monotonicNanoseconds()
    while measured.count < rounds
      && (measured.isEmpty || monotonicNanoseconds() - start < budget.measurementNanoseconds)
    {
      let roundStart = monotonicNanoseconds()
      measured.append(measureRound())
      budget.record(key, count: count, nanoseconds: monotonicNanoseconds() - roundStart)
    }
    func medianOf(_ value: (Round) -> Double) -> Double { median(measured.map(value)) }
    return Figure(
      value: medianOf(\.add),
      extras: [
        ("remove_ns", medianOf(\.remove)), ("create_ns", medianOf(\.create)),
        ("add_faults_per_1k", medianOf(\.addFaultsPer1k)), ("add_first_touch_ns", medianOf(\.addFirstTouch)),
        ("add_minus_first_touch_ns", medianOf { $0.add - $0.addFirstTouch }),
      ]
        + (side == .crossThreadBatched
          ? [
            ("add_send_ns", medianOf(\.addSend)), ("add_apply_ns", medianOf(\.addApply)),
            ("remove_send_ns", medianOf(\.removeSend)), ("remove_apply_ns", medianOf(\.removeApply)),
          ] : [])
        + [("n", Double(count)), ("rounds", Double(measured.count))])
  }

  /// One round on a fresh loop. Faults are the loop thread's on the loop-thread side, the whole
  /// process's cross-thread (both threads allocate there); the first touches are measured on the
  /// thread that timed the adds.
  private func measureRound() -> Round {
    let loop = try! RunLoopThread(name: "churn", cpu: cpu)
    defer { loop.shutdownAndWait() }
    let start = monotonicNanoseconds()
    let members = IdleMembers(kind, count: count)
    let create = monotonicNanoseconds() - start
    defer { members.close() }
    let perMember = Double(count)
    var round = Round(create: Double(create) / perMember)
    switch side {
    case .loopThread:
      let (add, faults, firstTouch) = try! loop.performAndWait { () -> (Int64, Int, Double) in
        let faultsBefore = threadMinorFaults()
        let start = monotonicNanoseconds()
        members.add(to: loop)
        let add = monotonicNanoseconds() - start
        let faults = threadMinorFaults() - faultsBefore
        return (add, faults, firstTouchNanosecondsPerPage(pages: faults) * Double(faults))
      }
      round.add = Double(add) / perMember
      round.addFaultsPer1k = Double(faults) * 1_000 / perMember
      round.addFirstTouch = firstTouch / perMember
      round.remove = Double(timedOnLoop(loop) { members.remove(from: loop) }) / perMember
    case .crossThread:
      let faultsBefore = processMinorFaults()
      round.add = Double(timedAcross(loop) { members.add(to: loop) }) / perMember
      let faults = processMinorFaults() - faultsBefore
      round.addFaultsPer1k = Double(faults) * 1_000 / perMember
      round.addFirstTouch = firstTouchNanosecondsPerPage(pages: faults) * Double(faults) / perMember
      round.remove = Double(timedAcross(loop) { members.remove(from: loop) }) / perMember
    case .crossThreadBatched:
      let faultsBefore = processMinorFaults()
      let add = timedBatchAcross(loop) { members.add(to: loop) }
      let faults = processMinorFaults() - faultsBefore
      round.addFaultsPer1k = Double(faults) * 1_000 / perMember
      round.addFirstTouch = firstTouchNanosecondsPerPage(pages: faults) * Double(faults) / perMember
      let remove = timedBatchAcross(loop) { members.remove(from: loop) }
      (round.addSend, round.addApply) = (Double(add.send) / perMember, Double(add.apply) / perMember)
      (round.removeSend, round.removeApply) = (Double(remove.send) / perMember, Double(remove.apply) / perMember)
      round.add = round.addSend + round.addApply
      round.remove = round.removeSend + round.removeApply
    }
    return round
  }

  func close() {}
}

/// Timestamps the loop's sleeps: `beforeWaiting` and `afterWaiting`, on the loop thread.
private final class SleepRecorder: @unchecked Sendable {
  // Safety: `events` is only touched on the loop thread: by the observer's callout and by blocks
  // run there with `performAndWait`.
  var events: [(activity: LoopActivity, at: Int64)] = []

  init() { events.reserveCapacity(1_024) }

  /// The longest pass in `events`: a pass starts at `beforeTimers` and ends at the next one; the
  /// time it slept (`beforeWaiting` to `afterWaiting`) does not count. The first pass starts at
  /// `start` when given (the end of the removals, in the middle of a pass).
  func longestPass(from start: Int64?) -> Int64 {
    var segmentStart = start
    var passAwake: Int64 = 0
    var longest: Int64 = 0
    for event in events {
      switch event.activity {
      case .beforeTimers:
        if let since = segmentStart { passAwake += event.at - since }
        longest = max(longest, passAwake)
        passAwake = 0
        segmentStart = event.at
      case .beforeWaiting:
        if let since = segmentStart { passAwake += event.at - since }
        segmentStart = nil
      default:  // afterWaiting
        segmentStart = event.at
      }
    }
    return longest
  }
}

/// The calling (loop) thread's CPU time: a pass's length is the work the loop does in it, not the
/// time the scheduler gave another thread meanwhile (with `--pin same` the measuring thread, which
/// sends the cross-thread removals, shares the loop's CPU and preempts it for whole time slices).
private func loopThreadCPUNanoseconds() -> Int64 {
  threadCPUNanoseconds(CLOCK_THREAD_CPUTIME_ID) ?? 0
}

/// churn's mass removal: `count` far-future timers on a fresh loop, removed all at once; the
/// value is the longest pass of the loop (the loop thread's CPU time from one `beforeTimers` to
/// the next; sleep excluded) from the end of the removals until it had slept and been woken `wakes` more times
/// (by an empty `performAndWait`, 2 ms apart). Extras:
/// `removal_pass_rest_ns`, the rest of the pass that ran the removals (loop thread) or the
/// barrier after them (cross-thread); `baseline_ns`, the same measurement with the timers
/// still there and nothing removed; `n`. From the loop thread the removal calls themselves are
/// not counted; cross-thread, the passes that apply the removals are (they are the pass).
final class MassRemovalPass: FigureSession {
  private let side: ChurnSide
  private let count: Int
  private let cpu: Int?
  private let wakes = 5

  init(side: ChurnSide, count: Int, cpu: Int?) {
    self.side = side
    self.count = count
    self.cpu = cpu
  }

  func measure() -> Figure {
    let loop = try! RunLoopThread(name: "churn-removal", cpu: cpu)
    defer { loop.shutdownAndWait() }
    let recorder = SleepRecorder()
    let observer = LoopObserver(activities: [.beforeTimers, .beforeWaiting, .afterWaiting]) { _, activity in
      recorder.events.append((activity, loopThreadCPUNanoseconds()))
    }
    defer { observer.invalidate() }
    loop.add(observer)
    let timers = IdleMembers(.timer, count: count)
    _ = timedOnLoop(loop) { timers.add(to: loop) }

    // Baseline: the same wake-ups with the timers in place.
    try! loop.performAndWait { recorder.events.removeAll(keepingCapacity: true) }
    wakeRepeatedly(loop)
    let baseline = try! loop.performAndWait { recorder.longestPass(from: nil) }

    let removed: Int64
    switch side {
    case .loopThread:
      removed = try! loop.performAndWait {
        recorder.events.removeAll(keepingCapacity: true)
        timers.remove(from: loop)
        return loopThreadCPUNanoseconds()
      }
    case .crossThread:
      let sent = try! loop.performAndWait {
        recorder.events.removeAll(keepingCapacity: true)
        return loopThreadCPUNanoseconds()
      }
      timers.remove(from: loop)
      try! loop.performAndWait {}
      removed = sent
    case .crossThreadBatched:
      let sent = try! loop.performAndWait {
        recorder.events.removeAll(keepingCapacity: true)
        return loopThreadCPUNanoseconds()
      }
      _ = timedBatchAcross(loop) { timers.remove(from: loop) }  // (the held block costs no CPU time)
      removed = sent
    }
    wakeRepeatedly(loop)
    let (longest, rest) = try! loop.performAndWait {
      let firstSleep = recorder.events.first { $0.activity == .beforeWaiting }?.at ?? removed
      return (recorder.longestPass(from: removed), firstSleep - removed)
    }
    // The timers are the user's: kept until here so that their deallocation (100k handlers freed
    // wherever the last reference happens to go, the loop thread included) is not timed as the
    // loop's removal work.
    withExtendedLifetime(timers) {}
    return Figure(
      value: Double(longest),
      extras: [("removal_pass_rest_ns", Double(rest)), ("baseline_ns", Double(baseline)), ("n", Double(count))])
  }

  /// Lets the loop fall asleep, then wakes it with an empty block, `wakes` times.
  private func wakeRepeatedly(_ loop: RunLoopThread) {
    for _ in 0..<wakes {
      sleepNanoseconds(2_000_000)
      try! loop.performAndWait {}
    }
    sleepNanoseconds(2_000_000)
  }

  func close() {}
}

/// The process's descriptor limit, raised to the hard limit for the descriptor-source sizes.
struct DescriptorBudget {
  /// The soft limit before and after raising it, and the hard limit.
  let softBefore: Int
  let soft: Int
  let hard: Int
  /// How many more descriptors churn may open (leaving room for loops and the rest).
  let available: Int

  /// Raises the soft RLIMIT_NOFILE to the hard limit.
  static func raise() -> DescriptorBudget {
    var limit = rlimit()
    getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    let before = Int(limit.rlim_cur)
    if limit.rlim_cur < limit.rlim_max {
      var raised = limit
      raised.rlim_cur = limit.rlim_max
      if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &raised) == 0 { limit = raised }
    }
    let soft = Int(clamping: limit.rlim_cur)
    return DescriptorBudget(
      softBefore: before, soft: soft, hard: Int(clamping: limit.rlim_max),
      available: max(0, soft - openDescriptorCount() - 256))
  }
}

enum ChurnScenarios {
  /// The member counts per kind: quick mode stops at 10k except for timers.
  static func sizes(_ kind: ChurnKind, _ mode: RunMode) -> [Int] {
    switch mode {
    case .smoke: return [100, 1_000]
    case .quick: return kind == .timer ? [1_000, 10_000, 100_000] : [1_000, 10_000]
    case .full: return [1_000, 10_000, 100_000]
    }
  }

  /// Rounds per measurement (their median is the figure).
  static func rounds(_ count: Int, _ mode: RunMode) -> Int {
    if mode == .smoke { return 1 }
    return count <= 1_000 ? 9 : (count <= 10_000 ? 5 : 3)
  }

  /// "1k", "100k", or the plain count (0, 100) when it is not a multiple of 1000.
  static func label(_ count: Int) -> String {
    count > 0 && count % 1_000 == 0 ? "\(count / 1_000)k" : "\(count)"
  }

  /// The peer name of one (kind, side, count).
  static func peerName(_ kind: ChurnKind, _ side: ChurnSide, _ count: Int) -> String {
    "\(kind.rawValue) \(side.rawValue) \(label(count))"
  }

  /// The peer name of one steady (kind, side, fill).
  static func steadyPeerName(_ kind: ChurnKind, _ side: ChurnSide, _ fill: Int) -> String {
    "steady \(kind.rawValue) \(side.rawValue) \(label(fill))"
  }

  /// The peer name of one fill-floor count.
  static func floorPeerName(_ count: Int) -> String { "\(fillFloorPrefix)\(label(count))" }
  static let fillFloorPrefix = "fill-floor loop-thread "

  static let fillFloorNote =
    "fill-floor: the least a loop-thread add can do, measured as a loop-thread add (fresh loop, n members made"
    + " first): lock the member, bind a new 72-byte record to it, give the record a slot holding the member;"
    + " remove: the reverse. Its 100k/1k ratio bounds how flat a fill can be here; '... above fill-floor' targets"
    + " divide what a loop-thread add costs beyond it (big n over small n)"

  /// The peer names of the epoll floor at `count` (fill) and holding `fill` (steady).
  static func epollFloorPeerName(_ count: Int) -> String { "\(epollFloorPrefix)\(label(count))" }
  static func steadyEpollFloorPeerName(_ fill: Int) -> String { "\(steadyEpollFloorPrefix)\(label(fill))" }
  static let epollFloorPrefix = "epoll-floor loop-thread "
  static let steadyEpollFloorPrefix = "steady epoll-floor loop-thread "

  static let epollFloorNote =
    "epoll-floor: the kernel's part of a descriptor source's add and removal: one epoll_ctl ADD (DEL) of an"
    + " eventfd on a loop thread, with a fresh epoll instance filled from empty to n (fill) or holding n while"
    + " batches of \(SteadyChurnSession.batch) come and go (steady), at the descriptor-source sizes;"
    + " '... above epoll-floor' targets divide what a loop-thread descriptor source costs beyond it (big n over"
    + " small n)"

  /// The peer name of the mass-removal measurement.
  static func removalPeerName(_ side: ChurnSide, _ count: Int) -> String {
    "timer mass-removal \(side.rawValue) \(label(count))"
  }

  static func churn(_ context: BenchmarkContext) -> ScenarioResult {
    let mode = context.mode
    let cpu = context.pin.serverCPU
    let budget = DescriptorBudget.raise()
    let timeBudget = ChurnTimeBudget(mode: mode)
    let steadyRounds = mode == .smoke ? 1 : (mode == .quick ? 9 : 25)
    var notes = [
      "per kind and size, on a fresh loop: create n idle members, add them all, remove them all;"
        + " value = ns per add, remove_ns = ns per remove; observers have 64 orders, in scrambled sequence",
      "loop-thread: in a performAndWait block (timed inside); cross-thread: from the measuring thread,"
        + " then a performAndWait barrier (timed around); cross-thread-batched: from the measuring thread while"
        + " the loop is held in a block, then the loop released until a barrier; value = both parts"
        + " (add_send_ns + add_apply_ns)",
      "sizes: timers \(sizes(.timer, mode).map(label).joined(separator: "/")), other kinds "
        + "\(sizes(.inputSource, mode).map(label).joined(separator: "/")); median of up to 9 rounds at 1k,"
        + " 5 at 10k, 3 at 100k, as many as fit in \(timeBudget.measurementNanoseconds / 1_000_000) ms",
      "a size whose round would take over \(timeBudget.limitNanoseconds / 1_000_000_000) s (extrapolated"
        + " quadratically from the size below) is skipped: the reason is on stderr",
      "steady: a loop holding n idle members of a kind (the fill, not timed); rounds of \(SteadyChurnSession.batch)"
        + " fresh members added, rescheduled (timers: setFireDate later than every timer held) and removed;"
        + " value = ns per add, remove_ns / reschedule_ns per member; median of \(steadyRounds) rounds after a"
        + " warm-up round at every fill",
      "timer mass-removal: longest pass (ns of loop-thread CPU time, beforeTimers to beforeTimers) from the end"
        + " of the removals of n far-future"
        + " timers through 5 wake-ups; cross-thread includes the passes that apply the removals",
      "RLIMIT_NOFILE soft \(budget.softBefore) raised to \(budget.soft) (hard \(budget.hard));"
        + " descriptor-source sizes capped at \(budget.available)",
    ]
    var peers: [PeerSpec<any FigureSession>] = []
    for kind in ChurnKind.allCases {
      var counts = sizes(kind, mode)
      if kind == .descriptorSource {
        let capped = counts.map { min($0, budget.available) }
        if capped != counts { notes.append("descriptor-source: \(counts.last!) capped to \(capped.last!)") }
        counts = capped.reduce(into: []) { if !$0.contains($1) && $1 > 0 { $0.append($1) } }
        for count in counts {
          let rounds = rounds(count, mode)
          peers.append(
            PeerSpec(name: epollFloorPeerName(count)) {
              EpollFloorSession(count: count, rounds: rounds, steady: false, cpu: cpu)
            })
        }
      }
      for side in ChurnSide.allCases {
        for count in counts {
          let rounds = rounds(count, mode)
          peers.append(
            PeerSpec(name: peerName(kind, side, count)) {
              ChurnSession(kind: kind, side: side, count: count, rounds: rounds, cpu: cpu, budget: timeBudget)
            })
        }
      }
    }
    for kind in ChurnKind.allCases {
      var fills = sizes(kind, mode)
      if kind == .descriptorSource {
        let room = budget.available - 2 * SteadyChurnSession.batch
        fills = fills.map { min($0, room) }.reduce(into: []) { if !$0.contains($1) && $1 > 0 { $0.append($1) } }
        for fill in fills {
          peers.append(
            PeerSpec(name: steadyEpollFloorPeerName(fill)) {
              EpollFloorSession(count: fill, rounds: steadyRounds, steady: true, cpu: cpu)
            })
        }
      }
      for side in ChurnSide.allCases {
        for fill in fills {
          peers.append(
            PeerSpec(name: steadyPeerName(kind, side, fill)) {
              SteadyChurnSession(kind: kind, side: side, fill: fill, rounds: steadyRounds, cpu: cpu)
            })
        }
      }
    }
    for count in sizes(.inputSource, mode) {
      let rounds = rounds(count, mode)
      peers.append(
        PeerSpec(name: floorPeerName(count)) { FillFloorSession(count: count, rounds: rounds, cpu: cpu) })
    }
    notes.append(fillFloorNote)
    notes.append(epollFloorNote)
    notes.append(signalledElsewhereNote)
    peers += signalledElsewherePeers(mode, cpu: cpu)
    let removalCount = sizes(.timer, mode).last!
    for side in ChurnSide.allCases {
      peers.append(
        PeerSpec(name: removalPeerName(side, removalCount)) {
          MassRemovalPass(side: side, count: removalCount, cpu: cpu)
        })
    }
    return runFigureScenario(
      "churn", unit: "ns", notes: notes, peers: peers, warmUp: false, repetitions: mode.figureRepetitions)
  }
}
