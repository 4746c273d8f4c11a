#include "metrics/memory.h"

#include <cstdio>
#include <cstring>

namespace tessera::metrics {
namespace {

// A "Name:   123 kB" line of /proc/self/status, in bytes.
int64_t status_kib_field(const char* name) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  long long kib = 0;
  const size_t len = std::strlen(name);
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strncmp(line, name, len) == 0 && line[len] == ':') {
      std::sscanf(line + len + 1, "%lld", &kib);
      break;
    }
  }
  std::fclose(f);
  return static_cast<int64_t>(kib) * 1024;
}

}  // namespace

int64_t resident_bytes() { return status_kib_field("VmRSS"); }
int64_t peak_resident_bytes() { return status_kib_field("VmHWM"); }

}  // namespace tessera::metrics
