// The key/value-cache decoder against Llama::forward_logits on the same tokens: the logits after
// every position, for a batch of sequences with different prompt lengths, at several
// grouped-query shapes; a sequence alone against the same sequence in a batch; bf16 weights
// against fp32.
//
// Bound (fp32): both run the same kernels in the same order of operations per row; what differs
// is only how the GEMMs and the attention sums are blocked (the decoder's GEMMs see fewer rows,
// its score GEMMs fewer keys), i.e. the order of fp32 sums of K <= 2F = 384 terms. Each such sum
// moves by ~u sqrt(K) ~ 1.2e-6 of its terms' magnitude (cpu_vs_ref_test.cc's rounding model), and
// two blocks plus the head compound a handful of them, so a row's logits agree within 1e-5 of
// the row's largest logit. Observed: <= 1e-6 (here often bitwise). A cached step at the wrong
// RoPE position or attending one key too few or too many moves logits by 1e-2 and more.
#include "model/decoder.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "core/threads.h"
#include "fsdp/sharded_params.h"
#include "model/decoder_test_util.h"
#include "model/layout.h"
#include "model/llama.h"

namespace tessera::model {
namespace {

using testing::random_tokens;
using testing::row_error;

std::unique_ptr<fsdp::ShardedParams> make_params(const ModelLayout& layout, bool bf16) {
  auto p = std::make_unique<fsdp::ShardedParams>(layout, 42, fsdp::Strategy::kNoShard, parallel::Mesh::single(), 1,
                                                 comm::Millis(0), bf16 ? comm::DType::kBF16 : comm::DType::kF32);
  // Norm gains jittered (as in mixed_precision_test.cc), so that reading one norm's gain for
  // another's shows.
  for (int u = 0; u < layout.num_units(); ++u) {
    for (const TensorSpec& t : layout.units()[u].tensors) {
      if (t.decay) continue;
      float* g = p->master_shard(u) + t.offset;
      for (int64_t i = 0; i < t.numel(); ++i) g[i] = 1.0f + 0.5f * (rng::uniform(9, u, t.offset + i) - 0.5f);
    }
  }
  return p;
}

struct Shape {
  const char* name;
  int64_t n_heads, n_kv_heads, seq_len;
  bool tied;
};
void PrintTo(const Shape& s, std::ostream* os) { *os << s.name; }

class DecoderTest : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    saved_threads_ = num_threads();
    set_num_threads(2);
  }
  void TearDown() override { set_num_threads(saved_threads_); }
  ModelConfig config() const {
    ModelConfig c;
    EXPECT_TRUE(model_preset("tiny", &c));
    c.n_heads = GetParam().n_heads;
    c.n_kv_heads = GetParam().n_kv_heads;
    c.seq_len = GetParam().seq_len;
    c.tied_embeddings = GetParam().tied;
    return c;
  }

 private:
  int saved_threads_ = 1;
};

// Three sequences with prompts of different lengths, prefilled as one batch and stepped to
// seq_len: the logits after every position match Llama's over the whole sequence.
TEST_P(DecoderTest, EveryPositionMatchesForwardLogits) {
  const ModelLayout layout(config());
  const ModelConfig& c = layout.config();
  const int64_t T = c.seq_len, V = c.vocab_size, B = 3;
  auto params = make_params(layout, false);
  std::vector<std::vector<int32_t>> seqs;
  std::vector<int32_t> all;
  for (int64_t b = 0; b < B; ++b) {
    seqs.push_back(random_tokens(T, V, 10 + b));
    all.insert(all.end(), seqs[b].begin(), seqs[b].end());
  }
  Llama llama(layout, B, num_threads());
  std::vector<float> want(B * T * V);
  llama.forward_logits(*params, all.data(), want.data());

  // Prompt lengths 1, about T/2 and about 3T/4 (with seq_len 256 the prefill runs in two passes).
  const int64_t prompt[3] = {1, T / 2 + 1, 3 * T / 4};
  Decoder dec(layout, B, T, num_threads());
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t b = 0; b < B; ++b) prompts.emplace_back(seqs[b].begin(), seqs[b].begin() + prompt[b]);
  const float* z = dec.prefill(*params, prompts);
  double worst = 0.0;
  auto check = [&](int64_t b, int64_t pos, const float* got) {
    const double e = row_error(got, want.data() + (b * T + pos) * V, V);
    worst = std::max(worst, e);
    EXPECT_LE(e, 1e-5) << "sequence " << b << " position " << pos;
  };
  for (int64_t b = 0; b < B; ++b) check(b, prompt[b] - 1, z + b * V);
  // Steps: a sequence whose prompt ran out appends its next token; one at seq_len appends none.
  std::vector<std::vector<int32_t>> next(B);
  std::vector<std::span<const int32_t>> spans(B);
  for (int64_t pos = 1; pos < T; ++pos) {
    for (int64_t b = 0; b < B; ++b) {
      next[b].clear();
      if (pos >= prompt[b]) next[b].push_back(seqs[b][pos]);
      spans[b] = next[b];
    }
    z = dec.append(*params, spans);
    for (int64_t b = 0; b < B; ++b) {
      if (pos >= prompt[b]) check(b, pos, z + b * V);
    }
  }
  for (int64_t b = 0; b < B; ++b) EXPECT_EQ(dec.length(b), T);
  RecordProperty("max_row_error", fmt::format("{:.3g}", worst));
}

