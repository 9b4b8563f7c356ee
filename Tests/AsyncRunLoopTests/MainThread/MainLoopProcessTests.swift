import CAsyncRunLoop
import CTestChildProcess
import Glibc
import Testing

/// The main loop's guarantees, checked in a real process whose main thread runs it.
///
/// Swift Testing runs tests on pool threads, and an exit test's body also runs on a pool thread of
/// the child process (see `MainLoopMisuseTests.exitTestBodiesDoNotRunOnTheMainThread`), so neither
/// can run the main loop. Each test here launches the `MainLoopFixture` executable (built next to
/// the test binary) with one scenario; the fixture checks with `gettid() == getpid()` that bodies
/// run on the process's main thread and with `MainActor.assumeIsolated` that they are main-actor
/// isolated, prints what it checked, and exits 0, or prints "FAIL: …" and exits 1. A watchdog
/// alarm in the fixture turns a hang into a failure. Under `--sanitize=thread` the fixture is
/// built with ThreadSanitizer too, and a report makes it exit non-zero.
@Suite("MainLoop in a real process", .serialized)
struct MainLoopProcessTests {
  @Test func mainActorDispatchMainAndRunOnMainRunOnTheProcessMainThread() throws {
    try expectScenarioPasses("threads")
  }

  @Test func onTheMainThreadEveryFormRunsInlineInTheCallersFrame() throws {
    try expectScenarioPasses("inline")
  }

  @Test func callsFromOneThreadRunInTheOrderTheyWereMade() throws {
    try expectScenarioPasses("order")
  }

  @Test func valuesAreReturnedAndErrorsRethrownUnchanged() throws {
    try expectScenarioPasses("values")
  }

  @Test func waitingThrowsInsteadOfHangingWhenTheMainLoopIsNotRunning() throws {
    try expectScenarioPasses("not-running")
  }

  @Test func stopMainLoopEndsNestedRunsAndRunMainLoop() throws {
    try expectScenarioPasses("nested-stop")
  }

  @Test func performAndWaitOnTheMainLoopThrowsInsteadOfHangingWhenTheLoopStops() throws {
    try expectScenarioPasses("perform-and-wait-stopped")
  }

  @Test func shutdownEndsRunMainLoopAfterDrainingTheLoop() throws {
    try expectScenarioPasses("shutdown")
  }

  @Test func runningTheMainLoopDirectlyServesTheMainQueueAndStaysAlive() throws {
    try expectScenarioPasses("raw-run")
  }

  @Test func runMainLoopInsideRunMainLoopTrapsWithAClearMessage() throws {
    let run = try ChildProcess.run(ChildProcess.sibling("MainLoopFixture"), arguments: ["nested-run-main-loop"])
    // A trap is a signal; under ThreadSanitizer its crash handling may turn it into exit code 66.
    #expect(run.signal != nil || (run.exitCode ?? 0) != 0, "the nested runMainLoop() did not trap: \(run)")
    #expect(run.standardError.contains("runMainLoop() is already running on the main thread"), "\(run)")
    // Children crash without the Swift runtime's backtracer, which can outlive them holding our
    // descriptors (see `ChildProcess.childEnvironment`); it prints "Backtrace took …" when done.
    #expect(!run.standardError.contains("Backtrace took"), "\(run)")
  }

  @Test func delegateExampleCalloutsAllRunOnTheMainThread() throws {
    let run = try ChildProcess.run(ChildProcess.sibling("MainThreadDelegateExample"), arguments: [])
    #expect(run.exitCode == 0, "\(run)")
    #expect(run.standardOutput.contains("first started"), "\(run)")
    #expect(run.standardOutput.contains("second finished"), "\(run)")
    #expect(run.standardOutput.contains("delegate callouts, all on the main thread"), "\(run)")
  }

}

/// A finished child process: how it ended and what it printed.
struct ChildProcess: CustomStringConvertible {
  /// The exit code, when it exited.
  var exitCode: Int32?
  /// The signal that killed it, when one did.
  var signal: Int32?
  var standardOutput: String
  var standardError: String

  var description: String {
    let ending = exitCode.map { "exit code \($0)" } ?? signal.map { "signal \($0)" } ?? "?"
    return "\(ending)\n--- stdout\n\(standardOutput)\n--- stderr\n\(standardError.prefix(4000))"
  }

  struct LaunchError: Error, CustomStringConvertible {
    var description: String
  }

