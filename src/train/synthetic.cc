// Synthetic training data from a counter-based generator.
#include "train/synthetic.h"

#include "core/rng.h"

namespace tessera::train {

void SyntheticTokens::read(uint64_t begin, uint64_t n, int32_t* out) const {
  // Stream ids above 2^62 never collide with the per-unit streams of parameter initialization.
  constexpr uint64_t kStream = uint64_t{1} << 62;
  for (uint64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(rng::bits(seed_, kStream, begin + i) % vocab_);
}

}  // namespace tessera::train
