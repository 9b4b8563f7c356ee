import Glibc
import Testing

@testable import AsyncRunLoop

/// No stall report is lost in silence: when the sequence's buffer is full, the report is dropped
/// and counted (issue 27, item 1); the handler still sees every report.
@Suite("Stall report drops are counted")
struct StallReportDropsAreCountedTests {
  @Test func reportsBeyondTheBufferAreCountedAsDropped() async throws {
    let loop = try RunLoopThread(name: "stall-drops")
    let handled = Guarded<[StallReport]>([])
    let watch = loop.watchStalls(threshold: .milliseconds(2), bufferSize: 2) { report in
      handled.withLock { $0.append(report) }
    }
    try loop.performAndWait {}
    // Five blocks, each certain to run past the threshold: at least five reports, nobody reading.
    for _ in 0..<5 { try loop.performAndWait { _ = usleep(10_000) } }
    // Each block's `.ended` report comes last among its reports, after the caller was released:
    // wait for the five (at least: under a sanitizer, another callout can run past 2 ms too), and
    // until every report the handler saw beyond the two buffered was counted as dropped (a report
    // is offered to the sequence before the handler sees it, so the two agree once it has).
    var seen: [StallReport] = []
    waitUntil("five ended reports, every one beyond the buffer counted as dropped") {
      seen = handled.snapshot
      let ended = seen.filter { if case .ended = $0.phase { true } else { false } }.count
      return ended >= 5 && seen.count == watch.droppedReports + 2
    }
    watch.cancel()
    #expect(seen.count >= 5)
    var delivered: [UInt64] = []
    for await report in watch.reports { delivered.append(report.calloutNumber) }
    // The oldest reports are the ones kept.
    #expect(delivered == Array(seen.prefix(2).map(\.calloutNumber)))
    loop.shutdownAndWait()
  }
}
