import Foundation
import Testing

/// The Foundation bridge on the main thread, checked in real processes: Swift Testing runs tests
/// on pool threads, so each test launches the `FoundationBridgeFixture` executable (built next to
/// the test binary) with one scenario, whose main thread runs the loops. The fixture checks that
/// every body runs on the main thread, prints what it checked and exits 0, or prints "FAIL: …"
/// and exits 1; a watchdog alarm turns a hang into a failure.
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

/// Runs the fixture's `scenario` and expects it to exit 0 and report "`scenario` ok".
private func expectBridgeScenarioPasses(_ scenario: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
  let process = Process()
  process.executableURL = siblingExecutable("FoundationBridgeFixture")
  process.arguments = [scenario]
  let output = Pipe()
  let errors = Pipe()
  process.standardOutput = output
  process.standardError = errors
  try process.run()
  // Read both to the end before waiting (a full pipe would block the child).
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
  readers.wait()
  process.waitUntilExit()
  let (stdout, stderr) = collected.withLock {
    (String(decoding: $0.0, as: UTF8.self), String(decoding: $0.1, as: UTF8.self))
  }
  let report =
    "status \(process.terminationStatus) (\(process.terminationReason == .exit ? "exit" : "signal"))\n--- stdout\n\(stdout)\n--- stderr\n\(stderr.prefix(4000))"
  #expect(
    process.terminationReason == .exit && process.terminationStatus == 0, "\(scenario): \(report)",
    sourceLocation: sourceLocation)
  #expect(stdout.contains("\(scenario) ok"), "\(report)", sourceLocation: sourceLocation)
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
