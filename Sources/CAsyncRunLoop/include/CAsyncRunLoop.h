// System interfaces for AsyncRunLoop that Glibc's Swift module does not expose.
// Keep this header small: declarations and trivial inline accessors only.
#ifndef C_ASYNC_RUN_LOOP_H
#define C_ASYNC_RUN_LOOP_H

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

// MARK: - Thread-local "current loop" slot

/// The loop whose thread this is (an unretained pointer), or NULL.
/// A thread-local variable dies with its thread, so a new thread that reuses an old thread's
/// id starts with NULL: the "am I on this loop" check cannot be fooled by thread-id reuse.
extern _Thread_local void *_Nullable carl_current_loop_slot;

static inline void *_Nullable carl_current_loop(void) { return carl_current_loop_slot; }
static inline void carl_set_current_loop(void *_Nullable loop) { carl_current_loop_slot = loop; }

/// Registers `destructor` to run with the retained value of the per-thread "owned current loop"
/// when a thread that created its loop lazily exits. Returns 0 on success.
int carl_set_thread_exit_release(void *_Nonnull value, void (*_Nonnull destructor)(void *_Nullable));

// MARK: - Cycle counter

/// The CPU's time-stamp counter (x86-64 `rdtsc`; the virtual counter on arm64), or 0 where there
/// is none. Not serializing: it may be read a few instructions early or late, which is noise
/// next to what the metrics time. Only meaningful where the kernel uses it as its clock source
/// (then it is constant-rate and synchronized across CPUs); the caller checks that.
static inline uint64_t carl_cycle_counter(void) {
#if defined(__x86_64__)
  uint32_t low, high;
  __asm__ __volatile__("rdtsc" : "=a"(low), "=d"(high));
  return ((uint64_t)high << 32) | low;
#elif defined(__aarch64__)
  uint64_t value;
  __asm__ __volatile__("mrs %0, cntvct_el0" : "=r"(value));
  return value;
#else
  return 0;
#endif
}

// MARK: - Small syscall helpers

/// The kernel thread id of the calling thread.
static inline int32_t carl_gettid(void) { return (int32_t)syscall(SYS_gettid); }

/// True when the calling thread is the process's main thread (its tid equals the pid).
static inline int carl_is_main_thread(void) { return carl_gettid() == (int32_t)getpid(); }

/// Names the calling thread (at most 15 bytes are kept); returns 0 or an errno value.
int carl_set_thread_name(const char *_Nonnull name);

/// Pins the calling thread to one CPU; returns 0 or an errno value.
int carl_pin_current_thread(int cpu);

/// The number of CPUs a `cpu_set_t` can name (`CPU_SETSIZE`): valid CPU numbers are below it.
int carl_cpu_set_size(void);

/// The CPUs in the process's affinity mask (`sched_getaffinity` of the process, as `taskset` or a
/// cpuset leaves it), lowest first: writes up to `capacity` of them to `cpus` and returns how many
/// the mask holds, or `-errno` when the mask cannot be read.
int carl_process_allowed_cpus(int *_Nonnull cpus, int capacity);

/// The CPUs the calling thread may run on, as `carl_process_allowed_cpus` (for tests).
int carl_thread_allowed_cpus(int *_Nonnull cpus, int capacity);

/// Narrows the process's affinity mask (its main thread's, which `carl_process_allowed_cpus`
/// reads) to `cpu` alone, as `taskset` would (for tests). Returns 0 or an errno value.
int carl_restrict_process_to_cpu(int cpu);

/// Makes threads created with `attributes` start pinned to `cpu` (0 <= cpu < CPU_SETSIZE):
/// `pthread_create` then fails, creating no thread, when the kernel refuses the pin. Returns 0 or
/// an errno value.
int carl_thread_attributes_pin(pthread_attr_t *_Nonnull attributes, int cpu);

/// Writes the calling thread's name (NUL-terminated, at most 15 bytes) to `name`, which holds
/// `capacity` bytes (16 is enough); returns 0 or an errno value.
int carl_get_thread_name(char *_Nonnull name, size_t capacity);

/// `errno` for Swift.
static inline int carl_errno(void) { return errno; }

/// The data word of an epoll event (a union in C).
static inline uint64_t carl_epoll_event_token(const struct epoll_event *_Nonnull event) {
  return event->data.u64;
}
static inline struct epoll_event carl_epoll_event_make(uint32_t events, uint64_t token) {
  struct epoll_event e;
  e.events = events;
  e.data.u64 = token;
  return e;
}

// MARK: - Futex sleep (a loop that watches no descriptor and no timer sleeps on a futex word)

/// Reads the futex word. Relaxed: the word only decides whether the sleep starts; everything the
/// loop must see is published under its inbox lock.
static inline uint32_t carl_futex_word_load(const uint32_t *_Nonnull word) {
  return __atomic_load_n(word, __ATOMIC_RELAXED);
}

/// Sleeps while `*word == expected` (returns at once when it differs, on a wake-up or a signal).
static inline void carl_futex_wait(uint32_t *_Nonnull word, uint32_t expected) {
  syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

/// Changes the word (so a sleeper that has not started waiting yet does not start) and wakes one
/// sleeper.
static inline void carl_futex_bump_and_wake(uint32_t *_Nonnull word) {
  __atomic_fetch_add(word, 1, __ATOMIC_RELEASE);
  syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

// MARK: - libdispatch main-queue hooks (exported by libdispatch on Linux for CoreFoundation)

/// The main queue's wake-up handle: an eventfd on Linux, readable when the main queue has work.
extern int _dispatch_get_main_queue_handle_4CF(void);
/// Drains the main queue; must be called on the main thread.
extern void _dispatch_main_queue_callback_4CF(void *_Nullable msg);

#endif
