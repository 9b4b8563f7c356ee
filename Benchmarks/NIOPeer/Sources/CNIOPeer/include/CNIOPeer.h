#ifndef CNIOPEER_H
#define CNIOPEER_H

// System calls the Glibc module does not expose (futex, gettid) and thread helpers for the
// benchmark, copied in spirit from CAsyncRunLoop (a target of the root package, not a product).

#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

static inline int32_t cnp_gettid(void) { return (int32_t)syscall(SYS_gettid); }

static inline int cnp_errno(void) { return errno; }

/// Pins the calling thread to one CPU; returns 0 or an errno value.
int cnp_pin_current_thread(int cpu);

/// Names the calling thread (at most 15 bytes are kept).
int cnp_set_thread_name(const char *_Nonnull name);

static inline struct epoll_event cnp_epoll_event_make(uint32_t events, uint64_t token) {
  struct epoll_event e;
  e.events = events;
  e.data.u64 = token;
  return e;
}

static inline uint32_t cnp_futex_word_load(const uint32_t *_Nonnull word) {
  return __atomic_load_n(word, __ATOMIC_RELAXED);
}

static inline void cnp_futex_wait(uint32_t *_Nonnull word, uint32_t expected) {
  syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static inline void cnp_futex_bump_and_wake(uint32_t *_Nonnull word) {
  __atomic_fetch_add(word, 1, __ATOMIC_RELEASE);
  syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

#endif
