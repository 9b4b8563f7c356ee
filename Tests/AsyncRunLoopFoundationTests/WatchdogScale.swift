import CTestChildProcess

/// How much longer every deadline of these tests allows: `ASYNC_RUN_LOOP_WATCHDOG_SCALE` (CI
/// raises it for the sanitizer runs, where everything is many times slower), 1 by default — read
/// as the core tests and the fixtures' alarms read it (`carl_test_watchdog_scale`).
var watchdogScale: Int { Int(carl_test_watchdog_scale()) }
