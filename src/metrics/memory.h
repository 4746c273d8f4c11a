// This process's memory as the kernel counts it.
#pragma once

#include <cstdint>

namespace tessera::metrics {

// Resident set size now, and its peak so far (VmHWM), in bytes; 0 where /proc is unreadable.
int64_t resident_bytes();
int64_t peak_resident_bytes();

}  // namespace tessera::metrics
