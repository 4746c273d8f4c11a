// CPU rotary embedding from a cos/sin table built once per run.
#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

#include "core/threads.h"

namespace tessera::kernels::cpu {

void rope_table(float* table, int64_t T, int64_t D, float theta) {
  std::vector<double> inv_freq(static_cast<size_t>(D / 2));
  for (int64_t i = 0; i < D / 2; ++i)
    inv_freq[static_cast<size_t>(i)] = std::pow(static_cast<double>(theta), -2.0 * i / D);
  rope_table(table, T, D, inv_freq.data());
}

void rope_table(float* table, int64_t T, int64_t D, const double* inv_freq) {
  const int64_t half = D / 2;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      // Angles in double: at t ~ 4096 a float angle loses the low bits that set the rotation.
      const double angle = static_cast<double>(t) * inv_freq[i];
      table[(t * half + i) * 2] = static_cast<float>(std::cos(angle));
      table[(t * half + i) * 2 + 1] = static_cast<float>(std::sin(angle));
    }
  }
}

namespace {
// sign = +1 rotates forward, -1 applies the transpose (the gradient of the rotation).
void rotate(float* x, const float* table, int64_t B, int64_t T, int64_t n_heads, int64_t D, int64_t stride,
            float sign) {
  const int64_t half = D / 2;
  parallel_for(B * T, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const float* cs = table + (row % T) * half * 2;
      float* xr = x + row * stride;
      for (int64_t h = 0; h < n_heads; ++h) {
        float* xh = xr + h * D;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float c = cs[2 * i], s = sign * cs[2 * i + 1];
          const float a = xh[2 * i], b = xh[2 * i + 1];
          xh[2 * i] = a * c - b * s;
          xh[2 * i + 1] = a * s + b * c;
        }
      }
    }
  });
}
}  // namespace

void rope_forward(float* x, const float* table, int64_t B, int64_t T, int64_t n_heads, int64_t D, int64_t stride) {
  rotate(x, table, B, T, n_heads, D, stride, 1.0f);
}

void rope_backward(float* dx, const float* table, int64_t B, int64_t T, int64_t n_heads, int64_t D, int64_t stride) {
  rotate(dx, table, B, T, n_heads, D, stride, -1.0f);
}

}  // namespace tessera::kernels::cpu
