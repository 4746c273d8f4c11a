// What a warp's lanes do together in the CPU emulation (emu_runtime.cc): the barrier, the
// exchanges that shuffles and the warp-wide matrix operations (emu_mma.h) are built on, and the
// checks those make.
#pragma once

#include <cstddef>
#include <cstdint>

namespace emu {

void warp_sync(unsigned mask);
// Every lane of the warp passes `bytes` (at most kGatherBytes) and gets every lane's, in lane order,
// in `all` (room for 32); returns the warp's lanes (32 but in a block's last, partial warp).
constexpr size_t kGatherBytes = 32;
unsigned warp_gather(const void* mine, size_t bytes, void* all);
uint32_t warp_exchange(uint32_t v, unsigned src_lane);  // the value src_lane of this warp passed
unsigned lane_id();                                     // this thread's lane in its warp
// Fails unless [p, p + bytes) lies in the running block's dynamic shared memory.
void check_dynamic_smem(const void* p, size_t bytes, const char* what);

}  // namespace emu
