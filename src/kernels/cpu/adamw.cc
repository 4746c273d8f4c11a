// CPU AdamW, the same arithmetic (and order of float operations) as torch.optim.AdamW.
#include "kernels/cpu/adamw.h"

#include <cmath>

#include "core/bf16.h"
#include "core/threads.h"

namespace tessera::kernels::cpu {
namespace {

struct Coefficients {
  float b1, b2, eps, scale, decay, step_size, inv_sqrt_bc2;
};

// Elements [begin, end). The arrays arrive as restrict pointers of the loop's own: read through a
// lambda's captures, GCC reloads them after every store and leaves the loop scalar (vsqrtss and
// vdivss: 23 GB/s over a step's parameters, against the memory's bandwidth vectorized).
template <bool kImage>
void update(const Coefficients c, int64_t begin, int64_t end, float* __restrict param, const float* __restrict grad,
            float* __restrict m, float* __restrict v, uint16_t* __restrict image) {
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
  const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step));
  const Coefficients c{p.beta1,
                       p.beta2,
                       p.eps,
                       p.grad_scale,
                       1.0f - p.lr * p.weight_decay,
                       static_cast<float>(p.lr / bc1),
                       static_cast<float>(1.0 / std::sqrt(bc2))};
  // One pass over the five (or six) arrays; the gradient's scaling and the bf16 rounding ride on
  // it instead of passes of their own (this is memory-bound: ~36 bytes an element).
  parallel_for(n, [&](int64_t begin, int64_t end) {
    if (param_bf16 == nullptr) {
      update<false>(c, begin, end, param, grad, m, v, nullptr);
    } else {
      update<true>(c, begin, end, param, grad, m, v, param_bf16);
    }
  });
}

}  // namespace tessera::kernels::cpu
