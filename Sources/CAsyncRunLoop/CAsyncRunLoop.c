#define _GNU_SOURCE
#include "CAsyncRunLoop.h"

_Thread_local void *carl_current_loop_slot = NULL;

static pthread_key_t carl_exit_key;
static pthread_once_t carl_exit_key_once = PTHREAD_ONCE_INIT;
static void (*carl_exit_destructor)(void *) = NULL;

static void carl_run_exit_destructor(void *value) {
  void (*destructor)(void *) = __atomic_load_n(&carl_exit_destructor, __ATOMIC_ACQUIRE);
  if (destructor != NULL && value != NULL) {
    destructor(value);
  }
}

static void carl_make_exit_key(void) { pthread_key_create(&carl_exit_key, carl_run_exit_destructor); }

int carl_set_thread_exit_release(void *value, void (*destructor)(void *)) {
  pthread_once(&carl_exit_key_once, carl_make_exit_key);
  // Every caller passes the same function; atomic because threads register concurrently.
  __atomic_store_n(&carl_exit_destructor, destructor, __ATOMIC_RELEASE);
  return pthread_setspecific(carl_exit_key, value);
}

int carl_pin_current_thread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

int carl_cpu_set_size(void) { return CPU_SETSIZE; }

static int carl_allowed_cpus(pid_t pid, int *cpus, int capacity) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(pid, sizeof(set), &set) != 0) {
    return -errno;
  }
  int count = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
    if (CPU_ISSET(cpu, &set)) {
      if (count < capacity) {
        cpus[count] = cpu;
      }
      count++;
    }
  }
  return count;
}

int carl_process_allowed_cpus(int *cpus, int capacity) { return carl_allowed_cpus(getpid(), cpus, capacity); }

int carl_thread_allowed_cpus(int *cpus, int capacity) { return carl_allowed_cpus(0, cpus, capacity); }

int carl_restrict_process_to_cpu(int cpu) {
  if (cpu < 0 || cpu >= CPU_SETSIZE) {
    return EINVAL;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return sched_setaffinity(getpid(), sizeof(set), &set) == 0 ? 0 : errno;
}

int carl_thread_attributes_pin(pthread_attr_t *attributes, int cpu) {
  if (cpu < 0 || cpu >= CPU_SETSIZE) {
    return EINVAL;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_attr_setaffinity_np(attributes, sizeof(set), &set);
}

int carl_set_thread_name(const char *name) { return pthread_setname_np(pthread_self(), name); }

int carl_get_thread_name(char *name, size_t capacity) { return pthread_getname_np(pthread_self(), name, capacity); }
