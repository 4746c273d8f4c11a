// The warp-wide matrix instructions tessera's tensor-core kernels use (kernels/cuda/mma.cuh), for
// the CPU emulation: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 and
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16. Included by emu_device.h.
//
// Each lane holds only its share of a fragment, at the positions NVIDIA's PTX ISA gives ("Matrix
// fragments for mma.m16n8k16", "ldmatrix"); with g = lane / 4 and t = lane % 4:
//   A (16 x 16, row):  a[0] = (g, 2t..2t+1)   a[1] = (g+8, 2t..)   a[2] = (g, 8+2t..)   a[3] = (g+8, 8+2t..)
//   B (16 x 8, col):   b[0] = (k 2t..2t+1, n g)   b[1] = (k 8+2t.., n g)
//   C, D (16 x 8):     d[0], d[1] = (g, 2t), (g, 2t+1)   d[2], d[3] = (g+8, 2t), (g+8, 2t+1)
// a 32-bit register holding two bf16s, the lower-indexed in its low half. The instructions gather
// the whole warp's operands (warp_gather) and each lane computes its own share, so a kernel that
// places an element where the device would not computes wrong values here too.
#pragma once

#include <cstdint>
#include <cstring>

#include "emu_warp.h"

namespace emu {

[[noreturn]] void fatal(const char* fmt, ...);

namespace mma_detail {
inline void whole_warp(unsigned lanes, const char* op) {
  if (lanes != 32) fatal("%s in a warp of %u threads (the instruction takes all 32)", op, lanes);
}
inline float bf16_at(uint32_t pair, int half) {
  const uint32_t bits = half ? pair & 0xffff0000u : pair << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
}  // namespace mma_detail

// d += a b: fp32 products of the bf16 operands (exact) summed over k in order onto d.
inline void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  struct Operands {
    uint32_t a[4], b[2];
  } mine{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}}, all[32];
  mma_detail::whole_warp(warp_gather(&mine, sizeof mine, all), "mma.sync");
  using mma_detail::bf16_at;
  const auto A = [&](int r, int k) { return bf16_at(all[(r % 8) * 4 + (k % 8) / 2].a[r / 8 + 2 * (k / 8)], k % 2); };
  const auto B = [&](int k, int n) { return bf16_at(all[n * 4 + (k % 8) / 2].b[k / 8], k % 2); };
  const int g = static_cast<int>(lane_id() / 4), t = static_cast<int>(lane_id() % 4);
  for (int i = 0; i < 4; ++i) {
    const int r = g + 8 * (i / 2), c = 2 * t + i % 2;
    float s = d[i];
    for (int k = 0; k < 16; ++k) s += A(r, k) * B(k, c);
    d[i] = s;
  }
}

// Four 8 x 8 matrices of 16-bit elements from shared memory: lane 8j + i gives the address of row i
// of matrix j (16 bytes, 16-byte aligned), and r[j] is matrix j's (row lane / 4, elements 2 (lane % 4)
// and the next), or with `trans` its transpose's: (rows 2 (lane % 4) and the next, element lane / 4).
inline void ldmatrix_x4(uint32_t (&r)[4], const void* row, bool trans) {
  if (reinterpret_cast<uintptr_t>(row) % 16 != 0) fatal("ldmatrix: row address %p not 16-byte aligned", row);
  check_dynamic_smem(row, 16, "ldmatrix");
  const void* rows[32];
  mma_detail::whole_warp(warp_gather(&row, sizeof row, rows), "ldmatrix");
  const unsigned g = lane_id() / 4, t = lane_id() % 4;
  for (int j = 0; j < 4; ++j) {
    const auto* m = rows + 8 * j;
    if (!trans) {
      std::memcpy(&r[j], static_cast<const char*>(m[g]) + 4 * t, 4);
    } else {
      uint16_t lo, hi;
      std::memcpy(&lo, static_cast<const char*>(m[2 * t]) + 2 * g, 2);
      std::memcpy(&hi, static_cast<const char*>(m[2 * t + 1]) + 2 * g, 2);
      r[j] = lo | static_cast<uint32_t>(hi) << 16;
    }
  }
}

}  // namespace emu
