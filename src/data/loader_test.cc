// The loader: rank slices partition each global batch at any world size, resume continues the
// sequence exactly (also at another world size), targets are shifted inputs, and reader errors
// and bad sizes surface as typed errors.
#include "data/loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/error.h"

namespace tessera::data {
namespace {

constexpr int64_t kT = 4, kG = 6;
constexpr uint64_t kSeed = 5;

// Token i of the stream is i, so a sample is named by its first token / T.
void identity_read(uint64_t begin, uint64_t n, int32_t* out) {
  for (uint64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(begin + i);
}

uint64_t stream_of(uint64_t samples) { return samples * kT + 1; }

std::unique_ptr<Loader> make(uint64_t samples, int world, int rank, int64_t micro_batch, uint64_t start = 0) {
  const LoaderOptions o{.seq_len = kT, .micro_batch = micro_batch, .global_batch = kG, .rank = rank, .world = world};
  return std::make_unique<Loader>(identity_read, stream_of(samples), kSeed, o, SamplerState{start});
}

// The samples of the next `micro_batches` micro-batches, checking each row: inputs are the
// sample's first T tokens, targets the T after the first.
std::vector<uint64_t> take(Loader& loader, int64_t micro_batches, int64_t micro_batch) {
  std::vector<uint64_t> samples;
  for (int64_t m = 0; m < micro_batches; ++m) {
    const Loader::Batch b = loader.next();
    for (int64_t i = 0; i < micro_batch; ++i) {
      const int32_t* in = b.inputs + i * kT;
      const int32_t* tg = b.targets + i * kT;
      EXPECT_EQ(in[0] % kT, 0);
      for (int64_t t = 0; t < kT; ++t) {
        EXPECT_EQ(in[t], in[0] + t);
        EXPECT_EQ(tg[t], in[0] + t + 1);
        if (t + 1 < kT) {
          EXPECT_EQ(tg[t], in[t + 1]);
        }
      }
      samples.push_back(static_cast<uint64_t>(in[0] / kT));
    }
  }
  return samples;
}

// Global batches [0, batches) as the world-size-independent sampler order.
std::vector<uint64_t> expected(uint64_t samples, uint64_t from, uint64_t count) {
  const Sampler s(samples, kSeed);
  std::vector<uint64_t> out;
  for (uint64_t p = from; p < from + count; ++p) out.push_back(s.sample_at(p));
  return out;
}

// The next `batches` global batches of W ranks, each the concatenation of the ranks' slices.
std::vector<uint64_t> take_world(std::vector<std::unique_ptr<Loader>>& ranks, int64_t batches, int64_t micro_batch) {
  std::vector<uint64_t> all;
  const int64_t per_step = ranks[0]->micro_batches_per_step();
  for (int64_t b = 0; b < batches; ++b) {
    for (auto& rank : ranks) {
      const std::vector<uint64_t> slice = take(*rank, per_step, micro_batch);
      all.insert(all.end(), slice.begin(), slice.end());
    }
  }
  return all;
}

std::vector<std::unique_ptr<Loader>> make_world(uint64_t samples, int world, int64_t micro_batch, uint64_t start) {
  std::vector<std::unique_ptr<Loader>> ranks;
  for (int r = 0; r < world; ++r) ranks.push_back(make(samples, world, r, micro_batch, start));
  return ranks;
}

TEST(Loader, RankSlicesPartitionEachGlobalBatchAtEveryWorldSize) {
  constexpr int64_t kBatches = 20;  // 120 positions: more than two epochs
  // 48 samples: every global batch lies in one epoch, so its samples are distinct. 50: batches
  // straddle epoch boundaries.
  for (uint64_t samples : {48, 50}) {
    const std::vector<uint64_t> reference = expected(samples, 0, kBatches * kG);
    for (int world : {1, 2, 3}) {
      for (int64_t micro_batch = 1; micro_batch <= kG / world; ++micro_batch) {
        if ((kG / world) % micro_batch != 0) continue;
        SCOPED_TRACE(testing::Message() << "samples " << samples << " world " << world << " micro_batch "
                                        << micro_batch);
        auto ranks = make_world(samples, world, micro_batch, 0);
        for (int64_t b = 0; b < kBatches; ++b) {
          std::vector<uint64_t> batch;
          std::set<uint64_t> union_of_slices;
          for (auto& rank : ranks) {
            const std::vector<uint64_t> slice = take(*rank, rank->micro_batches_per_step(), micro_batch);
            ASSERT_EQ(slice.size(), static_cast<size_t>(kG / world));
            for (uint64_t s : slice) {
              const bool fresh = union_of_slices.insert(s).second;
              if (samples % kG == 0) {
                EXPECT_TRUE(fresh) << "sample " << s << " in two slices";
              }
            }
            batch.insert(batch.end(), slice.begin(), slice.end());
          }
          const std::vector<uint64_t> want(reference.begin() + b * kG, reference.begin() + (b + 1) * kG);
          EXPECT_EQ(batch, want) << "global batch " << b;
          EXPECT_EQ(union_of_slices, std::set<uint64_t>(want.begin(), want.end()));
          for (auto& rank : ranks) EXPECT_EQ(rank->state().position, static_cast<uint64_t>((b + 1) * kG));
        }
      }
    }
  }
}

TEST(Loader, SavedStateResumesTheIdenticalSequence) {
  constexpr uint64_t kSamples = 50;
  constexpr int kWorld = 2;
  constexpr int64_t kMicro = 1, kSteps = 4;  // 3 micro-batches per step
  for (int rank = 0; rank < kWorld; ++rank) {
    auto uninterrupted = make(kSamples, kWorld, rank, kMicro);
    auto first = make(kSamples, kWorld, rank, kMicro);
    const int64_t per_step = first->micro_batches_per_step();
    ASSERT_EQ(per_step, 3);
    take(*uninterrupted, kSteps * per_step, kMicro);
    take(*first, kSteps * per_step, kMicro);
    const SamplerState saved = first->state();
    EXPECT_EQ(saved.position, static_cast<uint64_t>(kSteps * kG));
    // A batch taken mid-step does not count until the step's last micro-batch is taken.
    take(*first, 1, kMicro);
    EXPECT_EQ(first->state().position, saved.position);
    first.reset();
    auto resumed = make(kSamples, kWorld, rank, kMicro, saved.position);
    EXPECT_EQ(take(*resumed, 20 * per_step, kMicro), take(*uninterrupted, 20 * per_step, kMicro)) << "rank " << rank;
  }
}

TEST(Loader, ResumeAtAnotherWorldSizeNeitherRepeatsNorSkips) {
  constexpr uint64_t kSamples = 50;
  // World 2 for 3 steps, then world 3 for 4 steps, then world 1 for 5: together the world-size-
  // independent order of the first 12 global batches.
  std::vector<uint64_t> seen;
  uint64_t position = 0;
  for (auto [world, micro_batch, steps] : {std::tuple{2, 3, 3}, std::tuple{3, 1, 4}, std::tuple{1, 2, 5}}) {
    auto ranks = make_world(kSamples, world, micro_batch, position);
    const std::vector<uint64_t> part = take_world(ranks, steps, micro_batch);
    seen.insert(seen.end(), part.begin(), part.end());
    for (auto& rank : ranks) EXPECT_EQ(rank->state().position, position + static_cast<uint64_t>(steps * kG));
    position = ranks[0]->state().position;
  }
  EXPECT_EQ(seen, expected(kSamples, 0, 12 * kG));
}

TEST(Loader, StartNeedNotBeAMultipleOfTheGlobalBatch) {
  // A run resumed with another global batch starts mid-way through the old batch grid.
  auto ranks = make_world(50, 2, 1, 5);
  EXPECT_EQ(take_world(ranks, 3, 1), expected(50, 5, 3 * kG));
  EXPECT_EQ(ranks[1]->state().position, 5u + 3 * kG);
}

TEST(Loader, OneSampleStreamRepeatsIt) {
  const LoaderOptions o{.seq_len = kT, .micro_batch = 2, .global_batch = 2, .rank = 0, .world = 1};
  Loader loader(identity_read, kT + 1, kSeed, o, {});
  for (int i = 0; i < 5; ++i) EXPECT_EQ(take(loader, 1, 2), (std::vector<uint64_t>{0, 0}));
}

TEST(Loader, TargetsAreInputsShiftedByOneToken) {
  // A stream that is not the identity: token i = (i * 7919) mod 1000.
  auto read = [](uint64_t begin, uint64_t n, int32_t* out) {
    for (uint64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(((begin + i) * 7919) % 1000);
  };
  const LoaderOptions o{.seq_len = 8, .micro_batch = 2, .global_batch = 4, .rank = 1, .world = 2};
  constexpr uint64_t kStream = 8 * 30 + 5;
  Loader loader(read, kStream, 9, o, {});
  const Sampler& sampler = loader.sampler();
  ASSERT_EQ(sampler.num_samples(), 30u);
  for (uint64_t step = 0; step < 20; ++step) {
    const Loader::Batch b = loader.next();
    for (uint64_t i = 0; i < 2; ++i) {
      const uint64_t s = sampler.sample_at(step * 4 + 2 + i);  // rank 1 takes positions 2, 3 of each batch
      for (uint64_t t = 0; t < 8; ++t) {
        EXPECT_EQ(b.inputs[i * 8 + t], static_cast<int32_t>(((s * 8 + t) * 7919) % 1000));
        EXPECT_EQ(b.targets[i * 8 + t], static_cast<int32_t>(((s * 8 + t + 1) * 7919) % 1000));
      }
    }
  }
}

TEST(Loader, ReaderExceptionSurfacesFromNext) {
  // The third micro-batch's read fails: the two before it are still handed out, then next()
  // rethrows the reader's exception, and keeps doing so.
  auto calls = std::make_shared<std::atomic<int>>(0);
  auto read = [calls](uint64_t begin, uint64_t n, int32_t* out) {
    if (calls->fetch_add(1) == 4) throw IoError("shard train-00003.bin: read failed");
    identity_read(begin, n, out);
  };
  const LoaderOptions o{.seq_len = kT, .micro_batch = 2, .global_batch = 6, .rank = 0, .world = 1};
  Loader loader(read, stream_of(50), kSeed, o, {});
  EXPECT_EQ(take(loader, 2, 2).size(), 4u);
  for (int i = 0; i < 2; ++i) {
    try {
      loader.next();
      ADD_FAILURE() << "next() did not throw";
    } catch (const IoError& e) {
      EXPECT_STREQ(e.what(), "shard train-00003.bin: read failed");
    }
  }

  // A reader that fails at once, with a non-tessera exception.
  Loader broken([](uint64_t, uint64_t, int32_t*) { throw std::runtime_error("boom"); }, stream_of(50), kSeed, o, {});
  EXPECT_THROW(broken.next(), std::runtime_error);
}

TEST(Loader, TooSmallStreamIsADataError) {
  const LoaderOptions o{.seq_len = kT, .micro_batch = 1, .global_batch = 1, .rank = 0, .world = 1};
  for (uint64_t tokens : {uint64_t{0}, uint64_t{1}, uint64_t{kT}}) {
    try {
      Loader loader(identity_read, tokens, kSeed, o, {});
      ADD_FAILURE() << tokens << " tokens accepted";
    } catch (const DataError& e) {
      EXPECT_EQ(std::string(e.what()), "dataset too small for seq_len 4: " + std::to_string(tokens) + " tokens");
    }
  }
  EXPECT_EQ(num_samples(kT + 1, kT), 1u);
  EXPECT_EQ(num_samples(2 * kT, kT), 1u);
  EXPECT_EQ(num_samples(2 * kT + 1, kT), 2u);
}

TEST(Loader, BadBatchGeometryIsAConfigError) {
  auto options = [](int64_t global_batch, int world, int rank, int64_t micro_batch) {
    return LoaderOptions{
        .seq_len = kT, .micro_batch = micro_batch, .global_batch = global_batch, .rank = rank, .world = world};
  };
  EXPECT_NO_THROW(validate(options(6, 3, 2, 2)));
  EXPECT_THROW(validate(options(6, 4, 0, 1)), ConfigError);  // W does not divide G
  EXPECT_THROW(validate(options(6, 2, 0, 2)), ConfigError);  // micro_batch does not divide G / W
  EXPECT_THROW(validate(options(6, 2, 2, 1)), ConfigError);  // rank out of range
  EXPECT_THROW(validate(options(6, 2, -1, 1)), ConfigError);
  EXPECT_THROW(validate(options(0, 1, 0, 1)), ConfigError);
  EXPECT_THROW(validate(options(6, 1, 0, 0)), ConfigError);
  EXPECT_THROW(Loader(identity_read, stream_of(50), kSeed, options(6, 4, 0, 1), {}), ConfigError);
}

TEST(Loader, PrefetchesWhileTheCallerHoldsABatch) {
  std::atomic<int> calls{0};
  auto read = [&calls](uint64_t begin, uint64_t n, int32_t* out) {
    identity_read(begin, n, out);
    calls.fetch_add(1);
  };
  const LoaderOptions o{.seq_len = kT, .micro_batch = 2, .global_batch = 6, .rank = 0, .world = 1};
  Loader loader(read, stream_of(50), kSeed, o, {});
  loader.next();
  // Without another call, the other slots fill: the batch held plus two ahead, two reads each.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (calls.load() < 6 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(calls.load(), 6);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(calls.load(), 6) << "the producer overwrote a slot that was not released";
}

TEST(Loader, DestructionStopsABlockedOrBusyProducer) {
  const LoaderOptions o{.seq_len = kT, .micro_batch = 4, .global_batch = 4, .rank = 0, .world = 1};
  { Loader idle(identity_read, stream_of(50), kSeed, o, {}); }  // producer waits for a free slot
  auto slow = [](uint64_t begin, uint64_t n, int32_t* out) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    identity_read(begin, n, out);
  };
  const auto start = std::chrono::steady_clock::now();
  { Loader busy(slow, stream_of(50), kSeed, o, {}); }  // producer is mid-batch
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
}

}  // namespace
}  // namespace tessera::data
