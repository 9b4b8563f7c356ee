// Test support only: linked into the test binary and the fixtures it launches, never into the
// library or its users' code.
//
// The alarm. A child process inherits the signal mask of the thread that started it, and tests
// start their children (fixture executables) from Dispatch's worker threads, which block
// SIGALRM. A plain alarm(2) in such a child stays pending forever: the watchdog that should turn
// a hang into a failure never fires. So the first call starts one thread that unblocks SIGALRM
// and lives as long as the process; the kernel delivers the alarm to it, and SIGALRM's default
// action ends the process.
//
// The descriptors. A child started with posix_spawn inherits every descriptor of the test
// binary not marked close-on-exec: pipes to the symbolizer ThreadSanitizer started, `swift
// test`'s output pipe. A child that outlives the test, or something the child starts (the Swift
// runtime's swift-backtrace, when the child crashes), keeps their readers waiting for an end that
// never comes: `swift test` once never returned after every test had passed.
#define _GNU_SOURCE
#include "CTestChildProcess.h"

#include <dirent.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

static void carl_test_unblock_alarm(void) {
  sigset_t alarmOnly;
  sigemptyset(&alarmOnly);
  sigaddset(&alarmOnly, SIGALRM);
  pthread_sigmask(SIG_UNBLOCK, &alarmOnly, NULL);
}

static void *carl_test_alarm_receiver(void *unused) {
  (void)unused;
  carl_test_unblock_alarm();
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
    carl_test_unblock_alarm();  // no thread: the caller's thread takes it, and must outlive it
  }
  pthread_attr_destroy(&attributes);
}

unsigned carl_test_watchdog_scale(void) {
  const char *setting = getenv("ASYNC_RUN_LOOP_WATCHDOG_SCALE");
  if (!setting) return 1;
  char *end = NULL;
  long scale = strtol(setting, &end, 10);
  if (end == setting || *end != '\0' || scale < 1) return 1;
  return scale > 1000 ? 1000 : (unsigned)scale;
}

void carl_test_arm_alarm(unsigned seconds) {
  static pthread_once_t started = PTHREAD_ONCE_INIT;
  pthread_once(&started, carl_test_start_alarm_receiver);
  unsigned long long scaled = (unsigned long long)seconds * (unsigned long long)carl_test_watchdog_scale();
  alarm(scaled > UINT_MAX ? UINT_MAX : (unsigned)scaled);
}

int carl_test_spawn_close_inherited(posix_spawn_file_actions_t *actions) {
#if defined(__GLIBC_PREREQ) && __GLIBC_PREREQ(2, 34)
  return posix_spawn_file_actions_addclosefrom_np(actions, 3);
#else
  // Older C libraries: close what is open now (a descriptor opened meanwhile by another thread
  // may still be inherited).
  DIR *open = opendir("/proc/self/fd");
  if (!open) return -1;
  int listing = dirfd(open);
  int status = 0;
  for (struct dirent *entry; status == 0 && (entry = readdir(open));) {
    int descriptor = atoi(entry->d_name);
    if (descriptor >= 3 && descriptor != listing) status = posix_spawn_file_actions_addclose(actions, descriptor);
  }
  closedir(open);
  return status;
#endif
}
