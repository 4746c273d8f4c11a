#include "metrics/memory.h"

#include <cstdio>
#include <cstring>

namespace tessera::metrics {

ProcessMemory process_memory() {
  ProcessMemory m;
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return m;
  // Lines "VmHWM:    123 kB" and "VmRSS:    456 kB".
  char line[256];
  long long kib = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "VmHWM: %lld", &kib) == 1) m.peak = static_cast<int64_t>(kib) * 1024;
    if (std::sscanf(line, "VmRSS: %lld", &kib) == 1) m.resident = static_cast<int64_t>(kib) * 1024;
  }
  std::fclose(f);
  return m;
}

}  // namespace tessera::metrics
