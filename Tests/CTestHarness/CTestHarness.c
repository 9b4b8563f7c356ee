// Test harness only: linked into the test binary, never into the library or its users' code.
//
// Many tests block the thread they run on (a synchronous test waits for a loop thread; an exit
// test waits for its child process). Swift Concurrency's global executor on Linux is a Dispatch
// queue as wide as the machine has CPUs: two threads on a 2-core machine, so two such waits at
// once stalled every other test, and async tests failed their watchdogs. With cooperative queues
// off, the runtime uses Dispatch's ordinary global queue, which adds threads while others block.
// Set before main, before the runtime reads its environment; an explicit setting wins.
#include <stdlib.h>

__attribute__((constructor)) static void carl_test_harness_widen_global_executor(void) {
  setenv("SWIFT_DEBUG_CONCURRENCY_ENABLE_COOPERATIVE_QUEUES", "false", 0);
}
