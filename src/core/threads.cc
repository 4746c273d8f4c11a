// Thread control shared by Tessera's kernels and oneDNN.
#include "core/threads.h"

#include <fmt/format.h>
#include <sched.h>

namespace tessera {

void set_num_threads(int n) {
  if (n <= 0) {
    const size_t cpus = allowed_cpus().size();
    n = cpus > 0 ? static_cast<int>(cpus) : omp_get_num_procs();
  }
  omp_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

std::vector<int> cpu_block(const std::vector<int>& cpus, int index, int count) {
  if (count <= 0 || index < 0 || index >= count || cpus.size() < static_cast<size_t>(count)) return {};
  const size_t per = cpus.size() / static_cast<size_t>(count);
  const auto begin = cpus.begin() + static_cast<std::ptrdiff_t>(per * static_cast<size_t>(index));
  return {begin, begin + static_cast<std::ptrdiff_t>(per)};
}

bool bind_to_cpus(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) {
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  }
  return sched_setaffinity(0, sizeof(set), &set) == 0;
}

std::string cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? fmt::format("{}", cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace tessera
