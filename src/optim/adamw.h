// AdamW over a unit's flat fp32 master buffer (or any slice of it, such as a rank's shard), with
// weight decay on the tensors that take it, and the global gradient-norm clip factor.
#pragma once

#include <cstdint>

#include "kernels/ref/adamw.h"
#include "model/layout.h"

namespace tessera::optim {

struct AdamWConfig {
  double lr = 3e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

// Updates elements [begin, end) of `unit`: p, g, m, v point at element `begin`. Padding is left
// untouched; tensors without decay (norm gains) get weight_decay 0. step is 1-based.
void adamw_update(const model::UnitLayout& unit, int64_t begin, int64_t end, float* p, const float* g, float* m,
                  float* v, const AdamWConfig& config, double lr, int64_t step);

// The factor torch.nn.utils.clip_grad_norm_ applies: min(1, max_norm / (norm + 1e-6)); 1 when
// max_norm <= 0 (clipping off).
double clip_factor(double grad_norm, double max_norm);

}  // namespace tessera::optim
