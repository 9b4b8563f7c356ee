#include "CNIOPeer.h"

int cnp_pin_current_thread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

int cnp_set_thread_name(const char *name) { return pthread_setname_np(pthread_self(), name); }
