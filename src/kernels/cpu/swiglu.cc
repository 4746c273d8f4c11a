// CPU SwiGLU over the fused gate/up activation.
#include "kernels/cpu/swiglu.h"

#include <cmath>
#include <type_traits>

#include "core/bf16.h"
#include "core/threads.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/cpu/vector.h"

namespace tessera::kernels::cpu {

namespace {

// One row, in fp32: out (F) from its gate a and up b. Not inlined, for write_rounded.
[[gnu::noinline]] void forward_row(float* o, const float* a, const float* b, int64_t F) {
#pragma omp simd
  for (int64_t j = 0; j < F; ++j) o[j] = a[j] * sigmoid_fast(a[j]) * b[j];
}

// One row's gradients (2F) in fp32: silu(a) = a s, s = sigmoid(a); silu'(a) = s (1 + a (1 - s)).
[[gnu::noinline]] void backward_row(float* da, const float* a, const float* b, const float* g, int64_t F) {
  float* db = da + F;
#pragma omp simd
  for (int64_t j = 0; j < F; ++j) {
    const float s = sigmoid_fast(a[j]);
    db[j] = g[j] * a[j] * s;
    da[j] = g[j] * b[j] * s * (1.0f + a[j] * (1.0f - s));
  }
}

template <typename Out>
void forward(Out* out, const float* h13, int64_t n, int64_t F) {
  parallel_for(n, [&](int64_t begin, int64_t end) {
    float* scratch = std::is_same_v<Out, float> ? nullptr : thread_row(F);
    for (int64_t i = begin; i < end; ++i) {
      const float* a = h13 + i * 2 * F;
      write_rounded(out + i * F, F, scratch, [&](float* o) { forward_row(o, a, a + F, F); });
    }
  });
}

template <typename Out>
void backward(Out* dh13, const float* dout, const float* h13, int64_t n, int64_t F) {
  parallel_for(n, [&](int64_t begin, int64_t end) {
    float* scratch = std::is_same_v<Out, float> ? nullptr : thread_row(2 * F);
    for (int64_t i = begin; i < end; ++i) {
      const float* a = h13 + i * 2 * F;
      write_rounded(dh13 + i * 2 * F, 2 * F, scratch, [&](float* d) { backward_row(d, a, a + F, dout + i * F, F); });
    }
  });
}

}  // namespace

void swiglu_forward(float* out, const float* h13, int64_t n, int64_t F) { forward(out, h13, n, F); }
void swiglu_forward_bf16(uint16_t* out, const float* h13, int64_t n, int64_t F) { forward(out, h13, n, F); }

void swiglu_backward(float* dh13, const float* dout, const float* h13, int64_t n, int64_t F) {
  backward(dh13, dout, h13, n, F);
}
void swiglu_backward_bf16(uint16_t* dh13, const float* dout, const float* h13, int64_t n, int64_t F) {
  backward(dh13, dout, h13, n, F);
}

}  // namespace tessera::kernels::cpu
