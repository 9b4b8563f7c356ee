import Synchronization

/// Where a loop's metrics accumulate: fixed memory, written by the loop's thread only, read from
/// any thread (`snapshot()`).
///
/// Every slot is an `Atomic<UInt64>` that the loop thread updates with a relaxed load and a relaxed
/// store (one writer: no read-modify-write instruction, no fence, the same code as a plain
/// increment on x86-64 and arm64), and readers load relaxed: each value is one the loop wrote, and
/// never goes backwards. A snapshot is not one instant across slots (the loop may be between two
/// updates); after anything that orders the reader behind the loop's work (a `performAndWait`, a
/// continuation it resumed), it holds at least that work.
final class LoopMetricsStorage: @unchecked Sendable {  // Safety: proof below
  // Safety: `slots` is allocated in init and freed in deinit; every access between goes through
  // `Atomic` loads and stores. Only the loop's thread stores (`LoopMonitor` is loop-thread
  // state), so the load-then-store increments never race with each other.

  /// The counters, in `LoopMetrics.Counter` order.
  enum Counter: Int, CaseIterable {
    case passes, wakeUps, jobs, performedBlocks, sourcesFired, readinessEvents, timersFired, observerCallouts
  }

  /// The histograms, in this order.
  enum Histogram: Int, CaseIterable {
    case signalLatency, jobQueueDelay, timerLateness, passDuration, calloutDuration
  }

  /// Per histogram: the total, then the buckets (the count is their sum, taken by `snapshot()`).
  private static let histogramStride = 1 + LoopHistogram.bucketCount
  private static let slotCount = Counter.allCases.count + Histogram.allCases.count * histogramStride

  private let slots: UnsafeMutablePointer<Atomic<UInt64>>

  init() {
    slots = .allocate(capacity: Self.slotCount)
    for index in 0..<Self.slotCount { (slots + index).initialize(to: Atomic(0)) }
  }

  deinit {
    _ = slots.deinitialize(count: Self.slotCount)
    slots.deallocate()
  }

  /// Adds `amount` to slot `index`. Loop thread only (the single writer).
  @inline(__always)
  private func add(_ amount: UInt64, at index: Int) {
    // Relaxed: readers need each value, not an order between them (see the type's comment).
    slots[index].store(slots[index].load(ordering: .relaxed) &+ amount, ordering: .relaxed)
  }

  /// Counts one event. Loop thread only.
  @inline(__always)
  func count(_ counter: Counter) {
    add(1, at: counter.rawValue)
  }

  /// Records one value (nanoseconds; negative counts as 0). Loop thread only.
  @inline(__always)
  func record(_ histogram: Histogram, _ nanoseconds: Int64) {
    let base = Counter.allCases.count + histogram.rawValue * Self.histogramStride
    let value = max(nanoseconds, 0)
    add(UInt64(value), at: base)
    add(1, at: base + 1 + LoopHistogram.bucketIndex(of: value))
  }

  /// What was recorded so far. Any thread.
  func snapshot() -> LoopMetrics {
    var counters = [UInt64](repeating: 0, count: Counter.allCases.count)
    for counter in Counter.allCases { counters[counter.rawValue] = slots[counter.rawValue].load(ordering: .relaxed) }
    var histograms: [LoopHistogram] = []
    for histogram in Histogram.allCases {
      let base = Counter.allCases.count + histogram.rawValue * Self.histogramStride
      var buckets = [UInt64](repeating: 0, count: LoopHistogram.bucketCount)
      for index in buckets.indices { buckets[index] = slots[base + 1 + index].load(ordering: .relaxed) }
      // The count is the buckets' sum, so it always agrees with them; the total, read after
      // them, may include a value or two recorded meanwhile.
      let total = slots[base].load(ordering: .relaxed)
      histograms.append(LoopHistogram(buckets: buckets, count: buckets.reduce(0, &+), totalNanoseconds: total))
    }
    return LoopMetrics(counters: counters, histograms: histograms)
  }
}
