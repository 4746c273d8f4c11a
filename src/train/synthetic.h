// Synthetic training data: a seeded stream of random tokens of the model's vocabulary, read like
// a prepared dataset's token stream, so the sampler and loader treat both alike.
#pragma once

#include <cstdint>

namespace tessera::train {

class SyntheticTokens {
 public:
  // A stream long enough never to wrap in practice (2^40 tokens).
  static constexpr uint64_t kLength = uint64_t{1} << 40;

  SyntheticTokens(uint64_t seed, int64_t vocab_size) : seed_(seed), vocab_(static_cast<uint64_t>(vocab_size)) {}

  // Tokens [begin, begin + n): token i is a pure function of (seed, i).
  void read(uint64_t begin, uint64_t n, int32_t* out) const;

 private:
  uint64_t seed_, vocab_;
};

}  // namespace tessera::train
