// Learning-rate schedule: linear warmup, then cosine decay to a floor at the last step.
#pragma once

#include <cstdint>

namespace tessera::optim {

struct Schedule {
  double lr = 3e-4;         // peak
  double min_lr = 0.0;      // floor reached at total_steps
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;

  // Learning rate of 1-based step `step`.
  double at(int64_t step) const;
};

}  // namespace tessera::optim
