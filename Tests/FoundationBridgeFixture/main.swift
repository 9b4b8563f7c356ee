import Foundation

// A process whose main thread runs Foundation's and AsyncRunLoop's main loops, bridged. Usage:
// FoundationBridgeFixture <scenario>. Synchronous top-level code, as an application starts.

startWatchdog()
let scenario = CommandLine.arguments.dropFirst().first ?? ""
switch scenario {
case "our-driver-timers": ourDriverTimersScenario()
case "foundation-driver-timers": foundationDriverTimersScenario()
case "foundation-driver-between-runs": foundationDriverBetweenRunsScenario()
case "foundation-driver-shutdown-between-runs": foundationDriverShutdownBetweenRunsScenario()
case "posts-into-our-loop": postsIntoOurLoopScenario()
case "posts-into-foundation": postsIntoFoundationScenario()
case "our-shutdown-under-foundation": ourShutdownUnderFoundationScenario()
case "foundation-work-survives-our-stop": foundationWorkSurvivesOurStopScenario()
case "foundation-work-survives-our-shutdown": foundationWorkSurvivesOurStopScenario(shutsDown: true)
case "foundation-modal-in-our-callout": foundationModalInOurCalloutScenario()
case "our-modal-in-foundation-callout": ourModalInFoundationCalloutScenario()
case "main-sequences-under-our-driver": mainSequencesScenario(foundationDrives: false)
case "main-sequences-under-foundation": mainSequencesScenario(foundationDrives: true)
case "hang":
  startWatchdog(seconds: 1)
  while true { pause() }
default: fail("unknown scenario '\(scenario)'")
}
say("\(scenario) ok")
exit(0)
