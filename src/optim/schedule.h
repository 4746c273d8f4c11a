// Learning-rate schedule: a linear warmup to the peak; the peak, held until the decay starts; a
// decay to the floor at the last step. With decay_steps = 0 the decay starts where the warmup
// ends (warmup then cosine, the default). With decay_steps = K > 0 only the last K steps decay
// and the steps between hold the peak (warmup-stable-decay, "WSD", as in MiniCPM, DeepSeek and
// torchtitan): a run whose decay has not started can be given more steps without changing the
// learning rates it has already trained with, and a checkpoint taken before the decay can start
// another decay of its own.
#pragma once

#include <cstdint>

namespace tessera::optim {

// The decay's shape, as the fraction of (peak - floor) left at progress p in [0, 1] through it:
// cosine (1 + cos(pi p)) / 2, linear 1 - p, sqrt 1 - sqrt(p), none 1 (the peak to the end; no
// floor). train.lr_decay names them (config::LrDecay).
enum class LrDecay { kCosine, kLinear, kSqrt, kNone };

struct Schedule {
  double lr = 3e-4;         // peak
  double min_lr = 0.0;      // floor reached at total_steps
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  LrDecay decay = LrDecay::kCosine;
  int64_t decay_steps = 0;  // 0: every step after the warmup; K: the last K (never into the warmup)

  // Learning rate of 1-based step `step`.
  double at(int64_t step) const;
  // The last step at the peak before the decay (at least warmup_steps).
  int64_t decay_start() const;
};

}  // namespace tessera::optim
