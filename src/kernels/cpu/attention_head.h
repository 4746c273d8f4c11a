// What the CPU attentions (attention.cc, attention_tiles.cc) share: a head's rows in the fused
// qkv tensor, and the query tile they both work in.
#pragma once

#include <cstdint>

namespace tessera::kernels::cpu::attention_detail {

constexpr int64_t kTile = 64;  // query rows per tile

struct Head {
  const float* q;  // (T, D), row stride `stride`
  const float* k;
  const float* v;
  int64_t stride;
};

// Query head h of sequence b in qkv (B, T, (H + 2 Hkv) D), with its group's key and value heads.
inline Head head_of(const float* qkv, int64_t b, int64_t h, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  const int64_t stride = (H + 2 * Hkv) * D;
  const int64_t g = h / (H / Hkv);
  const float* base = qkv + b * T * stride;
  return {base + h * D, base + (H + g) * D, base + (H + Hkv + g) * D, stride};
}

}  // namespace tessera::kernels::cpu::attention_detail
