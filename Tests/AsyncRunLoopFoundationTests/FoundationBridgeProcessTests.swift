import Foundation
import Testing

/// The Foundation bridge on the main thread, checked in real processes: Swift Testing runs tests
/// on pool threads, so each test launches the `FoundationBridgeFixture` executable (built next to
/// the test binary) with one scenario, whose main thread runs the loops. The fixture checks that
/// every body runs on the main thread, prints what it checked and exits 0, or prints "FAIL: …"
/// and exits 1; a watchdog alarm turns a hang into a failure, and so does a deadline here.
@Suite("Foundation bridge in a real process", .serialized)
struct FoundationBridgeProcessTests {
  @Test func underRunMainLoopFoundationTimersPerformsAndLoopTimersFireInDeadlineOrder() throws {
    try expectBridgeScenarioPasses("our-driver-timers")
  }

  @Test func underRunLoopMainRunOurTimersPerformsRunOnMainAndMainActorWorkAreServed() throws {
    try expectBridgeScenarioPasses("foundation-driver-timers")
  }

  @Test func aCallerBlockedBetweenTwoRunLoopMainRunsIsServedByTheNextOne() throws {
    try expectBridgeScenarioPasses("foundation-driver-between-runs")
  }

  @Test func aCallerBlockedBetweenTwoRunLoopMainRunsIsReleasedByTheMainLoopsShutdown() throws {
    try expectBridgeScenarioPasses("foundation-driver-shutdown-between-runs")
  }

  @Test func aFoundationModalRunInsideOurCalloutServesBothLoops() throws {
    try expectBridgeScenarioPasses("foundation-modal-in-our-callout")
  }

  @Test func ourModalRunInsideAFoundationCalloutServesBothLoops() throws {
    try expectBridgeScenarioPasses("our-modal-in-foundation-callout")
  }

  @Test func aMillionPostsIntoOurLoopUnderFoundationArriveOnceInOrder() throws {
    try expectBridgeScenarioPasses("posts-into-our-loop")
  }

  @Test func aMillionPostsIntoFoundationUnderRunMainLoopArriveOnceInOrder() throws {
    try expectBridgeScenarioPasses("posts-into-foundation")
  }

  @Test func shuttingDownOurLoopUnderFoundationLosesNoAcceptedBlock() throws {
    try expectBridgeScenarioPasses("our-shutdown-under-foundation")
  }

  @Test func stoppingOurLoopLosesNoFoundationBlock() throws {
    try expectBridgeScenarioPasses("foundation-work-survives-our-stop")
  }

  @Test func shuttingDownOurLoopLosesNoFoundationBlock() throws {
    try expectBridgeScenarioPasses("foundation-work-survives-our-shutdown")
  }

  @Test func cfTimerAndSourceSequencesOnTheMainRunLoopDeliverOnTheMainThreadUnderRunMainLoop() throws {
    try expectBridgeScenarioPasses("main-sequences-under-our-driver")
  }

  @Test func cfTimerAndSourceSequencesOnTheMainRunLoopDeliverOnTheMainThreadUnderRunLoopMainRun() throws {
    try expectBridgeScenarioPasses("main-sequences-under-foundation")
  }

  /// `Process` starts the fixture with the signal mask of the pool thread that launched it, which
  /// blocks SIGALRM; the fixture's watchdog must end a hung scenario all the same.
  @Test func aHungScenarioIsEndedByTheFixturesAlarm() throws {
    let run = try runBridgeFixture("hang", sourceLocation: #_sourceLocation)
    #expect(run.endedBySignal && run.status == SIGALRM, "\(run.report)")
  }
}

/// The path of an executable built next to the running test binary.
private func siblingExecutable(_ name: String) -> URL {
  let me = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
  var directory = me.deletingLastPathComponent()
  // `swift test` runs `<name>PackageTests.xctest` in the build directory, next to the fixture.
  if !FileManager.default.fileExists(atPath: directory.appendingPathComponent(name).path) {
    directory = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()
  }
  return directory.appendingPathComponent(name)
}

/// How one run of the fixture ended, and what it printed.
private struct BridgeFixtureRun {
  var endedBySignal: Bool
  /// The exit status, or the signal that ended the fixture.
  var status: Int32
  var standardOutput: String
  var standardError: String

