// Bytes this process has moved through slow storage so far: object-store requests (sent and
// received, replies' headers included, counted as libcurl moves them) and checkpoint shard files
// (written and read). A sign of life for the launch agent's hang watchdog while a worker makes no
// steps: restoring a large checkpoint from the object store before its first step, or writing and
// uploading the last one after its last (train/run.cc's heartbeat, launch/progress.h).
#pragma once

#include <atomic>
#include <cstdint>

namespace tessera::io_progress {

namespace detail {
inline std::atomic<uint64_t> moved{0};
}

inline void add(uint64_t bytes) { detail::moved.fetch_add(bytes, std::memory_order_relaxed); }
inline uint64_t bytes() { return detail::moved.load(std::memory_order_relaxed); }

}  // namespace tessera::io_progress
