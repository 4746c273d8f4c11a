// Resharding (RELIABILITY.md row 15): a checkpoint saved by 4 ranks (full_shard, or with 2
// tensor-parallel ranks or 2 pipeline stages), or by 8 as pipeline 2 x tensor 2 x data 2, loads
// at other world sizes, strategies,
// tensor-parallel sizes and pipeline stages with parameters and AdamW moments exactly equal after
// gathering, at the same data position; saving it again there, or resharding it offline, gives
// the same shard files.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "checkpoint/checkpointer.h"
#include "checkpoint/directory.h"
#include "checkpoint/reshard.h"
#include "checkpoint/resume.h"
#include "core/file_io.h"
#include "launch/local_workers.h"
#include "parallel/job.h"
#include "train/trainer.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

config::Config make_config(int nproc, const std::string& strategy, int group, int tensor = 1, int pipeline = 1) {
  return config::load("", {{"model.preset", "tiny"},
                           {"data.synthetic", "true"},
                           {"train.batch_size", "12"},
                           {"train.threads", "1"},
                           {"train.warmup_steps", "1"},
                           {"parallel.nproc", std::to_string(nproc)},
                           {"parallel.tensor", std::to_string(tensor)},
                           {"parallel.pipeline", std::to_string(pipeline)},
                           {"parallel.strategy", strategy},
                           {"parallel.shard_group_size", std::to_string(group)},
                           {"parallel.timeout_ms", "30000"},
                           {"checkpoint.interval_minutes", "0"}});
}

struct Target {
  int world;
  const char* strategy;
  int group;
  int tensor = 1;
  int source_tensor = 1;  // the ranks that save: full_shard over source_world / (tensor x pipeline)
  int pipeline = 1;
  int source_pipeline = 1;
  int source_world = 4;
};

std::string name_of(const Target& t) {
  return fmt::format("{}_w{}{}{}{}{}{}", t.strategy, t.world, t.tensor > 1 ? fmt::format("_tp{}", t.tensor) : "",
                     t.pipeline > 1 ? fmt::format("_pp{}", t.pipeline) : "",
                     t.source_tensor > 1 ? fmt::format("_from_tp{}", t.source_tensor) : "",
                     t.source_pipeline > 1 ? fmt::format("_from_pp{}", t.source_pipeline) : "",
                     t.source_world != 4 ? fmt::format("_from_w{}", t.source_world) : "");
}
void PrintTo(const Target& t, std::ostream* os) { *os << name_of(t); }

class Reshard : public ::testing::TestWithParam<Target> {};

