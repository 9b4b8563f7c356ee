// Test harness only: linked into the test binary, never into the library or its users' code.
//
// Many tests block the thread they run on (a synchronous test waits for a loop thread; an exit
// test waits for its child process). Swift Concurrency's global executor on Linux is a Dispatch
// queue as wide as the machine has CPUs: two threads on a 2-core machine, so two such waits at
// once stalled every other test, and async tests failed their watchdogs. With cooperative queues
// off, the runtime uses Dispatch's ordinary global queue, which adds threads while others block.
//
// Swift Testing also starts every test case at once, over 900 of them. In a bounded stress run
// (CI's, 3x load), tests that take 10 ms finished only after 72 s, and dozens of watchdogs fired
// together: the process was saturated, not hung. At most 16 test cases run at once now. With
// that, the same stress run passed (2,265 runs, 124 s), and a plain run of the suite took 28 s
// (33-36 s without the cap).
//
// Set before main, before the runtime and the testing library read their environment; an
// explicit setting wins.
//
// And an exit test's child (the test binary again, started by Swift Testing with
// SWT_EXIT_TEST_ID set) arms a watchdog alarm before main: Swift Testing waits for the child with
// no limit, so a child that blocked where it should have exited would hold the whole run. Bodies
// that need a different bound call armChildAlarm(_:) themselves.
#include <stdlib.h>

#include "CTestChildProcess.h"

__attribute__((constructor)) static void carl_test_harness_prepare_process(void) {
  setenv("SWIFT_DEBUG_CONCURRENCY_ENABLE_COOPERATIVE_QUEUES", "false", 0);
  setenv("SWT_EXPERIMENTAL_MAXIMUM_PARALLELIZATION_WIDTH", "16", 0);
  if (getenv("SWT_EXIT_TEST_ID") != NULL) carl_test_arm_alarm(120);
}
