// generate with the key/value cache against the uncached reference path (a full forward per
// token), past seq_len; sampling per prompt independent of the rest of the batch.
//
// The tiny model with random weights at init_std 0.2 (not 0.02: nearly uniform logits would make
// near-ties, which fp32 rounding of two different summation orders can flip, likely).
#include "train/generate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "core/rng.h"
#include "core/threads.h"
#include "fsdp/sharded_params.h"
#include "model/llama.h"

namespace tessera::train {
namespace {

// The sampler draws in proportion to softmax(z / T) over the tokens top_k and top_p keep, and
// never another token. Probabilities at T = 1 of 0.5, 0.25, 0.125, 0.0625, 0.0625 (tokens 2, 1,
// 4, 0, 3; the tie in id order); each case's expected frequencies against 40000 draws.
TEST(Sampler, DrawsInProportionFromTheTopKAndTheNucleus) {
  const std::vector<float> z = {std::log(0.0625f), std::log(0.25f), std::log(0.5f), std::log(0.0625f),
                                std::log(0.125f)};
  struct Case {
    double temperature;
    int64_t top_k;
    double top_p;
    std::vector<double> want;  // per token
  };
  const double q = 0.25 / 0.875, h = 0.5 / 0.875, e = 0.125 / 0.875;
  const Case cases[] = {
      {1.0, 0, 1.0, {0.0625, 0.25, 0.5, 0.0625, 0.125}},
      {1.0, 2, 1.0, {0, 1.0 / 3, 2.0 / 3, 0, 0}},
      {1.0, 0, 0.7, {0, 1.0 / 3, 2.0 / 3, 0, 0}},  // 0.5 < 0.7 <= 0.75
      {1.0, 0, 0.8, {0, q, h, 0, e}},
      {1.0, 0, 0.3, {0, 0, 1, 0, 0}},
      {1.0, 3, 0.9, {0, q, h, 0, e}},      // 0.9 of the top three's 0.875
      {0.5, 0, 0.9, {0, 0.2, 0.8, 0, 0}},  // p^2 normalized: 0.744, 0.186, ...; 0.744 < 0.9 <= 0.930
  };
  constexpr int kDraws = 40000;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "T " << c.temperature << ", top_k " << c.top_k << ", top_p " << c.top_p);
    SamplingOptions o;
    o.temperature = c.temperature;
    o.top_k = c.top_k;
    o.top_p = c.top_p;
    o.seed = 11;
    Sampler sampler(5, o);
    std::vector<int> count(5, 0);
    for (int i = 0; i < kDraws; ++i) ++count[sampler.next(z.data(), 0, i)];
    for (int t = 0; t < 5; ++t) {
      const double p = c.want[t], f = static_cast<double>(count[t]) / kDraws;
      if (p == 0) {
        EXPECT_EQ(count[t], 0) << "token " << t;
      } else {
        EXPECT_NEAR(f, p, 5 * std::sqrt(p * (1 - p) / kDraws) + 1e-12) << "token " << t;
      }
    }
  }
}

class Generate : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_threads_ = num_threads();
    set_num_threads(2);
    model::ModelConfig c;
    ASSERT_TRUE(model::model_preset("tiny", &c));
    c.init_std = 0.2;
    layout_ = std::make_unique<model::ModelLayout>(c);
    params_ = std::make_unique<fsdp::ShardedParams>(*layout_, 7, fsdp::Strategy::kNoShard, parallel::Mesh::single(), 1,
                                                    comm::Millis(0));
  }
  void TearDown() override { set_num_threads(saved_threads_); }

  std::vector<int32_t> tokens(int64_t n, uint64_t seed) const {
    std::vector<int32_t> t(n);
    const int64_t V = layout_->config().vocab_size;
    for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>(rng::uniform(seed, 0, i) * V) % V;
    return t;
  }
  std::vector<std::vector<int32_t>> run(const std::vector<std::vector<int32_t>>& prompts, SamplingOptions o) {
    std::vector<std::vector<int32_t>> seen(prompts.size());
    auto out =
        generate(*layout_, *params_, prompts, stop_, o, [&](int64_t b, int32_t t, double) { seen[b].push_back(t); });
    EXPECT_EQ(seen, out) << "on_token saw other tokens than returned";
    return out;
  }

  std::unique_ptr<model::ModelLayout> layout_;
  std::unique_ptr<fsdp::ShardedParams> params_;
  std::vector<int32_t> stop_;  // run's stop tokens

 private:
  int saved_threads_ = 1;
};