// A sequence's logits do not depend on the other sequences in its batch (up to GEMM blocking).
TEST_P(DecoderTest, AloneEqualsInABatch) {
  const ModelLayout layout(config());
  const ModelConfig& c = layout.config();
  const int64_t T = c.seq_len, V = c.vocab_size;
  auto params = make_params(layout, false);
  const std::vector<int32_t> seq = random_tokens(T, V, 20);
  const std::vector<std::vector<int32_t>> batch = {
      random_tokens(5, V, 21), {seq.begin(), seq.begin() + T / 3}, random_tokens(T / 2, V, 22)};
  Decoder alone(layout, 1, T, num_threads()), together(layout, 3, T, num_threads());
  const float* a = alone.prefill(*params, {batch[1]});
  const float* b = together.prefill(*params, batch);
  EXPECT_LE(row_error(b + V, a, V), 1e-5);
  const int32_t tokens[3] = {1, seq[T / 3], 2};
  a = alone.step(*params, tokens + 1);
  b = together.step(*params, tokens);
  EXPECT_LE(row_error(b + V, a, V), 1e-5);
}

// bf16 weights: each weight GEMM's inputs rounded to bf16 (2^-9 relative, random in sign), ~10
// GEMMs in series, so a logit moves by a few 1e-3 of the row's scale (mixed_precision_test.cc's
// reasoning), and the largest of V = 512 such moves by ~3x that: 1e-2 of the row's largest logit.
// Observed 2e-3 to 4.5e-3; the MLP norm reading the attention norm's gain gives 1.9e-2 to 4.7e-2.
// A bf16 path that silently ran in fp32 fails the inequality.
TEST_P(DecoderTest, Bf16WeightsWithinBf16BoundOfFp32) {
  const ModelLayout layout(config());
  const ModelConfig& c = layout.config();
  const int64_t T = c.seq_len, V = c.vocab_size;
  auto p32 = make_params(layout, false), p16 = make_params(layout, true);
  const std::vector<std::vector<int32_t>> prompts = {random_tokens(7, V, 30), random_tokens(T / 2, V, 31)};
  Decoder d32(layout, 2, T, num_threads()), d16(layout, 2, T, num_threads(), true);
  std::vector<float> z32(2 * V);
  const float* z = d32.prefill(*p32, prompts);
  std::copy(z, z + 2 * V, z32.begin());
  const float* z16 = d16.prefill(*p16, prompts);
  double worst = 0.0;
  for (int64_t b = 0; b < 2; ++b) {
    const double e = row_error(z16 + b * V, z32.data() + b * V, V);
    worst = std::max(worst, e);
    EXPECT_LE(e, 1e-2) << "sequence " << b;
  }
  EXPECT_GT(worst, 0.0) << "the bf16 path did not run";
  RecordProperty("max_row_error", fmt::format("{:.3g}", worst));
}

TEST(Decoder, RefusesTensorParallelLayouts) {
  ModelConfig c;
  ASSERT_TRUE(model_preset("tiny", &c));
  const ModelLayout tp(c, 16, TensorParallel{2, 0, false});
  EXPECT_THROW(Decoder(tp, 1, c.seq_len, 1), ConfigError);
}

INSTANTIATE_TEST_SUITE_P(Shapes, DecoderTest,
                         ::testing::Values(Shape{"gqa", 4, 2, 64, false}, Shape{"mha", 4, 4, 64, true},
                                           Shape{"mqa_long", 4, 1, 256, false}),
                         [](const auto& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace tessera::model
