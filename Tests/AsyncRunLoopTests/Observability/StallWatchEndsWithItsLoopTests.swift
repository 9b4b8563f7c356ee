import Glibc
import Testing

@testable import AsyncRunLoop

/// A stall watch ends when the loop it watches ends (issue 27): its `reports` sequence finishes
/// after every report already made, the handler is not called again, and `droppedReports` stays
/// readable. Every wait here is a hang guard (a generous watchdog), never a timing claim.
@Suite("A stall watch ends with its loop")
struct StallWatchEndsWithItsLoopTests {
  // MARK: The loop's end, as a value (no threads)

  /// A watched callout that the watcher reports still running (2 ms in) and that ends (3 ms in)
  /// while the watcher is delivering that report: its `.ended` report is left for the watcher.
  private func calloutEndedWhileTheWatcherDelivers() -> (LoopObservation, StallWatch, start: Int64) {
    let observation = LoopObservation(loopName: "made-up")
    let watch = StallWatch(loopName: "made-up", threshold: .milliseconds(1), bufferSize: 4, handler: nil) { _ in }
    #expect(observation.replaceWatch(with: watch).installed)
    let start: Int64 = 5_000_000
    let stamp = CalloutStamp(
      kind: .job, label: nil, priority: nil, mode: .default, depth: 0, number: 4, started: start, stuckSince: start)
    observation.publish(stamp)
    #expect(observation.check(now: start + 2_000_000).report != nil)  // the watcher delivers it now
    #expect(observation.calloutEnded(stamp, now: start + 3_000_000) == nil)  // left for the watcher
    return (observation, watch, start)
  }

  /// The loop ends while the watcher is delivering a `.stillRunning` report, with the callout's
  /// `.ended` report left for the watcher: the watch is not handed back to finish at once, but
  /// to the watcher, after both reports, so the sequence ends behind them.
  @Test func aLoopEndingWhileTheWatcherDeliversEndsTheWatchBehindItsReports() {
    let (observation, watch, start) = calloutEndedWhileTheWatcherDelivers()
    #expect(observation.loopEnded() == nil)  // left for the watcher too
    let after = observation.watcherDelivered()
    // (No shorter than the watcher saw it: 3 ms.)
    #expect(after.ended?.report.phase == .ended(duration: .milliseconds(3)))
    #expect(after.finish == nil)  // not yet: the `.ended` report is still on its way
    let done = observation.watcherDelivered()
    #expect(done.ended == nil && done.finish === watch)
    #expect(observation.check(now: start + 9_000_000).watch == nil)  // nothing is watched any more
  }

  /// The loop ends while the watcher is delivering the `.ended` report the loop's thread left for
  /// it: the watch still ends behind that report (the watcher finishes it), not before it.
  @Test func aLoopEndingWhileTheWatcherDeliversTheLeftEndedReportEndsTheWatchBehindIt() {
    let (observation, watch, _) = calloutEndedWhileTheWatcherDelivers()
    #expect(observation.watcherDelivered().ended != nil)  // the watcher takes the `.ended` report…
    #expect(observation.loopEnded() == nil)  // …and the loop ends while it delivers it
    let done = observation.watcherDelivered()
    #expect(done.ended == nil && done.finish === watch)
  }

  /// The loop ends with no report on its way: the watch is handed back to finish at once, once;
  /// a watch installed afterwards is refused (its maker finishes it).
  @Test func aLoopEndingTakesItsWatchOffOnceAndRefusesLaterOnes() {
    let observation = LoopObservation(loopName: "made-up")
    let watch = StallWatch(loopName: "made-up", threshold: .milliseconds(1), bufferSize: 4, handler: nil) { _ in }
    _ = observation.replaceWatch(with: watch)
    #expect(observation.loopEnded() === watch)
    #expect(observation.loopEnded() == nil)
    let later = StallWatch(loopName: "made-up", threshold: .milliseconds(1), bufferSize: 4, handler: nil) { _ in }
    let outcome = observation.replaceWatch(with: later)
    #expect(!outcome.installed && outcome.replaced == nil)
    #expect(observation.check(now: 1).watch == nil)
  }

  // MARK: Real loops

  /// A consumer already waiting in `for await` returns once the loop is shut down.
  @Test func aWatchsReportsEndWhenItsLoopShutsDown() async throws {
    let loop = try RunLoopThread(name: "watch-ends-shutdown")
    let watch = loop.watchStalls(threshold: .seconds(3600))
    try loop.performAndWait {}  // the watch is on the loop from here
    let consumer = Task { () -> Int in
      var count = 0
      for await _ in watch.reports { count += 1 }
      return count
    }
    loop.shutdown()
    let count = try await withWatchdog("the reports' end after shutdown()") { await consumer.value }
    #expect(count == 0)
    #expect(watch.droppedReports == 0)
    await execShutdown(loop)
  }

