// Bytes this process has moved through slow storage so far: object-store requests (sent and
// received, replies' headers included, counted as libcurl moves them) and checkpoint shard files
// (written and read). A sign of life for the launch agent's hang watchdog while a worker makes no
// steps: restoring a large checkpoint from the object store before its first step, or writing and
// uploading the last one after its last (train/run.cc's heartbeat, launch/progress.h).
//
// Beside them, the bytes relayed: those another node's upload or load moved while this process
// waited for it (checkpoint/storage_progress.h). They show in the heartbeat too, but are never
// published as moved, so two waiting processes cannot keep each other alive.
#pragma once

#include <atomic>
#include <cstdint>

namespace tessera::io_progress {

namespace detail {
inline std::atomic<uint64_t> moved{0};
inline std::atomic<uint64_t> relayed{0};
}  // namespace detail

inline void add(uint64_t bytes) { detail::moved.fetch_add(bytes, std::memory_order_relaxed); }
inline uint64_t moved() { return detail::moved.load(std::memory_order_relaxed); }

inline void relay(uint64_t bytes) { detail::relayed.fetch_add(bytes, std::memory_order_relaxed); }
// Moved and relayed: what the heartbeat's io line shows.
inline uint64_t seen() { return moved() + detail::relayed.load(std::memory_order_relaxed); }

}  // namespace tessera::io_progress
