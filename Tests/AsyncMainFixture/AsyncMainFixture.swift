@_spi(ExperimentalCustomExecutors) import AsyncRunLoop
import CTestChildProcess
import Glibc

// A process whose `async` main runs on the main loop through AsyncRunLoopExecutorFactory. Usage:
// AsyncMainFixture <scenario>. AsyncMainOnMainLoopTests launch it once per scenario; a scenario
// prints what it checked and returns (exit 0), or prints "FAIL: …" to stderr and exits 1.

@main
struct AsyncMainFixture {
  typealias DefaultExecutorFactory = AsyncRunLoopExecutorFactory

  static func main() async {
    carl_test_arm_alarm(60)  // (times the watchdog scale) a hung scenario dies instead of hanging
    let scenario = CommandLine.arguments.dropFirst().first ?? ""
    check(isOnMainThread, "main started off the main thread")
    switch scenario {
    case "call-order": await callOrderScenario()
    case "isolation": await isolationScenario()
    case "members": await mainLoopMembersScenario()
    case "nested-and-modal": await nestedAndModalScenario()
    case "stop-keeps-accepted-work": await stopKeepsAcceptedWorkScenario()
    case "sleep": await sleepScenario()
    case "wait-from-early-thread": await waitFromEarlyThreadScenario()
    case "shutdown": await shutdownScenario()
    default: fail("unknown scenario '\(scenario)'")
    }
    check(isOnMainThread, "main ended off the main thread")
    say("\(scenario) ok")
  }
}
