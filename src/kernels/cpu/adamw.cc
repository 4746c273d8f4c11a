// CPU AdamW, the same arithmetic (and order of float operations) as torch.optim.AdamW.
#include "kernels/cpu/adamw.h"

#include <algorithm>
#include <cmath>

#include "core/bf16.h"
#include "core/threads.h"

namespace tessera::kernels::cpu {
namespace {

// Elements [begin, end). The arrays arrive as restrict pointers of the loop's own: read through a
// lambda's captures, GCC reloads them after every store and leaves the loop scalar (vsqrtss and
// vdivss: 23 GB/s over a step's parameters, against the memory's bandwidth vectorized).
template <bool kImage>
void update(const AdamWCoefficients c, int64_t begin, int64_t end, float* __restrict param,
            const float* __restrict grad, float* __restrict m, float* __restrict v, uint16_t* __restrict image) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    const float g = grad[i] * c.scale;
    const float mi = c.b1 * m[i] + (1.0f - c.b1) * g;
    const float vi = c.b2 * v[i] + (1.0f - c.b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float p = param[i] * c.decay - c.step_size * mi / (std::sqrt(vi) * c.inv_sqrt_bc2 + c.eps);
    param[i] = p;
    if constexpr (kImage) image[i] = f32_to_bf16(p);
  }
}

}  // namespace

void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWParams& p,
                uint16_t* param_bf16) {
  const AdamWSegment all{n, true};
  adamw_update(param, grad, m, v, &all, 1, p, param_bf16);
}

void adamw_update(float* param, const float* grad, float* m, float* v, const AdamWSegment* segments, int count,
                  const AdamWParams& p, uint16_t* param_bf16) {
  const AdamWCoefficients with = adamw_coefficients(p, true), without = adamw_coefficients(p, false);
  const int64_t n = count > 0 ? segments[count - 1].end : 0;
  // One pass over the five (or six) arrays; the gradient's scaling and the bf16 rounding ride on
  // it instead of passes of their own (this is memory-bound: ~36 bytes an element).
  parallel_for(n, [&](int64_t begin, int64_t end) {
    int64_t lo = begin;
    for (int s = 0; s < count && lo < end; ++s) {
      const int64_t hi = std::min(end, segments[s].end);
      if (hi <= lo) continue;
      const AdamWCoefficients& c = segments[s].decay ? with : without;
      if (param_bf16 == nullptr) {
        update<false>(c, lo, hi, param, grad, m, v, nullptr);
      } else {
        update<true>(c, lo, hi, param, grad, m, v, param_bf16);
      }
      lo = hi;
    }
  });
}

}  // namespace tessera::kernels::cpu
