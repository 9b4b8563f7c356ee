import AsyncRunLoop
import Glibc

// A process whose main thread runs the main loop. Usage: MainLoopFixture <scenario>.
// This is a synchronous top-level program (no `await` here), the way an application starts the
// main loop: set up, then `runMainLoop()` on the main thread.

startWatchdog()
let scenario = CommandLine.arguments.dropFirst().first ?? ""
switch scenario {
case "threads": threadsScenario()
case "inline": inlineScenario()
case "order": orderScenario()
case "values": valuesScenario()
case "not-running": notRunningScenario()
case "nested-stop": nestedStopScenario()
case "nested-run-main-loop": nestedRunMainLoopScenario()
case "shutdown": shutdownScenario()
case "raw-run": rawRunScenario()
case "perform-and-wait-stopped": performAndWaitStoppedScenario()
case "main-actor-nested-run": mainActorNestedRunScenario()
case "main-actor-modal": mainActorModalScenario()
case "main-shutdown-late-jobs": mainShutdownLateJobsScenario()
case "main-actor-private-modal": mainActorPrivateModalScenario()
case "main-sequences": mainSequencesScenario()
case "run-on-main-returns": runOnMainReturnsToTheCallersExecutorScenario()
case "main-wait-vs-stop": mainWaitVersusStopScenario()
case "main-pinned-nested-run": mainPinnedNestedRunScenario()
case "main-modal-stack": mainModalStackScenario()
case "main-late-common-mode": mainLateCommonModeScenario()
case "main-shutdown-waiters": mainShutdownWaitersScenario()
case "main-shutdown-sleeps": mainShutdownSleepsScenario()
case "main-queued-before-run": mainQueuedBeforeRunScenario()
case "stop-keeps-accepted-work": stopKeepsAcceptedWorkScenario()
case "early-waiters": earlyWaitersScenario()
case "lost-main-queue": lostMainQueueScenario()
case "shutdown-keeps-accepted-work": shutdownKeepsAcceptedWorkScenario()
case "stop-then-shutdown": stopThenShutdownScenario()
default: fail("unknown scenario '\(scenario)'")
}
say("\(scenario) ok")
exit(0)
