// Every sharding strategy, in real processes over real Gloo on loopback, against the
// single-process run of the same global batch: 5 steps give the same parameters within 1e-5
// (relative, per tensor) and the same losses.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "checkpoint/safetensors.h"
#include "train/distributed.h"
#include "train/trainer.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

struct Case {
  const char* strategy;
  int world;
  int shard_group_size;  // hybrid only
  int micro_batch;       // per rank; global batch 12
  bool tied;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.strategy << "_w" << c.world << "_mb" << c.micro_batch << (c.tied ? "_tied" : "");
}

config::Config make_config(const Case& c, int micro_batch, int nproc) {
  // One thread per process: the workers are forked, and OpenMP must not have started before.
  return config::load("", {{"model.preset", "tiny"},
                           {"model.tied_embeddings", c.tied ? "true" : "false"},
                           {"data.synthetic", "true"},
                           {"train.batch_size", "12"},
                           {"train.micro_batch_size", std::to_string(micro_batch)},
                           {"train.threads", "1"},
                           {"train.lr", "1e-3"},
                           {"train.warmup_steps", "2"},
                           {"train.max_steps", "5"},
                           {"parallel.nproc", std::to_string(nproc)},
                           {"parallel.strategy", c.strategy},
                           {"parallel.shard_group_size", std::to_string(nproc > 1 ? c.shard_group_size : 0)},
                           {"parallel.timeout_ms", "30000"}});
}

class Fsdp : public ::testing::TestWithParam<Case> {};

TEST_P(Fsdp, MatchesOneProcess) {
  const Case& c = GetParam();
  const fs::path dir = fs::path(::testing::TempDir()) / fmt::format("fsdp_{}_{}_{}", c.strategy, c.world, getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const config::Config sharded = make_config(c, c.micro_batch, c.world);
  const int rc = train::run_local_workers(c.world, [&](int rank) {
    train::ProcessGroups groups(dir.string(), "test-job", "0", rank, c.world, train::shard_size_of(sharded, c.world),
                                dist::Millis(30000));
    train::Trainer trainer(sharded, "", groups.view());
    std::ofstream losses(dir / fmt::format("losses.{}", rank));
    for (int i = 0; i < 5; ++i) losses << fmt::format("{:.9g}\n", trainer.step().loss);
    auto tensors = trainer.params().gather_named_tensors();
    if (rank == 0) checkpoint::write_safetensors((dir / "params.safetensors").string(), tensors);
    return 0;
  });
  ASSERT_EQ(rc, 0);

  train::Trainer reference(make_config(c, 12, 1), "");
  std::vector<double> ref_losses;
  for (int i = 0; i < 5; ++i) ref_losses.push_back(reference.step().loss);
  for (int rank = 0; rank < c.world; ++rank) {
    std::ifstream in(dir / fmt::format("losses.{}", rank));
    for (double want : ref_losses) {
      double got = 0;
      ASSERT_TRUE(in >> got);
      EXPECT_NEAR(got, want, 1e-5 * want) << "rank " << rank;
    }
  }
  const auto want = reference.params().gather_named_tensors();
  std::map<std::string, std::vector<float>> got;
  for (auto& t : checkpoint::read_safetensors((dir / "params.safetensors").string())) got[t.name] = std::move(t.data);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& w : want) {
    const std::vector<float>& g = got[w.name];
    ASSERT_EQ(g.size(), w.data.size()) << w.name;
    double diff = 0, norm = 0;
    for (size_t j = 0; j < w.data.size(); ++j) {
      diff += std::pow(double{g[j]} - w.data[j], 2);
      norm += std::pow(double{w.data[j]}, 2);
    }
    EXPECT_LE(std::sqrt(diff / norm), 1e-5) << w.name;
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, Fsdp,
    ::testing::Values(Case{"full_shard", 2, 0, 6, false}, Case{"full_shard", 3, 0, 4, false},
                      Case{"full_shard", 4, 0, 3, false}, Case{"full_shard", 2, 0, 3, false},
                      Case{"full_shard", 2, 0, 6, true}, Case{"shard_grad_op", 2, 0, 6, false},
                      Case{"shard_grad_op", 3, 0, 4, false}, Case{"shard_grad_op", 4, 0, 3, false},
                      Case{"hybrid_shard", 4, 2, 3, false}, Case{"no_shard", 2, 0, 6, false},
                      Case{"no_shard", 3, 0, 4, false}, Case{"no_shard", 4, 0, 3, false}),
    [](const auto& p) {
      return fmt::format("{}_w{}_mb{}{}", p.param.strategy, p.param.world, p.param.micro_batch,
                         p.param.tied ? "_tied" : "");
    });

}  // namespace
}  // namespace tessera
