import Glibc
import Testing

@testable import AsyncRunLoop

// Helpers for the tests of the chunked inbox (blocks and changes in chunks of 1,024, blocks adopted after
// the lock is released, the change barrier and bounded passes), timers deferred as busy, exact
// delivery counts of command sources, and what members leave behind. Blocking work runs on threads
// of the tests' own; results are checked after the watchdog returns.

let barrierModeA: RunLoopMode = "barrier-mode-a"

let barrierModeB: RunLoopMode = "barrier-mode-b"
