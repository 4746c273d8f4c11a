// Learning-rate schedule: linear warmup, the peak held, then a decay to a floor.
#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace tessera::optim {

int64_t Schedule::decay_start() const {
  return decay_steps > 0 ? std::max(warmup_steps, total_steps - decay_steps) : warmup_steps;
}

double Schedule::at(int64_t step) const {
  if (step <= warmup_steps) return lr * static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup_steps));
  const int64_t start = decay_start();
  if (decay == LrDecay::kNone || step <= start) return lr;
  const int64_t span = std::max<int64_t>(1, total_steps - start);
  const double progress = std::min(1.0, static_cast<double>(step - start) / static_cast<double>(span));
  double left = 1.0;  // of (lr - min_lr)
  switch (decay) {
    case LrDecay::kCosine:  // as written before the other shapes, so that runs keep their rates bitwise
      return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
    case LrDecay::kLinear:
      left = 1.0 - progress;
      break;
    case LrDecay::kSqrt:
      left = 1.0 - std::sqrt(progress);
      break;
    case LrDecay::kNone:
      break;
  }
  return min_lr + (lr - min_lr) * left;
}

}  // namespace tessera::optim
