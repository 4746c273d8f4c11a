// Reference AdamW (decoupled weight decay), the same arithmetic as torch.optim.AdamW.
#pragma once

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

}  // namespace tessera::kernels

namespace tessera::kernels::ref {

// param, m, v (n) updated in place from g = grad (n) x grad_scale: param *= 1 - lr*wd; m, v moving averages;
// param -= lr/(1-beta1^t) * m / (sqrt(v)/sqrt(1-beta2^t) + eps).
void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWParams& p);

}  // namespace tessera::kernels::ref
