// Synthetic training data: seeded random tokens of the model's vocabulary, addressed by global
// sample index so that any rank can produce any sample without the others.
#pragma once

#include <cstdint>

namespace tessera::train {

class SyntheticData {
 public:
  SyntheticData(uint64_t seed, int64_t vocab_size, int64_t seq_len) : seed_(seed), vocab_(vocab_size), T_(seq_len) {}

  // Samples [first, first + count): inputs and targets (count, T), targets shifted by one token.
  void fill(int64_t first, int64_t count, int32_t* inputs, int32_t* targets) const;

 private:
  uint64_t seed_;
  int64_t vocab_, T_;
};

}  // namespace tessera::train
