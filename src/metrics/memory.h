// This process's memory as the kernel counts it.
#pragma once

#include <cstdint>

namespace tessera::metrics {

struct ProcessMemory {
  int64_t resident = 0;  // resident set size now (VmRSS), bytes
  int64_t peak = 0;      // its peak so far (VmHWM), bytes
};

// Both figures from one read of /proc/self/status; zeros where it is unreadable.
ProcessMemory process_memory();

}  // namespace tessera::metrics
