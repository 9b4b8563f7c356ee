import Testing

@testable import AsyncRunLoop

/// Metrics snapshots are plain values: they diff, print, and their histograms' buckets hold
/// every value within about 3% (issue 27, item 2). Pure: no loop, no thread.
@Suite("Loop metrics snapshots")
struct LoopMetricsSnapshotTests {
  @Test func everyValueLandsInABucketThatHoldsItAndIsAtMostAThirtySecondWide() {
    var previous = -1
    var value: Int64 = 0
    while value < 600_000_000_000 {
      let index = LoopHistogram.bucketIndex(of: value)
      #expect(index >= previous)
      #expect(LoopHistogram.lowerBound(ofBucket: index) <= value && value <= LoopHistogram.upperBound(ofBucket: index))
      let width = LoopHistogram.upperBound(ofBucket: index) - LoopHistogram.lowerBound(ofBucket: index) + 1
      #expect(width == 1 || width * 32 <= LoopHistogram.lowerBound(ofBucket: index))
      previous = index
      value = value < 200 ? value + 1 : value + value / 7
    }
    #expect(LoopHistogram.bucketIndex(of: -5) == 0)
    #expect(LoopHistogram.bucketIndex(of: Int64.max) == LoopHistogram.bucketCount - 1)
  }

  @Test func aDiffHoldsWhatWasRecordedBetweenTwoSnapshots() {
    let storage = LoopMetricsStorage()
    for _ in 0..<3 { storage.count(.jobs) }
    storage.record(.jobQueueDelay, 1_000)
    let earlier = storage.snapshot()
    for _ in 0..<5 { storage.count(.jobs) }
    storage.count(.passes)
    for value in [10_000, 20_000, 30_000, 40_000] as [Int64] { storage.record(.jobQueueDelay, value) }
    let later = storage.snapshot()

    let delta = later - earlier
    #expect(later.jobs == 8 && delta.jobs == 5 && delta.passes == 1 && delta.timersFired == 0)
    #expect(delta.jobQueueDelay.count == 4)
    #expect(delta.jobQueueDelay.totalNanoseconds == 100_000)
    #expect(delta.jobQueueDelay.mean == .nanoseconds(25_000))
    // Quantiles name the bucket's upper bound: within 1/32 above the value.
    let median = delta.jobQueueDelay.quantile(0.5)!
    #expect(median >= .nanoseconds(20_000) && median <= .nanoseconds(20_000 + 20_000 / 32))
    let top = delta.jobQueueDelay.maximum!
    #expect(top >= .nanoseconds(40_000) && top <= .nanoseconds(40_000 + 40_000 / 32))
    #expect(delta.signalLatency.quantile(0.5) == nil)
    #expect(later - later == LoopMetrics() - LoopMetrics())
  }

  @Test func aSnapshotPrintsAsATable() {
    let storage = LoopMetricsStorage()
    storage.count(.wakeUps)
    storage.record(.calloutDuration, 2_500)
    let lines = storage.snapshot().description.split(separator: "\n").map(String.init)
    #expect(lines.count == 7)
    #expect(lines[0].hasPrefix("passes 0  wake-ups 1  jobs 0"))
    #expect(lines[1].contains("p50") && lines[1].contains("p99.9"))
    #expect(lines[6].hasPrefix("callout duration") && lines[6].contains("2.5"))
    #expect(lines[2].hasPrefix("signal → handler") && lines[2].contains(" 0 "))
  }
}
