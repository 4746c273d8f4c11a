// The whole model against an independent PyTorch implementation (tests/torch_ref): logits, loss,
// every parameter gradient, and 10 AdamW steps (their losses, gradient norms and the parameters
// they end at), with weights handed over through .npy files. Variants reach what the plain case
// cannot: a clip that some steps cross, ignored targets, and sequences longer than one attention
// tile (64 query rows).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/json.h"
#include "core/rng.h"
#include "core/threads.h"
#include "fsdp/sharded_params.h"
#include "model/llama.h"
#include "npy.h"
#include "optim/adamw.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

struct Variant {
  const char* name;
  int64_t n_heads, n_kv_heads;
  bool tied;
  int64_t seq_len = 64;
  double grad_clip = 0.0;  // 0: off; the tiny case's norms fall from 0.80 to 0.69 over its 10 steps
  bool ignored = false;    // some targets -1 (ignored by the loss), unevenly over the rows
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

class ModelParity : public ::testing::TestWithParam<Variant> {};

TEST_P(ModelParity, MatchesPyTorch) {
  const Variant& variant = GetParam();
  model::ModelConfig c;
  ASSERT_TRUE(model::model_preset("tiny", &c));
  c.n_heads = variant.n_heads;
  c.n_kv_heads = variant.n_kv_heads;
  c.tied_embeddings = variant.tied;
  c.seq_len = variant.seq_len;
  const int64_t B = 4, T = c.seq_len, steps = 10;
  set_num_threads(2);

  const model::ModelLayout layout(c);
  fsdp::ShardedParams params(layout, 42, fsdp::Strategy::kNoShard, parallel::Mesh::single(), 1, comm::Millis(0));
  model::Llama llama(layout, B, num_threads());

  // Norm gains start at exactly 1; jitter them, by their offset in the unit so that a block's two
  // norms differ, so that gradients that depend on the gain are checked with a general value and
  // a gain read for the wrong norm shows.
  for (int u = 0; u < layout.num_units(); ++u) {
    float* unit = params.master_shard(u);
    for (const auto& t : layout.units()[u].tensors) {
      if (t.decay) continue;
      for (int64_t e = t.offset; e < t.offset + t.numel(); ++e) unit[e] = 1.0f + 0.5f * (rng::uniform(9, u, e) - 0.5f);
    }
  }

  const fs::path dir = fs::path(::testing::TempDir()) / fmt::format("parity_{}_{}", variant.name, ::getpid());
  for (const char* sub : {"params", "grads", "final"}) fs::create_directories(dir / sub);
  optim::AdamWConfig adam{1e-3, 0.9, 0.95, 1e-8, 0.1};
  optim::AdamW adamw(adam, params.shard_sizes());
  nlohmann::json cfg = {{"vocab_size", c.vocab_size},
                        {"dim", c.dim},
                        {"n_layers", c.n_layers},
                        {"n_heads", c.n_heads},
                        {"n_kv_heads", c.n_kv_heads},
                        {"ffn_hidden", c.ffn_hidden},
                        {"seq_len", c.seq_len},
                        {"rope_theta", c.rope_theta},
                        {"norm_eps", c.norm_eps},
                        {"tied_embeddings", c.tied_embeddings},
                        {"batch", B},
                        {"steps", steps},
                        {"lr", adam.lr},
                        {"beta1", adam.beta1},
                        {"beta2", adam.beta2},
                        {"eps", adam.eps},
                        {"weight_decay", adam.weight_decay},
                        {"grad_clip", variant.grad_clip}};
  std::ofstream(dir / "config.json") << dump_json(cfg, 2);
  for (const auto& t : params.gather_named_tensors())
    testing::write_npy(dir / "params" / (t.name + ".npy"), t.data, t.shape);

  std::vector<int32_t> inputs(B * T), targets(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    inputs[i] = static_cast<int32_t>(rng::bits(7, 1, i) % c.vocab_size);
    targets[i] = static_cast<int32_t>(rng::bits(7, 2, i) % c.vocab_size);
    // Row b ignores every (b + 2)-th target and, for b = 3, its whole second half.
    const int64_t b = i / T, t = i % T;
    if (variant.ignored && (t % (b + 2) == 0 || (b == 3 && t >= T / 2))) targets[i] = -1;
  }
  const int64_t valid = model::count_valid_targets(targets.data(), B * T);
  testing::write_npy(dir / "inputs.npy", inputs, {B, T});
  testing::write_npy(dir / "targets.npy", targets, {B, T});

  std::vector<float> logits(B * T * c.vocab_size);
  llama.forward_logits(params, inputs.data(), logits.data());
  testing::write_npy(dir / "logits.npy", logits, {B, T, c.vocab_size});

  std::vector<float> losses, norms;
  int clipped = 0;
  for (int64_t step = 1; step <= steps; ++step) {
    params.begin_step();
    const float scale = 1.0f / static_cast<float>(valid);  // the gradient of the mean loss
    losses.push_back(static_cast<float>(llama.forward_backward(params, inputs.data(), targets.data(), scale).mean()));
    if (step == 1) {
      const float loss = losses[0];
      testing::write_npy(dir / "loss.npy", "<f4", &loss, sizeof(float), {});
      for (int u = 0; u < layout.num_units(); ++u) {
        for (const auto& t : layout.units()[u].tensors) {
          const float* g = params.grads(u) + t.offset;
          testing::write_npy(dir / "grads" / (t.name + ".npy"), std::vector<float>(g, g + t.numel()), t.shape);
        }
      }
    }
    const double norm = params.finish_step();
    norms.push_back(static_cast<float>(norm));
    const double clip = optim::clip_factor(norm, variant.grad_clip);
    clipped += clip < 1.0;
    params.apply_update(adamw, adam.lr, step, clip);
  }
  if (variant.grad_clip > 0) {
    // The clip matters only where it changes from step to step (AdamW is blind to a constant factor).
    EXPECT_GT(clipped, 0) << "no step crossed grad_clip " << variant.grad_clip << ": norms "
                          << fmt::format("{}", fmt::join(norms, " "));
    EXPECT_LT(clipped, steps) << "every step crossed grad_clip " << variant.grad_clip;
  }
  testing::write_npy(dir / "losses.npy", losses, {steps});
  testing::write_npy(dir / "grad_norms.npy", norms, {steps});
  for (const auto& t : params.gather_named_tensors())
    testing::write_npy(dir / "final" / (t.name + ".npy"), t.data, t.shape);

  const std::string cmd =
      fmt::format("{} {}/tests/torch_ref/check_parity.py {}", TESSERA_TORCH_PYTHON, TESSERA_SOURCE_DIR, dir.string());
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << "PyTorch parity failed for " << variant.name << " (data kept in " << dir << "): " << cmd;
  if (rc == 0) fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Variants, ModelParity,
                         ::testing::Values(Variant{"tiny", 4, 2, false}, Variant{"mha", 4, 4, false},
                                           Variant{"gqa8x2", 8, 2, false}, Variant{"tied", 4, 2, true},
                                           Variant{"clip", 4, 2, false, 64, 0.75},
                                           Variant{"ignored", 4, 2, false, 64, 0.0, true},
                                           Variant{"t130", 4, 2, false, 130}),
                         [](const auto& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace tessera
