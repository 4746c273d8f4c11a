// AdamW's step count across a skipped (non-finite) step, against torch.optim.AdamW
// (tests/torch_ref/check_adamw.py): with train.on_nonfinite = skip the skipped step leaves the
// parameters, the moments and AdamW's own step count where they were, as PyTorch's GradScaler
// skips optimizer.step(), so the next update equals torch's step from that state. Counting the
// skipped step scales the bias-corrected update by ~0.9 here (0.73 after a skip at step 1).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/json.h"
#include "npy.h"
#include "train/trainer.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

// Every tensor of one kind of per-element state (`shard(unit)`: a single process's whole unit).
template <typename Shard>
void write_state(const fs::path& dir, const model::ModelLayout& layout, Shard shard) {
  fs::create_directories(dir);
  for (int u = 0; u < layout.num_units(); ++u) {
    const float* base = shard(u);
    for (const model::TensorSpec& t : layout.units()[u].tensors) {
      testing::write_npy(dir / (t.name + ".npy"), std::vector<float>(base + t.offset, base + t.offset + t.numel()),
                         t.shape);
    }
  }
}

TEST(OptimizerParity, UpdateAfterASkippedStepMatchesPyTorch) {
  const config::Config c = config::load("", {{"model.preset", "tiny"},
                                             {"data.synthetic", "true"},
                                             {"train.batch_size", "4"},
                                             {"train.threads", "2"},
                                             {"train.max_steps", "10"},
                                             {"train.warmup_steps", "0"},
                                             {"train.grad_clip", "0"},  // the update reads the gradient as is
                                             {"train.on_nonfinite", "skip"}});
  train::Trainer trainer(c, "");
  const model::ModelLayout& layout = trainer.layout();
  fsdp::ShardedParams& p = trainer.params();
  trainer.step();
  trainer.step();
  // Step 3: a NaN final-norm gain makes every logit, so the loss, NaN; the update is skipped.
  const int head = layout.head_unit();
  float* gain = p.master_shard(head) + layout.head_norm_offset();
  const float saved = *gain;
  *gain = std::numeric_limits<float>::quiet_NaN();
  const train::StepStats skipped = trainer.step();
  ASSERT_TRUE(skipped.skipped);
  *gain = saved;
  EXPECT_EQ(trainer.state().step, 3);
  EXPECT_EQ(trainer.state().optimizer_steps, 2);

  const fs::path dir = fs::path(::testing::TempDir()) / fmt::format("adamw_{}", ::getpid());
  fs::remove_all(dir);
  write_state(dir / "param", layout, [&](int u) { return p.master_shard(u); });
  write_state(dir / "exp_avg", layout, [&](int u) { return trainer.optimizer().exp_avg(u); });
  write_state(dir / "exp_avg_sq", layout, [&](int u) { return trainer.optimizer().exp_avg_sq(u); });
  const train::StepStats s = trainer.step();
  ASSERT_FALSE(s.skipped);
  EXPECT_EQ(trainer.state().optimizer_steps, 3);
  write_state(dir / "grad", layout, [&](int u) { return p.grads(u); });  // one process: the whole unit
  write_state(dir / "param_after", layout, [&](int u) { return p.master_shard(u); });
  write_state(dir / "exp_avg_after", layout, [&](int u) { return trainer.optimizer().exp_avg(u); });
  write_state(dir / "exp_avg_sq_after", layout, [&](int u) { return trainer.optimizer().exp_avg_sq(u); });
  nlohmann::json decay = nlohmann::json::array();
  for (const auto& unit : layout.units()) {
    for (const auto& t : unit.tensors) {
      if (t.decay) decay.push_back(t.name);
    }
  }
  const nlohmann::json cfg = {{"lr", s.lr},
                              {"beta1", c.train.beta1},
                              {"beta2", c.train.beta2},
                              {"eps", c.train.eps},
                              {"weight_decay", c.train.weight_decay},
                              {"step", 2},
                              {"decay", decay}};
  std::ofstream(dir / "config.json") << dump_json(cfg, 2);

  const std::string cmd =
      fmt::format("{} {}/tests/torch_ref/check_adamw.py {}", TESSERA_TORCH_PYTHON, TESSERA_SOURCE_DIR, dir.string());
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << "AdamW after a skipped step differs from PyTorch (data kept in " << dir << "): " << cmd;
  if (rc == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera
