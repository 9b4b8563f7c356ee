// What tests need of child processes (see CTestChildProcess.c): a watchdog alarm that fires,
// and children that inherit none of the test binary's descriptors.
#pragma once

#include <spawn.h>

/// How much longer every watchdog and wait of the tests allows: ASYNC_RUN_LOOP_WATCHDOG_SCALE
/// (CI raises it for the sanitizer runs, where everything is many times slower) when it is a
/// whole number from 1 up, clamped to 1000; 1 when it is unset or anything else. The one reading
/// of the setting: the Swift test targets' `watchdogScale` and the alarm below use it.
unsigned carl_test_watchdog_scale(void);

/// Ends the process with SIGALRM `seconds` times `carl_test_watchdog_scale()` from now, as
/// alarm(2) does (0 cancels a pending one), whatever signal mask the process was started with.
void carl_test_arm_alarm(unsigned seconds);

/// Adds to `actions` the closing of every descriptor from 3 up in the child; 0, or an error.
int carl_test_spawn_close_inherited(posix_spawn_file_actions_t *actions);
