// The test process's harness settings, applied before main (see CTestHarness.c).
#pragma once
