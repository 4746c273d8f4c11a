// CPU RMSNorm. Rows go to threads; dweight is reduced over rows by channel ranges, so no thread
// ever adds into another's output and results depend only on the thread count.
#include "kernels/cpu/rms_norm.h"

#include <cmath>
#include <type_traits>

#include "core/bf16.h"
#include "core/threads.h"
#include "kernels/cpu/vector.h"

namespace tessera::kernels::cpu {

namespace {
// One row in fp32: out (C) and its rstd, returned. Not inlined, for write_rounded.
[[gnu::noinline]] float forward_row(float* o, const float* x, const float* weight, int64_t C, float eps) {
  float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
  for (int64_t c = 0; c < C; ++c) ss += x[c] * x[c];
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) o[c] = x[c] * r * weight[c];
  return r;
}

template <typename Out>
void forward(Out* out, float* rstd, const float* x, const float* weight, int64_t n, int64_t C, float eps) {
  parallel_for(n, [&](int64_t begin, int64_t end) {
    float* scratch = std::is_same_v<Out, float> ? nullptr : thread_row(C);
    for (int64_t i = begin; i < end; ++i) {
      write_rounded(out + i * C, C, scratch, [&](float* o) { rstd[i] = forward_row(o, x + i * C, weight, C, eps); });
    }
  });
}
}  // namespace

void rms_norm_forward(float* out, float* rstd, const float* x, const float* weight, int64_t n, int64_t C, float eps) {
  forward(out, rstd, x, weight, n, C, eps);
}

void rms_norm_forward_bf16(uint16_t* out, float* rstd, const float* x, const float* weight, int64_t n, int64_t C,
                           float eps) {
  forward(out, rstd, x, weight, n, C, eps);
}

void rms_norm_backward(float* dx, float* dweight, const float* dout, const float* x, const float* weight,
                       const float* rstd, int64_t n, int64_t C) {
  // y = x * r * w with r = (mean(x^2)+eps)^-1/2:  dx = r * (g*w) - x * r^3 * mean(g*w*x).
  parallel_for(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* xi = x + i * C;
      const float* gi = dout + i * C;
      const float r = rstd[i];
      // A local copy of the captured pointer: read through the closure, `omp simd` turns each
      // weight[c] into a gather.
      const float* w = weight;
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < C; ++c) dot += gi[c] * w[c] * xi[c];
      const float k = r * r * r * dot / static_cast<float>(C);
      float* dxi = dx + i * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dxi[c] += r * gi[c] * weight[c] - k * xi[c];
    }
  });
  parallel_for(C, [&](int64_t c0, int64_t c1) {
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x + i * C;
      const float* gi = dout + i * C;
      const float r = rstd[i];
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) dweight[c] += gi[c] * xi[c] * r;
    }
  });
}

}  // namespace tessera::kernels::cpu
