/// A latency histogram with log-linear buckets (HDR-style): exact below 64 ns, then 32 buckets
/// per power of two up to about 9 minutes (2^39 ns), so every recorded value lands in a bucket at
/// most about 3% wide. Fixed size (1,152 counts), whatever is recorded; longer values land in the
/// last bucket. A plain `Sendable` value: read it, diff it (`-`), print it.
public struct LoopHistogram: Sendable, Equatable, CustomStringConvertible {
  /// The count in each bucket (see `bucketIndex(of:)`).
  var buckets: [UInt64]
  /// How many values were recorded.
  public private(set) var count: UInt64
  /// Their sum, in nanoseconds (wraps after about 584 years of total latency).
  public private(set) var totalNanoseconds: UInt64

  /// An empty histogram.
  public init() {
    buckets = Array(repeating: 0, count: Self.bucketCount)
    count = 0
    totalNanoseconds = 0
  }

  init(buckets: [UInt64], count: UInt64, totalNanoseconds: UInt64) {
    self.buckets = buckets
    self.count = count
    self.totalNanoseconds = totalNanoseconds
  }

  // MARK: Buckets

  /// Sub-buckets per power of two, as a power of two.
  static let subBucketBits = 5
  /// Values below this are counted exactly.
  static let exactBelow: Int64 = 1 << (subBucketBits + 1)
  /// The largest power of two with buckets of its own (2^39 ns ≈ 9.2 minutes).
  static let topOctave = 39
  static let bucketCount = Int(exactBelow) + (topOctave - subBucketBits) * (1 << subBucketBits)

  /// The bucket of `nanoseconds` (negative values count as 0; huge ones land in the last bucket).
  /// Pure; a few instructions.
  @inline(__always)
  static func bucketIndex(of nanoseconds: Int64) -> Int {
    guard nanoseconds >= exactBelow else { return Int(max(nanoseconds, 0)) }
    let octave = 63 - nanoseconds.leadingZeroBitCount  // ≥ subBucketBits + 1
    guard octave <= topOctave else { return bucketCount - 1 }
    let shift = octave - subBucketBits
    let sub = Int(nanoseconds >> Int64(shift)) - (1 << subBucketBits)  // 0..<32
    return Int(exactBelow) + (octave - subBucketBits - 1) * (1 << subBucketBits) + sub
  }

  /// The smallest value bucket `index` holds. Pure.
  static func lowerBound(ofBucket index: Int) -> Int64 {
    guard index >= Int(exactBelow) else { return Int64(index) }
    let relative = index - Int(exactBelow)
    let octave = relative >> subBucketBits + subBucketBits + 1
    let sub = Int64(relative & ((1 << subBucketBits) - 1)) + (1 << subBucketBits)
    return sub << Int64(octave - subBucketBits)
  }

  /// The largest value bucket `index` holds. Pure.
  static func upperBound(ofBucket index: Int) -> Int64 {
    index + 1 < bucketCount ? lowerBound(ofBucket: index + 1) - 1 : Int64.max
  }

  // MARK: Reading

  /// The value at quantile `q` (0...1): the upper bound of the bucket that holds it, so the true
  /// value is at most about 3% lower. nil when the histogram is empty.
  public func quantile(_ q: Double) -> Duration? {
    guard count > 0 else { return nil }
    let rank = max(1, UInt64((Double(count) * min(max(q, 0), 1)).rounded(.up)))
    var seen: UInt64 = 0
    for index in buckets.indices {
      seen += buckets[index]
      if seen >= rank { return .nanoseconds(Self.upperBound(ofBucket: min(index, Self.bucketCount - 2))) }
    }
    return .nanoseconds(Self.upperBound(ofBucket: Self.bucketCount - 2))
  }

  /// The mean of the recorded values; nil when empty.
  public var mean: Duration? {
    count > 0 ? .nanoseconds(Int64(clamping: totalNanoseconds / count)) : nil
  }

  /// The upper bound of the highest non-empty bucket; nil when empty.
  public var maximum: Duration? { quantile(1) }

  /// What was recorded between `earlier` (a snapshot of the same histogram) and `later`.
  public static func - (later: LoopHistogram, earlier: LoopHistogram) -> LoopHistogram {
    var result = later
    for index in result.buckets.indices where index < earlier.buckets.count {
      result.buckets[index] &-= earlier.buckets[index]
    }
    result.count &-= earlier.count
    result.totalNanoseconds &-= earlier.totalNanoseconds
    return result
  }

  /// `count`, mean and the 50th, 99th and 100th percentiles, e.g. `n=1200 mean=3.1µs p50=2.9µs
  /// p99=12µs max=40µs`.
  public var description: String {
    guard count > 0 else { return "n=0" }
    let parts: [(String, Duration?)] = [
      ("mean", mean), ("p50", quantile(0.5)), ("p99", quantile(0.99)), ("max", maximum),
    ]
    return "n=\(count) " + parts.map { "\($0.0)=\(Self.format($0.1 ?? .zero))" }.joined(separator: " ")
  }

  /// A duration with two or three significant digits and a unit: `850ns`, `12.4µs`, `3.05ms`, `1.2s`.
  static func format(_ duration: Duration) -> String {
    let nanoseconds = Double(duration.saturatedNanoseconds)
    let (value, unit): (Double, String) =
      nanoseconds < 1_000
      ? (nanoseconds, "ns")
      : nanoseconds < 1_000_000
        ? (nanoseconds / 1_000, "µs")
        : nanoseconds < 1_000_000_000 ? (nanoseconds / 1e6, "ms") : (nanoseconds / 1e9, "s")
    let digits = value >= 100 ? 0 : value >= 10 ? 1 : 2
    return formatFixed(value, digits: digits) + unit
  }

  /// `value` with `digits` decimals (no Foundation). Pure.
  static func formatFixed(_ value: Double, digits: Int) -> String {
    var scale = 1.0
    for _ in 0..<digits { scale *= 10 }
    let scaled = Int64((value * scale).rounded())
    guard digits > 0 else { return String(scaled) }
    let whole = scaled / Int64(scale)
    var fraction = String(scaled % Int64(scale))
    while fraction.count < digits { fraction = "0" + fraction }
    return "\(whole).\(fraction)"
  }
}
