import Glibc
import Testing

@testable import AsyncRunLoop

/// Bad input has defined answers (issue 12): out-of-range numbers saturate, are refused with an
/// error, or trap with a message naming the loop, the parameter and the rule — never with a bare
/// conversion trap.
@Suite("Bad input")
struct BadInputTests {
  // MARK: Floating-point seconds beyond Duration's range

  @Test func hugeSecondsSaturateInsteadOfTrapping() throws {
    let timer = try LoopTimer(seconds: 1e30, toleranceSeconds: 1e30) { _ in }
    #expect(timer.fireDate == .distantFuture)
    #expect(timer.tolerance == .nanoseconds(Int64.max))
    let largest = try LoopTimer(seconds: .greatestFiniteMagnitude) { _ in }
    #expect(largest.fireDate == .distantFuture)
  }

  @Test func hugeRepeatIntervalInSecondsSaturates() throws {
    let timer = try LoopTimer(seconds: 1, repeatingEverySeconds: 1e30) { _ in }
    #expect(timer.interval == .nanoseconds(Int64.max))
  }

  @Test func hugelyNegativeSecondsMakeAOneShotTimerThatFiresAtOnce() throws {
    let loop = try RunLoopThread(name: "bad-negative")
    defer { loop.shutdownAndWait() }
    let fires = Locked(0)
    let timer = try LoopTimer(seconds: -1e30, repeatingEverySeconds: -1e30) { _ in fires.withLock { $0 += 1 } }
    #expect(timer.fireDate < .now)  // in the past: it fires as soon as possible
    #expect(timer.interval == nil)
    loop.add(timer)
    waitUntil("the fire") { fires.withLock { $0 } == 1 && !timer.isValid }
    try loop.performAndWait {}
    #expect(fires.withLock { $0 } == 1)
  }

  @Test func secondsInTheUsualRangeAreUnchanged() throws {
    let timer = try LoopTimer(seconds: 1, repeatingEverySeconds: 0.25, toleranceSeconds: 0.001) { _ in }
    #expect(timer.interval == .milliseconds(250))
    #expect(timer.tolerance == .milliseconds(1))
  }
}
