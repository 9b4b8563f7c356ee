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
case "round3-main-actor-nested-run": mainActorNestedRunScenario()
case "round3-main-actor-modal": mainActorModalScenario()
case "round3-main-shutdown-late-jobs": mainShutdownLateJobsScenario()
case "round3-main-actor-private-modal": mainActorPrivateModalScenario()
case "round6-main-sequences": round6MainSequencesScenario()
case "round6-run-on-main-returns": round6RunOnMainReturnsToTheCallersExecutorScenario()
case "round9-wait-vs-stop": round9WaitVersusStopScenario()
case "round9-pinned-nested": round9PinnedNestedRunScenario()
case "round9-modal-stack": round9ModalStackScenario()
case "round9-late-common": round9LateCommonModeScenario()
case "round9-shutdown-waiters": round9ShutdownWaitersScenario()
case "round9-shutdown-sleeps": round9ShutdownSleepsScenario()
case "round20-queued-before-run": round20QueuedBeforeRunScenario()
case "stop-keeps-accepted-work": stopKeepsAcceptedWorkScenario()
case "early-waiters": earlyWaitersScenario()
case "lost-main-queue": lostMainQueueScenario()
default: fail("unknown scenario '\(scenario)'")
}
say("\(scenario) ok")
exit(0)
