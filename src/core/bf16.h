// bfloat16: the upper half of an IEEE float. Conversions round to nearest even; NaN stays NaN.
#pragma once

#include <bit>
#include <cstdint>

namespace tessera {

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Whole arrays, vectorizable.
inline void f32_to_bf16(const float* in, uint16_t* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(in[i]);
}
inline void bf16_to_f32(const uint16_t* in, float* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(in[i]);
}

}  // namespace tessera
