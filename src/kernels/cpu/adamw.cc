// CPU AdamW, the same arithmetic (and order of float operations) as torch.optim.AdamW.
#include "kernels/cpu/adamw.h"

#include <cmath>

#include "core/bf16.h"
#include "core/threads.h"

namespace tessera::kernels::cpu {

void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWParams& p,
                uint16_t* param_bf16) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step));
  const float step_size = static_cast<float>(p.lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float decay = 1.0f - p.lr * p.weight_decay;
  const float b1 = p.beta1, b2 = p.beta2, eps = p.eps, scale = p.grad_scale;
  // One pass over the five (or six) arrays; the gradient's scaling and the bf16 rounding ride on
  // it instead of passes of their own (this is memory-bound: ~36 bytes an element).
  const auto update = [&](int64_t i) {
    const float g = grad[i] * scale;
    const float mi = b1 * m[i] + (1.0f - b1) * g;
    const float vi = b2 * v[i] + (1.0f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    return param[i] = param[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
  };
  parallel_for(n, [&](int64_t begin, int64_t end) {
    if (param_bf16 == nullptr) {
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) update(i);
    } else {
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) param_bf16[i] = f32_to_bf16(update(i));
    }
  });
}

}  // namespace tessera::kernels::cpu