  var report: String {
    "status \(status) (\(endedBySignal ? "signal" : "exit"))\n--- stdout\n\(standardOutput)\n--- stderr\n\(standardError.prefix(4000))"
  }
}

/// Runs the fixture's `scenario` to its end, launched by Foundation's `Process` as a user would.
private func runBridgeFixture(_ scenario: String, sourceLocation: SourceLocation) throws -> BridgeFixtureRun {
  let process = Process()
  process.executableURL = siblingExecutable("FoundationBridgeFixture")
  process.arguments = [scenario]
  // The Swift runtime's backtracer off, as Swift Testing does for exit tests: a crashed child's
  // swift-backtrace has outlived it, blocked, holding the pipes its readers wait on.
  process.environment = ProcessInfo.processInfo.environment.merging(["SWIFT_BACKTRACE": "enable=no"]) { set, _ in set }
  let output = Pipe()
  let errors = Pipe()
  process.standardOutput = output
  process.standardError = errors
  // The end is learnt from the termination handler, set before the launch: `waitUntilExit()` off
  // the main thread polls the caller's run loop and is known to miss a child that already exited.
  let exited = DispatchSemaphore(value: 0)
  process.terminationHandler = { _ in exited.signal() }
  try process.run()
  // Read both to the end while it runs (a full pipe would block the child).
  let collected = Locked<(Data, Data)>((Data(), Data()))
  let readers = DispatchGroup()
  for (index, pipe) in [output, errors].enumerated() {
    readers.enter()
    Thread {
      let data = pipe.fileHandleForReading.readDataToEndOfFile()
      collected.withLock { if index == 0 { $0.0 = data } else { $0.1 = data } }
      readers.leave()
    }.start()
  }
  // The fixture's alarm ends a hung scenario; this deadline covers a fixture that cannot even do
  // that. Both scale with ASYNC_RUN_LOOP_WATCHDOG_SCALE (sanitized runs are many times slower).
  let deadline = 300 * watchdogScale
  var reported = true
  if exited.wait(timeout: .now() + .seconds(deadline)) == .timedOut {
    kill(process.processIdentifier, SIGKILL)
    Issue.record("\(scenario) did not finish within \(deadline) s; killed", sourceLocation: sourceLocation)
    reported = exited.wait(timeout: .now() + .seconds(30)) == .success
  }
  if readers.wait(timeout: .now() + .seconds(30)) == .timedOut {
    Issue.record("\(scenario): its output did not end 30 s after it exited", sourceLocation: sourceLocation)
  }
  return collected.withLock {
    BridgeFixtureRun(
      // (`Process` traps on reading the status of a process it has not seen end.)
      endedBySignal: reported ? process.terminationReason == .uncaughtSignal : true,
      status: reported ? process.terminationStatus : SIGKILL,
      standardOutput: String(decoding: $0.0, as: UTF8.self), standardError: String(decoding: $0.1, as: UTF8.self))
  }
}

/// Runs the fixture's `scenario` and expects it to exit 0 and report "`scenario` ok".
private func expectBridgeScenarioPasses(_ scenario: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
  let run = try runBridgeFixture(scenario, sourceLocation: sourceLocation)
  #expect(!run.endedBySignal && run.status == 0, "\(scenario): \(run.report)", sourceLocation: sourceLocation)
  #expect(run.standardOutput.contains("\(scenario) ok"), "\(run.report)", sourceLocation: sourceLocation)
}

/// A value shared between threads, under a lock.
final class Locked<Value>: @unchecked Sendable {
  // Safety: `value` is only touched while `lock` is held (in `withLock`).
  private let lock = NSLock()
  private var value: Value

  init(_ value: Value) { self.value = value }

  func withLock<T>(_ body: (inout Value) throws -> T) rethrows -> T {
    lock.lock()
    defer { lock.unlock() }
    return try body(&value)
  }
}
