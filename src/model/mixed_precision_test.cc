// bf16 compute (Llama with bf16 = true over a source that hands out bf16 images) against fp32 on
// the tiny config: loss, every gradient, a short training run, and the fallback to fp32.
//
// Bounds: each GEMM input is rounded to bf16 (relative error up to 2^-9 = 2e-3, random in sign),
// so a GEMM output moves by ~1e-3 relative, and ~10 GEMMs in series compound that to a few 1e-3:
// the loss within 1e-2 relative, and each gradient's direction within 1.4e-2 of fp32's, i.e.
// 1 - cosine <= 1e-4 (1 - cos = e^2 / 2 for a relative error e orthogonal to the gradient).
// Observed: 1 - cosine <= 2.7e-5 (Zen 3, widened bf16 GEMMs; ~2e-5 with avx512_bf16 kernels) and
// curves within 1e-3; a bf16 path that silently ran in fp32 fails the inequality of the losses.
//
// Norm gains start at exactly 1, where reading one norm's gain in place of another's changes
// nothing; the gains are jittered here (uniform in [0.75, 1.25] by their offset in the unit, as
// the model parity test does, so that a block's two norms differ). The bf16 path reading the
// attention norm's gain for the MLP norm (docs/testing.md, M6) then gives 1 - cosine = 1.4e-3,
// 14x over the bound; bf16 rounds the jittered gains no worse than the unit ones (2^-9 either way).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/threads.h"
#include "fsdp/sharded_params.h"
#include "model/layout.h"
#include "model/llama.h"
#include "optim/adamw.h"

namespace tessera::model {
namespace {

constexpr int64_t kB = 4;

struct ModelAndParams {
  std::unique_ptr<fsdp::ShardedParams> params;
  std::unique_ptr<Llama> model;
};

ModelAndParams make(const ModelLayout& layout, bool bf16_params, bool bf16_model) {
  ModelAndParams r;
  r.params =
      std::make_unique<fsdp::ShardedParams>(layout, 42, fsdp::Strategy::kNoShard, parallel::Mesh::single(), 1,
                                            comm::Millis(0), bf16_params ? comm::DType::kBF16 : comm::DType::kF32);
  for (int u = 0; u < layout.num_units(); ++u) {
    for (const TensorSpec& t : layout.units()[u].tensors) {
      if (t.decay) continue;  // the norm gains
      float* g = r.params->master_shard(u) + t.offset;
      for (int64_t i = 0; i < t.numel(); ++i) g[i] = 1.0f + 0.5f * (rng::uniform(9, u, t.offset + i) - 0.5f);
    }
  }
  r.model = std::make_unique<Llama>(layout, kB, num_threads(), 0, bf16_model);
  return r;
}

// The gradient of the mean loss, as the trainer scales it.
double mean_loss_step(ModelAndParams& r, const std::vector<int32_t>& in, const std::vector<int32_t>& tgt) {
  const int64_t n = static_cast<int64_t>(tgt.size());
  const float scale = 1.0f / static_cast<float>(count_valid_targets(tgt.data(), n));
  return r.model->forward_backward(*r.params, in.data(), tgt.data(), scale).mean();
}

// Random tokens, so that every vocabulary row gets gradient.
void random_tokens(int64_t T, int64_t V, uint64_t seed, std::vector<int32_t>* in, std::vector<int32_t>* tgt) {
  in->resize(kB * T);
  tgt->resize(kB * T);
  for (int64_t i = 0; i < kB * T; ++i) {
    (*in)[i] = static_cast<int32_t>(rng::uniform(seed, 0, i) * V) % V;
    (*tgt)[i] = static_cast<int32_t>(rng::uniform(seed, 1, i) * V) % V;
  }
}

double cosine(const float* a, const float* b, int64_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < n; ++i) {
    ab += double{a[i]} * b[i];
    aa += double{a[i]} * a[i];
    bb += double{b[i]} * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

class MixedPrecision : public ::testing::TestWithParam<bool> {  // tied embeddings
 protected:
  void SetUp() override {
    saved_threads_ = num_threads();
    set_num_threads(2);
  }
  void TearDown() override { set_num_threads(saved_threads_); }
  ModelLayout layout() const {
    ModelConfig c;
    EXPECT_TRUE(model_preset("tiny", &c));
    c.tied_embeddings = GetParam();
    return ModelLayout(c);
  }

 private:
  int saved_threads_ = 1;
};

TEST_P(MixedPrecision, LossAndEveryGradientMatchFp32) {
  const ModelLayout lay = layout();
  const ModelConfig& c = lay.config();
  std::vector<int32_t> in, tgt;
  random_tokens(c.seq_len, c.vocab_size, 5, &in, &tgt);
  ModelAndParams fp32 = make(lay, false, false), bf16 = make(lay, true, true);
  fp32.params->begin_step();
  bf16.params->begin_step();
  const double loss32 = mean_loss_step(fp32, in, tgt);
  const double loss16 = mean_loss_step(bf16, in, tgt);
  EXPECT_NEAR(loss16, loss32, 1e-2 * loss32);
  EXPECT_NE(loss16, loss32) << "the bf16 path did not run";
  for (int u = 0; u < lay.num_units(); ++u) {
    for (const TensorSpec& t : lay.units()[u].tensors) {
      const float* g32 = fp32.params->grads(u) + t.offset;
      const float* g16 = bf16.params->grads(u) + t.offset;
      EXPECT_GT(cosine(g16, g32, t.numel()), 1 - 1e-4) << t.name;
    }
  }
}

// A model planned for bf16 over a source without bf16 images computes in fp32, bit for bit.
TEST_P(MixedPrecision, Fp32SourceFallsBackBitwise) {
  const ModelLayout lay = layout();
  const ModelConfig& c = lay.config();
  std::vector<int32_t> in, tgt;
  random_tokens(c.seq_len, c.vocab_size, 6, &in, &tgt);
  ModelAndParams plain = make(lay, false, false), planned = make(lay, false, true);
  plain.params->begin_step();
  planned.params->begin_step();
  const double a = mean_loss_step(plain, in, tgt);
  const double b = mean_loss_step(planned, in, tgt);
  EXPECT_EQ(a, b);
  for (int u = 0; u < lay.num_units(); ++u) {
    EXPECT_EQ(0, std::memcmp(plain.params->grads(u), planned.params->grads(u), lay.units()[u].padded * sizeof(float)))
        << lay.units()[u].name;
  }
}

// 30 AdamW steps on a learnable synthetic sequence (each token determines the next): both
// precisions learn it (the loss falls from ~ln V to about half), along curves within 2% of each
// other at every step.
TEST_P(MixedPrecision, TrainingCurveFollowsFp32) {
  const ModelLayout lay = layout();
  const ModelConfig& c = lay.config();
  const int64_t T = c.seq_len, V = c.vocab_size;
  std::vector<int32_t> in(kB * T), tgt(kB * T);
  std::vector<double> curves[2];
  for (bool bf16 : {false, true}) {
    ModelAndParams r = make(lay, bf16, bf16);
    optim::AdamW adamw({}, r.params->shard_sizes());
    for (int64_t step = 1; step <= 30; ++step) {
      for (int64_t b = 0; b < kB; ++b) {
        int32_t tok = static_cast<int32_t>(rng::uniform(7, step, b) * V) % V;
        for (int64_t t = 0; t <= T; ++t) {
          if (t < T) in[b * T + t] = tok;
          if (t > 0) tgt[b * T + t - 1] = tok;
          tok = static_cast<int32_t>((tok * 5 + 3) % V);
        }
      }
      r.params->begin_step();
      curves[bf16].push_back(mean_loss_step(r, in, tgt));
      const double norm = r.params->finish_step();
      r.params->apply_update(adamw, 3e-3, step, optim::clip_factor(norm, 1.0));
    }
  }
  const double first = curves[0].front(), last32 = curves[0].back(), last16 = curves[1].back();
  EXPECT_LT(last32, 0.6 * first);
  EXPECT_LT(last16, 0.6 * first);
  for (size_t i = 0; i < curves[0].size(); ++i) {
    EXPECT_NEAR(curves[1][i], curves[0][i], 0.02 * curves[0][i]) << "step " << i + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(Tied, MixedPrecision, ::testing::Bool(),
                         [](const auto& p) { return std::string(p.param ? "tied" : "untied"); });

}  // namespace
}  // namespace tessera::model
