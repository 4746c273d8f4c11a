// Reference AdamW (decoupled weight decay), the same arithmetic as torch.optim.AdamW.
#pragma once

#include <cmath>
#include <cstdint>

namespace tessera::kernels {

struct AdamWParams {
  float lr = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;  // 1-based count of updates including this one (bias correction)
  float grad_scale = 1.0f;  // the gradient is multiplied by it (in float) first: clipping
};

// A flat unit's elements as runs of one kind: elements [the previous segment's end, end) take
// AdamWParams::weight_decay when `decay`, none otherwise (the norms' weights). The fast kernels
// update a whole unit in one pass (on a GPU one launch) over its segments.
struct AdamWSegment {
  int64_t end;
  bool decay;
};

// The float coefficients the fast kernels (kernels/cpu, kernels/cuda) step with, computed once
// per launch, the bias corrections in double: one place, so both backends take the same steps.
struct AdamWCoefficients {
  float b1, b2, eps, scale, decay, step_size, inv_sqrt_bc2;
};
inline AdamWCoefficients adamw_coefficients(const AdamWParams& p, bool decay = true) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step));
  return {p.beta1,
          p.beta2,
          p.eps,
          p.grad_scale,
          decay ? 1.0f - p.lr * p.weight_decay : 1.0f,
          static_cast<float>(p.lr / bc1),
          static_cast<float>(1.0 / std::sqrt(bc2))};
}

}  // namespace tessera::kernels

namespace tessera::kernels::ref {

// param, m, v (n) updated in place from g = grad (n) x grad_scale: param *= 1 - lr*wd; m, v moving averages;
// param -= lr/(1-beta1^t) * m / (sqrt(v)/sqrt(1-beta2^t) + eps).
void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWParams& p);

}  // namespace tessera::kernels::ref
