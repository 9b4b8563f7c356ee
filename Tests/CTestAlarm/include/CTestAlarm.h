// A process watchdog for test fixtures and exit-test children (see CTestAlarm.c).
#pragma once

/// Ends the process with SIGALRM `seconds` from now, as alarm(2) does (0 cancels a pending one;
/// returns the seconds that were left of it), whatever signal mask the process was started with.
unsigned carl_test_arm_alarm(unsigned seconds);
