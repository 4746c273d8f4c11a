// Thread control and a static parallel-for over OpenMP, the runtime oneDNN also uses, so the
// two never fight over cores. Static partitioning makes results depend only on the thread count.
#pragma once

#include <omp.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

// Sets the threads used by every kernel and by oneDNN. 0 means one per available core.
void set_num_threads(int n);
int num_threads();

// The CPUs this thread may run on (sched_getaffinity), in increasing order.
std::vector<int> allowed_cpus();
// Block `index` of `count` equal, contiguous blocks of `cpus`: size / count CPUs each (the
// remainder is in no block, so that every block is as fast as the others); empty where there
// are fewer CPUs than blocks.
std::vector<int> cpu_block(const std::vector<int>& cpus, int index, int count);
// Binds the calling thread, and the threads it starts from then on, to `cpus`; false with errno
// set where the kernel refuses.
bool bind_to_cpus(const std::vector<int>& cpus);
// "0-3,8,10-11".
std::string cpu_list(const std::vector<int>& cpus);

// Calls fn(begin, end) on contiguous ranges covering [0, n), one range per thread.
template <typename Fn>
void parallel_for(int64_t n, Fn&& fn) {
  if (n <= 0) return;
  const int threads = omp_get_max_threads();
  if (threads <= 1 || n == 1 || omp_in_parallel()) {
    fn(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t begin = n * t / nt, end = n * (t + 1) / nt;
    if (begin < end) fn(begin, end);
  }
}

// Calls fn(i, thread) for each i in [0, n), each thread taking the next item when it is free
// (for a few heavy items such as attention heads; fn must not let its result depend on `thread`,
// which only names the thread's own scratch). Items of equal work still end unevenly on a shared
// machine, where one CPU stalls for a while: handing them out as threads come free made the CPU
// attention 11-14% faster than fixed shares at 2 threads (Zen 5, bench shapes).
template <typename Fn>
void parallel_for_each(int64_t n, Fn&& fn) {
  if (n <= 0) return;
  const int threads = omp_get_max_threads();
  if (threads <= 1 || n == 1 || omp_in_parallel()) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) fn(i, omp_get_thread_num());
}

}  // namespace tessera
