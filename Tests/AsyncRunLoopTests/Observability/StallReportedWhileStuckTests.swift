import Glibc
import Testing

@testable import AsyncRunLoop

/// The stall watchdog reports a callout while the loop's thread is still stuck in it, from a
/// thread that needs no help from the loop, and again when it ends (issue 27, item 1).
@Suite("Stall reported while stuck")
struct StallReportedWhileStuckTests {
  /// A job blocks for 200 ms, then keeps blocking until the watcher's report has arrived: the
  /// `.stillRunning` report is therefore proved to arrive while the job is on the stack (by order,
  /// not by timing), and the `.ended` report follows, with a duration of at least the 200 ms.
  @Test func aBlockedJobIsReportedBeforeItEndsThenWithItsDuration() async throws {
    let loop = try RunLoopThread(name: "stall-job")
    let events = Guarded<[String]>([])
    let reports = Guarded<[StallReport]>([])
    let reported = TestGate()
    let ended = TestGate()
    let watch = loop.watchStalls(threshold: .milliseconds(50)) { report in
      reports.withLock { $0.append(report) }
      switch report.phase {
      case .stillRunning:
        events.withLock { $0.append("reported while running") }
        reported.open()
      case .ended:
        events.withLock { $0.append("reported ended") }
        ended.open()
      }
    }
    try loop.performAndWait {}  // the watch is on the loop from here
    let job = Task(executorPreference: loop) {
      usleep(200_000)
      // Stays stuck until the watcher has reported it (a generous watchdog: never a timing claim).
      let arrived = reported.wait(timeout: .seconds(20) * watchdogScale)
      events.withLock { $0.append("job returns") }
      return arrived
    }
    #expect(await job.value)
    // The `.ended` report comes from the loop's thread when the job ends, or from the watcher's
    // thread when that was still delivering `.stillRunning` then: wait for it either way.
    #expect(ended.wait(timeout: .seconds(20) * watchdogScale))
    #expect(events.snapshot == ["reported while running", "job returns", "reported ended"])
    let all = reports.snapshot
    #expect(all.map(\.kind) == [.job, .job])
    #expect(Set(all.map(\.calloutNumber)).count == 1)  // one callout, reported twice
    if case .stillRunning(let elapsed) = all.first?.phase { #expect(elapsed >= .milliseconds(50)) }
    guard case .ended(let duration) = all.last?.phase else {
      Issue.record("no ended report")
      return
    }
    #expect(duration >= .milliseconds(200))
    #expect(all.allSatisfy { $0.mode == .default && $0.nestingDepth == 1 && $0.loopName == "stall-job" })
    #expect(all.allSatisfy { $0.label == nil && $0.priority != nil })
    watch.cancel()
    loop.shutdownAndWait()
  }

  /// The same, read through the `AsyncSequence`: both reports arrive there, in order.
  @Test func reportsArriveThroughTheSequenceInOrder() async throws {
    let loop = try RunLoopThread(name: "stall-sequence")
    let reported = TestGate()
    let ended = TestGate()
    let watch = loop.watchStalls(threshold: .milliseconds(20)) { report in
      // The sequence holds each report before the handler sees it.
      switch report.phase {
      case .stillRunning: reported.open()
      case .ended: ended.open()
      }
    }
    try loop.performAndWait {}
    _ = try loop.performAndWait { reported.wait(timeout: .seconds(20) * watchdogScale) }
    // The caller is released as the block returns; its `.ended` report follows on the loop thread.
    #expect(ended.wait(timeout: .seconds(20) * watchdogScale))
    watch.cancel()  // ends the sequence after what it holds
    var phases: [String] = []
    for await report in watch.reports {
      #expect(report.kind == .performedBlock)
      switch report.phase {
      case .stillRunning: phases.append("stillRunning")
      case .ended: phases.append("ended")
      }
    }
    #expect(phases == ["stillRunning", "ended"])
    #expect(watch.droppedReports == 0)
    loop.shutdownAndWait()
  }
}
