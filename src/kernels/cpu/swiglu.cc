// CPU SwiGLU over the fused gate/up activation.
#include "kernels/cpu/swiglu.h"

#include <cmath>

#include "core/threads.h"
#include "kernels/cpu/vec_math.h"

namespace tessera::kernels::cpu {

void swiglu_forward(float* out, const float* h13, int64_t n, int64_t F) {
  parallel_for(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* a = h13 + i * 2 * F;
      const float* b = a + F;
      float* o = out + i * F;
#pragma omp simd
      for (int64_t j = 0; j < F; ++j) o[j] = a[j] * sigmoid_fast(a[j]) * b[j];
    }
  });
}

void swiglu_backward(float* dh13, const float* dout, const float* h13, int64_t n, int64_t F) {
  // silu(a) = a s, s = sigmoid(a); silu'(a) = s (1 + a (1 - s)).
  parallel_for(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* a = h13 + i * 2 * F;
      const float* b = a + F;
      const float* g = dout + i * F;
      float* da = dh13 + i * 2 * F;
      float* db = da + F;
#pragma omp simd
      for (int64_t j = 0; j < F; ++j) {
        const float s = sigmoid_fast(a[j]);
        db[j] = g[j] * a[j] * s;
        da[j] = g[j] * b[j] * s * (1.0f + a[j] * (1.0f - s));
      }
    }
  });
}

}  // namespace tessera::kernels::cpu