  /// The path of an executable built next to the running test binary.
  static func sibling(_ name: String) throws -> String {
    var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
    let count = readlink("/proc/self/exe", &buffer, buffer.count - 1)
    guard count > 0 else { throw LaunchError(description: "readlink(/proc/self/exe) failed") }
    let executable = String(decoding: buffer[..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    let directory = executable.split(separator: "/", omittingEmptySubsequences: false).dropLast().joined(separator: "/")
    let path = directory + "/" + name
    guard access(path, X_OK) == 0 else {
      throw LaunchError(description: "\(path) is missing: the test target depends on \(name), so build the tests")
    }
    return path
  }

  /// Runs `path` with `arguments` and this process's environment, capturing its output; kills it
  /// (and records a failure) after `timeout`.
  static func run(_ path: String, arguments: [String], timeout: Duration = .seconds(300)) throws -> ChildProcess {
    let output = try CaptureFile()
    let errors = try CaptureFile()
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_adddup2(&actions, output.descriptor, 1)
    posix_spawn_file_actions_adddup2(&actions, errors.descriptor, 2)
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
    // Nothing else of ours: an inherited pipe end (the symbolizer's, `swift test`'s output) kept
    // open by a child, or by what the child starts, keeps its reader waiting after we ended.
    let closing = carl_test_spawn_close_inherited(&actions)
    guard closing == 0 else { throw LaunchError(description: "closing inherited descriptors: \(closing)") }
    let argv = ([path] + arguments).map { strdup($0) } + [nil]
    let envp = childEnvironment().map { strdup($0) } + [nil]
    defer { for pointer in argv + envp { free(pointer) } }
    // The child starts with no signal blocked, as from a shell; the pool thread spawning it blocks
    // most signals, and a child inherits that mask.
    var attributes = posix_spawnattr_t()
    posix_spawnattr_init(&attributes)
    defer { posix_spawnattr_destroy(&attributes) }
    var noSignals = sigset_t()
    sigemptyset(&noSignals)
    posix_spawnattr_setsigmask(&attributes, &noSignals)
    posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK))
    var pid: pid_t = 0
    let rc = posix_spawn(&pid, path, &actions, &attributes, argv, envp)
    guard rc == 0 else { throw LaunchError(description: "posix_spawn \(path): \(String(cString: strerror(rc)))") }
    var status: Int32 = 0
    let timeout = timeout * watchdogScale  // the child's own alarm scales so too
    let deadline = ContinuousClock.now.advanced(by: timeout)
    while waitpid(pid, &status, WNOHANG) == 0 {
      if ContinuousClock.now >= deadline {
        kill(pid, SIGKILL)
        waitpid(pid, &status, 0)
        Issue.record("\(path) \(arguments) did not finish within \(timeout); killed")
        break
      }
      usleep(2000)
    }
    let termination = status & 0x7f
    return ChildProcess(
      exitCode: termination == 0 ? (status >> 8) & 0xff : nil, signal: termination == 0 ? nil : termination,
      standardOutput: output.contents(), standardError: errors.contents())
  }

  /// The environment this process started with, and the Swift runtime's backtracer off unless
  /// set: several children crash on purpose, and under ThreadSanitizer a crashed child's
  /// swift-backtrace outlived it, blocked for good on its own copy of the child's memory-server
  /// socket. (Swift Testing does the same for exit tests.)
  private static func childEnvironment() -> [String] {
    let inherited = startingEnvironment()
    return inherited.contains { $0.hasPrefix("SWIFT_BACKTRACE=") }
      ? inherited : inherited + ["SWIFT_BACKTRACE=enable=no"]
  }

  /// This process's environment as it started, from /proc (the C `environ` global is not
  /// concurrency-safe).
  private static func startingEnvironment() -> [String] {
    guard let file = fopen("/proc/self/environ", "r") else { return [] }
    defer { fclose(file) }
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 4096)
    while true {
      let count = fread(&chunk, 1, chunk.count, file)
      if count <= 0 { break }
      bytes += chunk[..<count]
    }
    return bytes.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
  }
}

/// An unlinked temporary file that a child process writes to.
private final class CaptureFile {
  let descriptor: Int32

  init() throws {
    var template = Array("/tmp/asyncrunloop-child-XXXXXX".utf8CString)
    descriptor = mkstemp(&template)
    guard descriptor >= 0 else { throw ChildProcess.LaunchError(description: "mkstemp failed") }
    unlink(&template)
  }

  deinit { close(descriptor) }

  func contents() -> String {
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65536)
    var offset: off_t = 0
    while true {
      let count = pread(descriptor, &chunk, chunk.count, offset)
      if count <= 0 { break }
      bytes += chunk[..<count]
      offset += off_t(count)
    }
    return String(decoding: bytes, as: UTF8.self)
  }
}

/// Runs the `MainLoopFixture` scenario `scenario` in a child process (its main thread runs the
/// main loop) and expects it to exit 0 and report "`scenario` ok". Shared by every suite with
/// main-loop scenarios.
func expectScenarioPasses(_ scenario: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
  let run = try ChildProcess.run(ChildProcess.sibling("MainLoopFixture"), arguments: [scenario])
  #expect(run.exitCode == 0, "scenario '\(scenario)' failed: \(run)", sourceLocation: sourceLocation)
  #expect(run.standardOutput.contains("\(scenario) ok"), "\(run)", sourceLocation: sourceLocation)
}