TEST_P(Reshard, ExactAtAnotherWorldSize) {
  const Target t = GetParam();
  const fs::path dir = fs::path(::testing::TempDir()) / fmt::format("reshard_{}_{}_{}", t.world, t.strategy, getpid());
  fs::remove_all(dir);
  fs::create_directories(dir / "store4");
  fs::create_directories(dir / "store");
  const std::string saved = (dir / "w4").string(), loaded = (dir / "target").string();

  // The saving ranks: 3 steps, then a checkpoint.
  const int W0 = t.source_world;
  const config::Config c4 = make_config(W0, "full_shard", 0, t.source_tensor, t.source_pipeline);
  ASSERT_EQ(launch::run_local_workers(W0,
                                      [&](int rank) {
                                        const parallel::Job job({(dir / "store4").string(), "job", "0", rank, W0},
                                                                parallel::dims_for(c4, W0), comm::Millis(30000));
                                        train::Trainer trainer(c4, "", job.view());
                                        for (int i = 0; i < 3; ++i) trainer.step();
                                        checkpoint::Checkpointer checkpointer(c4, saved, job.view());
                                        checkpointer.save(trainer.shards(), trainer.state());
                                        return checkpointer.wait() ? 0 : 1;
                                      }),
            0);
  const std::string step_dir = saved + "/" + checkpoint::step_dir_name(3);

  // Load at the target, check the data position, save again.
  const config::Config ct = make_config(t.world, t.strategy, t.group, t.tensor, t.pipeline);
  const parallel::ParallelDims dims = parallel::dims_for(ct, t.world);
  const int S = dims.dp_shard, T = dims.tp, P = dims.pp;
  ASSERT_EQ(launch::run_local_workers(t.world,
                                     [&](int rank) {
                                       const parallel::Job job({(dir / "store").string(), "job", "0", rank, t.world}, dims, comm::Millis(30000));
                                       train::Trainer trainer(ct, "", job.view());
                                       trainer.restore(checkpoint::load_checkpoint(step_dir, trainer.shards(), ct));
                                       const checkpoint::TrainingState s = trainer.state();
                                       if (s.step != 3 || s.tokens != 3 * 12 * 64 || s.sampler_position != 36) return 2;
                                       checkpoint::Checkpointer checkpointer(ct, loaded, job.view());
                                       checkpointer.save(trainer.shards(), trainer.state());
                                       if (!checkpointer.wait()) return 3;
                                       trainer.step();  // continues with the next global batch: samples [36, 48)
                                       return trainer.state().sampler_position == 48 ? 0 : 4;
                                     }),
            0);

  checkpoint::CheckpointReader a(step_dir), b(loaded + "/" + checkpoint::step_dir_name(3));
  EXPECT_EQ(b.manifest().world, t.world);
  EXPECT_EQ(b.manifest().shard_size, S);
  EXPECT_EQ(b.manifest().tensor_parallel, T);
  EXPECT_EQ(b.manifest().pipeline_parallel, P);
  EXPECT_EQ(b.manifest().files.size(), static_cast<size_t>(S * T * P));
  for (const char* kind : {"param", "exp_avg", "exp_avg_sq"}) {
    const auto x = a.tensors(kind), y = b.tensors(kind);
    ASSERT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(x[i].name, y[i].name);
      EXPECT_EQ(x[i].shape, y[i].shape) << x[i].name;
      EXPECT_EQ(x[i].data, y[i].data) << x[i].name << "." << kind;  // bitwise
    }
  }
  // Offline: the same files as loading and saving in a live job.
  const std::string offline = checkpoint::reshard(step_dir, (dir / "offline").string(), ct);
  for (int pp = 0; pp < P; ++pp) {
    for (int tp = 0; tp < T; ++tp) {
      for (int k = 0; k < S; ++k) {
        const std::string name = checkpoint::shard_file_name(k, tp, T, pp, P);
        EXPECT_EQ(read_file(offline + "/" + name), read_file(loaded + "/" + checkpoint::step_dir_name(3) + "/" + name))
            << name;
      }
    }
  }
  EXPECT_TRUE(checkpoint::verify(offline).empty());
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Targets, Reshard,
                         ::testing::Values(Target{1, "full_shard", 0}, Target{2, "full_shard", 0},
                                           Target{3, "shard_grad_op", 0}, Target{4, "hybrid_shard", 2},
                                           Target{2, "no_shard", 0},
                                           // Into and out of tensor parallelism.
                                           Target{2, "full_shard", 0, 2}, Target{4, "hybrid_shard", 1, 2},
                                           Target{1, "full_shard", 0, 1, 2}, Target{3, "shard_grad_op", 0, 1, 2},
                                           Target{2, "no_shard", 0, 2, 2}, Target{4, "full_shard", 0, 2, 2},
                                           // Into and out of pipeline stages.
                                           Target{2, "full_shard", 0, 1, 1, 2}, Target{4, "full_shard", 0, 2, 1, 2},
                                           Target{1, "full_shard", 0, 1, 1, 1, 2}, Target{4, "no_shard", 0, 1, 2, 2, 2},
                                           // Saved at pipeline 2 x tensor 2 x data 2: at one process and at
                                           // tensor 2 x data 4.
                                           Target{1, "full_shard", 0, 1, 2, 1, 2, 8},
                                           Target{8, "full_shard", 0, 2, 2, 1, 2, 8}),
                         [](const auto& p) { return name_of(p.param); });

}  // namespace
}  // namespace tessera
