// Synthetic training data from a counter-based generator.
#include "train/synthetic.h"

#include "core/rng.h"

namespace tessera::train {

void SyntheticData::fill(int64_t first, int64_t count, int32_t* inputs, int32_t* targets) const {
  // Stream ids above 2^62 never collide with the per-unit streams of parameter initialization.
  constexpr uint64_t kStream = uint64_t{1} << 62;
  for (int64_t s = 0; s < count; ++s) {
    const uint64_t sample = static_cast<uint64_t>(first + s);
    for (int64_t t = 0; t <= T_; ++t) {
      const auto token = static_cast<int32_t>(rng::bits(seed_, kStream + sample, t) % static_cast<uint64_t>(vocab_));
      if (t < T_) inputs[s * T_ + t] = token;
      if (t > 0) targets[s * T_ + t - 1] = token;
    }
  }
}

}  // namespace tessera::train
