// The sampler: every sample once per epoch, epochs and seeds differ, a pure function of
// (seed, position), and orders that look shuffled.
#include "data/sampler.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <set>
#include <vector>

#include "core/error.h"

namespace tessera::data {
namespace {

std::vector<uint64_t> epoch_order(const Sampler& s, uint64_t epoch) {
  std::vector<uint64_t> order(s.num_samples());
  for (uint64_t i = 0; i < order.size(); ++i) order[i] = s.sample_at(epoch * s.num_samples() + i);
  return order;
}

TEST(Sampler, VisitsEverySampleExactlyOncePerEpoch) {
  // 1024 = 4^5 fills the Feistel domain exactly; 1025 needs the next one (4^6) and cycle-walks most.
  for (uint64_t n : {1, 2, 3, 4, 5, 16, 17, 1000, 1023, 1024, 1025, 12345}) {
    for (uint64_t seed : {0ULL, 1ULL, 0x9e3779b97f4a7c15ULL}) {
      const Sampler s(n, seed);
      for (uint64_t epoch : {0, 1, 9}) {
        std::vector<char> seen(n, 0);
        for (uint64_t sample : epoch_order(s, epoch)) {
          ASSERT_LT(sample, n) << "n " << n << " seed " << seed << " epoch " << epoch;
          ASSERT_FALSE(seen[sample]) << "sample " << sample << " twice; n " << n << " seed " << seed;
          seen[sample] = 1;
        }
        EXPECT_EQ(s.epoch_of(epoch * n), epoch);
        EXPECT_EQ(s.epoch_of(epoch * n + n - 1), epoch);
      }
    }
  }
}

TEST(Sampler, EpochsAndSeedsGiveDifferentOrders) {
  for (uint64_t n : {11, 100, 12345}) {
    const Sampler s(n, 42), other_seed(n, 43);
    const std::vector<uint64_t> e0 = epoch_order(s, 0), e1 = epoch_order(s, 1), e2 = epoch_order(s, 2);
    EXPECT_NE(e0, e1) << n;
    EXPECT_NE(e1, e2) << n;
    EXPECT_NE(e0, e2) << n;
    EXPECT_NE(e0, epoch_order(other_seed, 0)) << n;
  }
}

TEST(Sampler, IsAPureFunctionOfSeedAndPosition) {
  const Sampler a(12345, 7), b(12345, 7);
  // Query b backwards and across epochs: no hidden state may depend on the order of calls.
  for (uint64_t p = 3 * 12345; p-- > 0;) ASSERT_EQ(a.sample_at(p), b.sample_at(p)) << p;
  EXPECT_EQ(a.sample_at(5), Sampler(12345, 7).sample_at(5));
}

TEST(Sampler, OneSampleAndNoSamples) {
  const Sampler one(1, 3);
  for (uint64_t p : {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{1000}, std::numeric_limits<uint64_t>::max()}) {
    EXPECT_EQ(one.sample_at(p), 0u);
    EXPECT_EQ(one.epoch_of(p), p);
  }
  EXPECT_THROW(Sampler(0, 3), DataError);
}

TEST(Sampler, HugeSampleCountsStayInRangeAndDistinct) {
  // 2^64 - 1 needs the whole 64-bit domain (32-bit halves); 2^40 + 3 cycle-walks over 2^42.
  for (uint64_t n : {std::numeric_limits<uint64_t>::max(), (uint64_t{1} << 40) + 3}) {
    const Sampler s(n, 1);
    std::set<uint64_t> seen;
    for (uint64_t i = 0; i < 2000; ++i) {
      const uint64_t sample = s.sample_at(i);
      ASSERT_LT(sample, n);
      seen.insert(sample);
    }
    EXPECT_EQ(seen.size(), 2000u);
  }
}

TEST(Sampler, OrdersLookShuffled) {
  // Deterministic under the fixed seed; the thresholds are ~4 standard deviations from what a
  // uniformly random permutation gives; a 4-round network fails the gap statistic (2.4).
  constexpr uint64_t n = 64, epochs = 20000;
  std::vector<double> first(n, 0), gap(n, 0);
  uint64_t successors = 0;  // epochs whose first two samples are consecutive: ~epochs / n
  for (uint64_t e = 0; e < epochs; ++e) {
    const Sampler s(n, 11);
    const uint64_t a = s.sample_at(e * n), b = s.sample_at(e * n + 1);
    first[a] += 1;
    gap[(b + n - a) % n] += 1;
    successors += b == a + 1;
  }
  double chi_first = 0, chi_gap = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const double expect_first = double(epochs) / n, expect_gap = double(epochs) / (n - 1);
    chi_first += (first[i] - expect_first) * (first[i] - expect_first) / expect_first;
    if (i > 0) chi_gap += (gap[i] - expect_gap) * (gap[i] - expect_gap) / expect_gap;
  }
  EXPECT_EQ(gap[0], 0);  // never the same sample twice in an epoch
  EXPECT_LT(chi_first / (n - 1), 1.75);
  EXPECT_LT(chi_gap / (n - 2), 1.75);
  EXPECT_LT(successors, 2 * epochs / n);

  // Within one large epoch: few ascending neighbours (a random permutation has ~1).
  const Sampler big(12345, 11);
  int ascending = 0;
  for (uint64_t i = 0; i + 1 < 12345; ++i) ascending += big.sample_at(i + 1) == big.sample_at(i) + 1;
  EXPECT_LT(ascending, 8);
}

}  // namespace
}  // namespace tessera::data
