// bfloat16: the upper half of an IEEE float. Conversions round to nearest even; NaN stays NaN.
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

namespace tessera {

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Stores v as a kernel's output type: a float as is, or rounded to bf16 (for kernels that write
// either, templated on the output type).
inline void store_as(float* out, float v) { *out = v; }
inline void store_as(uint16_t* out, float v) { *out = f32_to_bf16(v); }

// Whole arrays, vectorizable.
inline void f32_to_bf16(const float* in, uint16_t* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(in[i]);
}
inline void bf16_to_f32(const uint16_t* in, float* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(in[i]);
}

// n outputs of type Out that row(float* dst) computes in fp32: straight into out (float), or into
// `scratch` (n floats) and rounded from there (bf16). Where row calls one compiled function (not
// inlined), the bf16 outputs are the fp32 ones' bits rounded; one expression inlined into two
// loops may be vectorized two ways (GCC did SwiGLU's gate gradient at F = 1408, one ulp apart).
template <typename Out, typename Row>
void write_rounded(Out* out, int64_t n, float* scratch, Row&& row) {
  if constexpr (std::is_same_v<Out, float>) {
    (void)n, (void)scratch;
    row(out);
  } else {
    row(scratch);
    f32_to_bf16(scratch, out, n);
  }
}

}  // namespace tessera
