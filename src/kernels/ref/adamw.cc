// Reference AdamW, each element's update computed in double from the float state.
#include "kernels/ref/adamw.h"

#include <cmath>

namespace tessera::kernels::ref {

void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWParams& p) {
  const double lr = p.lr, b1 = p.beta1, b2 = p.beta2, eps = p.eps, wd = p.weight_decay;
  const double t = static_cast<double>(p.step);
  const double bc1 = 1.0 - std::pow(b1, t), bc2 = 1.0 - std::pow(b2, t);
  // Decoupled decay scales the parameter before the Adam step (torch.optim.AdamW's order), so it
  // never touches m or v and never scales this step's update.
  for (int64_t i = 0; i < n; ++i) {
    const double g = grad[i] * p.grad_scale;  // the float product, as a clipped gradient holds it
    const double mi = b1 * m[i] + (1.0 - b1) * g;
    const double vi = b2 * v[i] + (1.0 - b2) * g * g;
    double pi = param[i] * (1.0 - lr * wd);
    pi -= (lr / bc1) * mi / (std::sqrt(vi) / std::sqrt(bc2) + eps);
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    param[i] = static_cast<float>(pi);
  }
}

}  // namespace tessera::kernels::ref
