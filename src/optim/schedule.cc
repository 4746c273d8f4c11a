// Learning-rate schedule: linear warmup, then cosine decay to a floor.
#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace tessera::optim {

double Schedule::at(int64_t step) const {
  if (step <= warmup_steps) return lr * static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup_steps));
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps));
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace tessera::optim
