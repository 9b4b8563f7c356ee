// Test support only: linked into the test binary and the fixtures it launches, never into the
// library or its users' code.
//
// A child process inherits the signal mask of the thread that started it, and tests start their
// children (fixture executables, exit tests) from Dispatch's worker threads, which block
// SIGALRM. A plain alarm(2) in such a child stays pending forever: the watchdog that should turn a
// hang into a failure never fires, and a hung fixture held a CI step until its timeout. So the
// first call starts one thread that unblocks SIGALRM and lives as long as the process; the
// kernel delivers the alarm to it, and SIGALRM's default action ends the process.
#include "CTestAlarm.h"

#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <unistd.h>

static void *carl_test_alarm_receiver(void *unused) {
  (void)unused;
  sigset_t alarmOnly;
  sigemptyset(&alarmOnly);
  sigaddset(&alarmOnly, SIGALRM);
  pthread_sigmask(SIG_UNBLOCK, &alarmOnly, NULL);
  for (;;) pause();
  return NULL;
}

static void carl_test_start_alarm_receiver(void) {
  signal(SIGALRM, SIG_DFL);
  pthread_t thread;
  pthread_attr_t attributes;
  pthread_attr_init(&attributes);
  pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&thread, &attributes, carl_test_alarm_receiver, NULL) != 0) {
    // No thread: the alarm goes to the caller's thread, which must outlive it.
    sigset_t alarmOnly;
    sigemptyset(&alarmOnly);
    sigaddset(&alarmOnly, SIGALRM);
    pthread_sigmask(SIG_UNBLOCK, &alarmOnly, NULL);
  }
  pthread_attr_destroy(&attributes);
}

unsigned carl_test_arm_alarm(unsigned seconds) {
  static pthread_once_t started = PTHREAD_ONCE_INIT;
  pthread_once(&started, carl_test_start_alarm_receiver);
  return alarm(seconds);
}
