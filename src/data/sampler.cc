// The epoch permutation as a keyed Feistel network with cycle-walking: O(1) memory and O(1)
// expected time per sample, so no per-epoch index array exists to allocate, save or shard.
#include "data/sampler.h"

#include "core/error.h"
#include "core/rng.h"

namespace tessera::data {
namespace {

// Eight rounds, not the four Luby-Rackoff needs for a strong pseudo-random permutation: that
// bound is asymptotic in the half width, and our halves are small (5 bits at n = 1000). With 4
// rounds the gap between consecutive samples was far from uniform over 200k epochs at n = 64
// (chi^2/dof 19), with 6 still at n = 16 (11); 8 rounds reach noise level from n = 17 up. The
// cost is 30 ns per sample (140 ns just above a power of 4, where cycle-walking is longest),
// against microseconds to read the sample.
constexpr int kRounds = 8;
// Separates the sampler's keys from the other users of rng::bits under the same seed (weight
// initialization), so the data order is not correlated with anything else the seed drives.
constexpr uint64_t kSamplerDomain = 0x73616d706c657231ULL;  // "sampler1"

}  // namespace

Sampler::Sampler(uint64_t num_samples, uint64_t seed) : n_(num_samples), seed_(seed), half_bits_(0) {
  if (n_ == 0) throw DataError("sampler: the dataset has no samples");
  // The smallest even-width domain 4^h >= n: less than 4n, so cycle-walking takes fewer than four
  // network evaluations per sample on average. h = 32 covers every uint64 n.
  while (half_bits_ < 32 && (uint64_t{1} << (2 * half_bits_)) < n_) ++half_bits_;
}

uint64_t Sampler::sample_at(uint64_t position) const {
  if (n_ == 1) return 0;
  const uint64_t epoch = position / n_;
  uint64_t x = position % n_;
  uint64_t keys[kRounds];
  for (int r = 0; r < kRounds; ++r) keys[r] = rng::bits(seed_ ^ kSamplerDomain, epoch, static_cast<uint64_t>(r));
  const int h = half_bits_;
  const uint64_t mask = (uint64_t{1} << h) - 1;
  // The network permutes [0, 4^h); following x's cycle until it lands in [0, n) again restricts
  // that permutation to a permutation of [0, n). The walk ends because the cycle contains x.
  do {
    uint64_t left = x >> h, right = x & mask;
    for (int r = 0; r < kRounds; ++r) {
      const uint64_t next = left ^ (rng::mix(right ^ keys[r]) & mask);
      left = right;
      right = next;
    }
    x = (left << h) | right;
  } while (x >= n_);
  return x;
}

}  // namespace tessera::data
