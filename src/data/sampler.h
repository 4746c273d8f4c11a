// Global-sample-index sampler (ARCHITECTURE.md, Data). The train split's token stream is cut
// into samples of T+1 tokens (sample s = tokens [s*T, s*T+T+1)); every epoch is a seeded
// permutation of the samples; the global position p names sample perm_{p / N}(p mod N), so an
// epoch visits each sample exactly once and batches flow across epoch boundaries. Global batch b
// is positions [b*G, (b+1)*G); rank r of W takes the contiguous slice
// [b*G + r*G/W, b*G + (r+1)*G/W). Data order therefore does not depend on the world size, and
// the whole state is one number.
#pragma once

#include <cstdint>

namespace tessera::data {

struct SamplerState {
  uint64_t position = 0;  // global position of the next sample to hand out
};

class Sampler {
 public:
  // Epoch e's permutation is keyed by (seed, e). Throws DataError when num_samples is 0.
  Sampler(uint64_t num_samples, uint64_t seed);

  uint64_t num_samples() const { return n_; }
  // The sample at global position p: a pure function of (seed, p).
  uint64_t sample_at(uint64_t position) const;
  uint64_t epoch_of(uint64_t position) const { return position / n_; }

 private:
  uint64_t n_, seed_;
  int half_bits_;  // the Feistel network permutes [0, 4^half_bits) >= n, cycle-walking into [0, n)
};

}  // namespace tessera::data
