// Thread control shared by Tessera's kernels and oneDNN.
#include "core/threads.h"

#include <sched.h>

namespace tessera {

void set_num_threads(int n) {
  if (n <= 0) {
    cpu_set_t set;
    n = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : omp_get_num_procs();
  }
  omp_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace tessera