// Prompts of 5 and 30 tokens and one longer than seq_len (64), 80 new tokens each: every
// sequence crosses seq_len, where the cached path re-runs the last seq_len tokens per token.
TEST_F(Generate, GreedyWithCacheEqualsWithoutPastSeqLen) {
  const int64_t T = layout_->config().seq_len;
  const std::vector<std::vector<int32_t>> prompts = {tokens(5, 1), tokens(30, 2), tokens(T + 10, 3)};
  SamplingOptions o;
  o.temperature = 0;
  o.max_tokens = 80;
  const auto cached = run(prompts, o);
  o.kv_cache = false;
  const auto uncached = run(prompts, o);
  for (size_t b = 0; b < prompts.size(); ++b) {
    ASSERT_EQ(cached[b].size(), 80u);
    EXPECT_EQ(cached[b], uncached[b]) << "prompt " << b;
  }
}

// Sampled: one prompt with the cache draws what the uncached path (the single-prompt generation
// of before) draws for the seed; a prompt's draws do not change when another prompt of the batch
// does.
TEST_F(Generate, SamplingPerPromptIndependentOfTheBatch) {
  SamplingOptions o;
  o.temperature = 0.8;
  o.seed = 11;
  o.max_tokens = 40;
  const std::vector<int32_t> a = tokens(9, 4), b = tokens(20, 5), c = tokens(3, 6);
  const auto one = run({a}, o);
  EXPECT_EQ(one, run({a}, o)) << "not deterministic";
  const auto batch = run({a, b, c}, o), other = run({a, tokens(33, 7), c}, o);
  EXPECT_EQ(batch[0], one[0]);
  EXPECT_EQ(other[0], batch[0]);
  EXPECT_EQ(other[2], batch[2]);
  EXPECT_NE(batch[1], other[1]);
  o.kv_cache = false;
  EXPECT_EQ(run({a}, o), one);
}

// A continuation ends before the first token of the stop set it meets (an EOS and an end of turn),
// with the cache and without; a prompt that stops leaves the others of its batch running.
TEST_F(Generate, EndsBeforeAnyOfItsStopTokens) {
  SamplingOptions o;
  o.temperature = 0;
  o.max_tokens = 30;
  const std::vector<std::vector<int32_t>> prompts = {tokens(7, 8), tokens(12, 9)};
  const auto free = run(prompts, o);
  int32_t unseen = 0;  // a token neither continuation holds, first in the set
  while (std::count(free[0].begin(), free[0].end(), unseen) + std::count(free[1].begin(), free[1].end(), unseen) > 0)
    ++unseen;
  stop_ = {unseen, free[0][10]};
  std::vector<std::vector<int32_t>> want = free;
  for (auto& w : want) w.erase(std::find_first_of(w.begin(), w.end(), stop_.begin(), stop_.end()), w.end());
  ASSERT_LE(want[0].size(), 10u);
  for (const bool cache : {true, false}) {
    o.kv_cache = cache;
    EXPECT_EQ(run(prompts, o), want) << (cache ? "with" : "without") << " the cache";
  }
}

// The log-probabilities handed out are the model's: the log-softmax of a full forward's logits at
// the position before each token (the uncached path's own logits: to double rounding), at
// temperature 1 although sampling ran at 0.8 with top-k; the cached path's within twice the
// decoder's logit bound (1e-5, model/decoder_test.cc).
TEST_F(Generate, LogProbabilitiesAreTheModelsLogSoftmax) {
  SamplingOptions o;
  o.temperature = 0.8;
  o.seed = 3;
  o.max_tokens = 6;
  const std::vector<int32_t> prompt = tokens(7, 8);
  const auto sample = [&](SamplingOptions options) {
    std::vector<int32_t> got;
    std::vector<double> logprobs;
    generate(*layout_, *params_, {prompt}, {}, options, [&](int64_t, int32_t t, double logprob) {
      got.push_back(t);
      logprobs.push_back(logprob);
    });
    return std::make_pair(got, logprobs);
  };
  o.kv_cache = false;
  const auto [got, logprobs] = sample(o);
  ASSERT_EQ(got.size(), 6u);
  const int64_t T = layout_->config().seq_len, V = layout_->config().vocab_size;
  model::Llama model(*layout_, 1, 2);
  std::vector<int32_t> context = prompt, padded(T, 0);
  std::vector<float> logits(T * V);
  for (size_t i = 0; i < got.size(); ++i) {
    std::copy(context.begin(), context.end(), padded.begin());
    model.forward_logits(*params_, padded.data(), logits.data());
    const float* z = logits.data() + (context.size() - 1) * V;
    long double sum = 0.0L;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<long double>(z[v]));
    const double expected = static_cast<double>(static_cast<long double>(z[got[i]]) - std::log(sum));
    EXPECT_NEAR(logprobs[i], expected, 1e-9) << "token " << i;
    context.push_back(got[i]);
  }
  o.kv_cache = true;
  const auto [cached, cached_logprobs] = sample(o);
  EXPECT_EQ(cached, got);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(cached_logprobs[i], logprobs[i], 2e-5) << "token " << i;
}

}  // namespace
}  // namespace tessera::train
