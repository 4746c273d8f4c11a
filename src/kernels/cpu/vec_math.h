// Vectorizable elementary functions for CPU kernels. glibc's expf does not vectorize without
// -ffast-math, and softmax, cross-entropy and SwiGLU call exp once per element of tensors with
// up to 10^8 elements per step; this version is branch-free so `omp simd` loops vectorize it.
#pragma once

#include <bit>
#include <cstdint>

namespace tessera::kernels::cpu {

// exp(x) within 2 ulp for x in [-87.3, 88.7]; FLT_MIN below that range (negligible in every sum
// it enters here), +inf above.
#pragma omp declare simd
inline float exp_fast(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  x = x < -87.33654f ? -87.33654f : x;
  const bool overflow = x > 88.72283f;
  // n = round(x / ln2); r = x - n ln2 in [-ln2/2, ln2/2], split to keep r exact.
  const float n = __builtin_rintf(x * kLog2e);
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  // Cephes' minimax polynomial for e^r on that interval.
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // Scale by 2^n in two steps so that n = -126..-127 (subnormal results) stays representable.
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni / 2, n2 = ni - n1;
  const float s1 = std::bit_cast<float>((n1 + 127) << 23), s2 = std::bit_cast<float>((n2 + 127) << 23);
  const float result = p * s1 * s2;
  return overflow ? __builtin_inff() : result;
}

#pragma omp declare simd
inline float sigmoid_fast(float x) { return 1.0f / (1.0f + exp_fast(-x)); }

}  // namespace tessera::kernels::cpu