  /// The owner's last reference to an owned loop goes (no `shutdown()` call): the loop drains and
  /// ends, and so does its watch, which holds the loop only weakly.
  @Test func aWatchsReportsEndWhenItsOwnerDropsTheLoop() async throws {
    let watch: StallWatch = try {
      let loop = try RunLoopThread(name: "watch-ends-dropped")
      let watch = loop.watchStalls(threshold: .seconds(3600))
      try loop.performAndWait {}
      return watch
    }()
    let ended: Void? = try await withWatchdog("the reports' end after the loop was dropped") {
      for await _ in watch.reports {}
    }
    #expect(ended != nil)
    #expect(watch.droppedReports == 0)
  }

  /// A watch made on a loop that has ended comes back finished: its sequence ends at once, and
  /// its handler is never called.
  @Test func aWatchMadeOnAnEndedLoopComesBackFinished() async throws {
    let loop = try RunLoopThread(name: "watch-after-end")
    await execShutdown(loop)
    let handled = AtomicCounter()
    let watch = loop.watchStalls(threshold: .nanoseconds(1)) { _ in handled.increment() }
    let count = try await withWatchdog("the reports of a watch made after the end") { () -> Int in
      var count = 0
      for await _ in watch.reports { count += 1 }
      return count
    }
    #expect(count == 0)
    #expect(handled.current == 0)
    // Made again, on the same ended loop: the same.
    let again = loop.watchStalls(threshold: .nanoseconds(1))
    let ended: Void? = try await withWatchdog("the reports of a second watch made after the end") {
      for await _ in again.reports {}
    }
    #expect(ended != nil)
  }

  /// A callout reported still running and then ended, with nobody reading the sequence: the loop
  /// is shut down right after the `.stillRunning` report arrived, and the sequence still delivers
  /// both reports, in order, before it ends. The handler saw exactly what the sequence holds, and
  /// is not called after the end.
  @Test func aReportMadeBeforeShutdownIsDeliveredBeforeTheEnd() async throws {
    let loop = try RunLoopThread(name: "watch-buffered-end")
    let handled = Guarded<[StallReport]>([])
    let reported = TestGate()
    let watch = loop.watchStalls(threshold: .milliseconds(20)) { report in
      handled.withLock { $0.append(report) }
      if case .stillRunning = report.phase { reported.open() }
    }
    try loop.performAndWait {}
    // Stuck until the watcher has reported it (a hang guard, not a timing claim).
    loop.perform { _ = reported.wait(timeout: .seconds(20) * watchdogScale) }
    #expect(reported.wait(timeout: .seconds(20) * watchdogScale))
    loop.shutdown()  // while the block may still be stuck: its `.ended` report comes before the end
    let delivered = try await withWatchdog("the reports made before shutdown") { () -> [StallReport] in
      var delivered: [StallReport] = []
      for await report in watch.reports { delivered.append(report) }
      return delivered
    }
    await execShutdown(loop)
    let phases = delivered?.map { report -> String in
      switch report.phase {
      case .stillRunning: return "stillRunning"
      case .ended: return "ended"
      }
    }
    #expect(phases == ["stillRunning", "ended"])
    #expect(Set(delivered?.map(\.calloutNumber) ?? []).count == 1)
    #expect(delivered?.allSatisfy { $0.kind == .performedBlock } == true)
    // The handler saw the same two reports, and nothing after the sequence ended.
    #expect(handled.snapshot.map(\.calloutNumber) == delivered?.map(\.calloutNumber))
    #expect(watch.droppedReports == 0)
  }

  /// A current loop shut down while its thread is out of a run: its jobs leave the thread at once
  /// and the loop's work is over, though the thread (parked here) may live on: the watch ends
  /// then, without waiting for the thread to exit.
  @Test func aCurrentLoopsWatchEndsWhenItShutsDownOutsideARun() async throws {
    let parked = ParkedLoopThread()
    let loop = await parked.loop()
    let watch = loop.watchStalls(threshold: .seconds(3600))
    loop.shutdown()
    let ended: Void? = try await withWatchdog("the reports' end on a parked current loop") {
      for await _ in watch.reports {}
    }
    #expect(ended != nil)
    parked.exit.open()
    #expect(parked.exited.wait(timeout: .seconds(20) * watchdogScale))
  }

  /// A current loop whose thread exits (nobody called `shutdown()`): the thread's exit drains and
  /// ends the loop, and its watch.
  @Test func aCurrentLoopsWatchEndsWhenItsThreadExits() async throws {
    let made = TestGate()
    let exit = TestGate()
    let watch = Guarded<StallWatch?>(nil)
    let thread = startThread {
      let loop = RunLoopThread.current
      watch.withLock { $0 = loop.watchStalls(threshold: .seconds(3600)) }  // on the loop's thread: at once
      made.open()
      _ = exit.wait(timeout: .seconds(20) * watchdogScale)
    }
    #expect(made.wait(timeout: .seconds(20) * watchdogScale))
    guard let made = watch.snapshot else { return }
    exit.open()
    await execOnNewThread { joinThread(thread) }
    let ended: Void? = try await withWatchdog("the reports' end after the loop's thread exited") {
      for await _ in made.reports {}
    }
    #expect(ended != nil)
  }
}
