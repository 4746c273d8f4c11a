// AdamW over flat unit buffers.
#include "optim/adamw.h"

#include <algorithm>

#include "kernels/cpu/adamw.h"

namespace tessera::optim {

void adamw_update(const model::UnitLayout& unit, int64_t begin, int64_t end, float* p, const float* g, float* m,
                  float* v, const AdamWConfig& config, double lr, int64_t step) {
  kernels::AdamWParams ap;
  ap.lr = static_cast<float>(lr);
  ap.beta1 = static_cast<float>(config.beta1);
  ap.beta2 = static_cast<float>(config.beta2);
  ap.eps = static_cast<float>(config.eps);
  ap.step = step;
  for (const model::TensorSpec& t : unit.tensors) {
    const int64_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel());
    if (lo >= hi) continue;
    ap.weight_decay = t.decay ? static_cast<float>(config.weight_decay) : 0.0f;
    const int64_t o = lo - begin;
    kernels::cpu::adamw_step(p + o, g + o, m + o, v + o, hi - lo, ap);
  }
}

double clip_factor(double grad_norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0;
  return std::min(1.0, max_norm / (grad_norm + 1e-6));
}

}  // namespace tessera::optim
