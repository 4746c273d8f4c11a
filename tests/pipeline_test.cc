// Pipeline parallelism (train/pipeline.h). The schedules, as pure lists: every stage runs each
// micro-batch's forward and backward once, a backward after its forward, within the activation
// slots it plans, and all stages together finish (no stage waits for a message that never comes)
// in the same time for 1F1B as for GPipe. The stages in real processes over real Gloo, each
// holding its blocks of the same weights: over m micro-batches the loss sum and every gradient
// equal the whole model's, within 1e-5 (relative, per tensor), for 2 and 4 stages, both
// schedules, fewer micro-batches than stages, with and without recompute; and each stage sends
// exactly m activations forward and m input gradients back, N x C floats each.
#include "train/pipeline.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "comm/process_group.h"
#include "comm/store.h"
#include "core/rng.h"
#include "core/threads.h"
#include "launch/local_workers.h"
#include "model/layout.h"
#include "model/llama.h"
#include "model_split_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using namespace test_util;  // NOLINT: the shared helpers of split-model tests
using train::PipelineOp;
using train::PipelineSchedule;

// Runs every stage's list with forward costing 1 and backward 2 time units; an op starts when its
// stage is free and its message has arrived (forward b on stage s after forward b on s - 1,
// backward b after backward b on s + 1, and after forward b on the last stage). Returns the time
// all are done, or -1 when some stage can never go on.
int simulate(PipelineSchedule schedule, int P, int m) {
  std::vector<std::vector<PipelineOp>> ops(P);
  for (int s = 0; s < P; ++s) ops[s] = train::pipeline_schedule(schedule, P, s, m);
  std::vector<std::vector<int>> fdone(P, std::vector<int>(m, -1)), bdone(P, std::vector<int>(m, -1));
  std::vector<size_t> next(P, 0);
  std::vector<int> free_at(P, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < P; ++s) {
      if (next[s] == ops[s].size()) continue;
      const PipelineOp op = ops[s][next[s]];
      int ready = -1;
      if (op.forward) ready = s == 0 ? 0 : fdone[s - 1][op.micro_batch];
      if (!op.forward) ready = s == P - 1 ? fdone[s][op.micro_batch] : bdone[s + 1][op.micro_batch];
      if (ready < 0) continue;
      const int end = std::max(ready, free_at[s]) + (op.forward ? 1 : 2);
      (op.forward ? fdone : bdone)[s][op.micro_batch] = end;
      free_at[s] = end;
      ++next[s];
      progress = true;
    }
  }
  for (int s = 0; s < P; ++s) {
    if (next[s] != ops[s].size()) return -1;
  }
  return *std::max_element(free_at.begin(), free_at.end());
}

TEST(PipelineSchedule, EveryMicroBatchOnceAndNoStageWaitsForever) {
  for (int P = 1; P <= 4; ++P) {
    for (int m = 1; m <= 8; ++m) {
      SCOPED_TRACE(fmt::format("{} stages, {} micro-batches", P, m));
      for (const PipelineSchedule sched : {PipelineSchedule::kOneFOneB, PipelineSchedule::kGPipe}) {
        for (int s = 0; s < P; ++s) {
          std::vector<int> forward_at(m, -1), backward_at(m, -1);
          const auto ops = train::pipeline_schedule(sched, P, s, m);
          ASSERT_EQ(ops.size(), 2u * m);
          for (size_t i = 0; i < ops.size(); ++i) {
            int& at = (ops[i].forward ? forward_at : backward_at)[ops[i].micro_batch];
            EXPECT_EQ(at, -1) << "twice";
            at = static_cast<int>(i);
          }
          for (int b = 0; b < m; ++b) EXPECT_LT(forward_at[b], backward_at[b]) << "micro-batch " << b;
          const int in_flight = train::pipeline_in_flight(sched, P, s, m);
          EXPECT_EQ(in_flight, sched == PipelineSchedule::kGPipe ? m : std::min(P - s, m)) << "stage " << s;
        }
        EXPECT_GT(simulate(sched, P, m), 0);
      }
      // The same bubble: (m + P - 1) forward-and-backward times.
      EXPECT_EQ(simulate(PipelineSchedule::kOneFOneB, P, m), simulate(PipelineSchedule::kGPipe, P, m));
      EXPECT_EQ(simulate(PipelineSchedule::kOneFOneB, P, m), 3 * (m + P - 1));
    }
  }
}

TEST(PipelineStages, BalancedByCost) {
  model::ModelConfig bench, llama7b;
  ASSERT_TRUE(model::model_preset("bench", &bench));
  ASSERT_TRUE(model::model_preset("llama2-7b", &llama7b));
  // bench: the LM head (32000 x 512) costs about 4.4 blocks (the FLOPs MFU counts), so the last stage takes fewer.
  EXPECT_EQ(model::balanced_stage_layers(bench, 2), (std::vector<int64_t>{6, 2}));
  // llama2-7b: the head costs 0.6 of a block, less than moving a block would.
  EXPECT_EQ(model::balanced_stage_layers(llama7b, 4), (std::vector<int64_t>{8, 8, 8, 8}));
  for (int P = 1; P <= 8; ++P) {
    const auto layers = model::balanced_stage_layers(bench, P);
    ASSERT_EQ(static_cast<int>(layers.size()), P);
    int64_t total = 0;
    for (int64_t l : layers) {
      EXPECT_GE(l, 1);
      total += l;
    }
    EXPECT_EQ(total, bench.n_layers);
  }
}

struct Case {
  int stages;
  int micro_batches;
  PipelineSchedule schedule;
  int64_t recompute_every;
};

std::string name_of(const Case& c) {
  return fmt::format("pp{}_m{}_{}{}", c.stages, c.micro_batches,
                     c.schedule == PipelineSchedule::kGPipe ? "gpipe" : "1f1b", c.recompute_every ? "_recompute" : "");
}
void PrintTo(const Case& c, std::ostream* os) { *os << name_of(c); }

model::ModelConfig config() {
  model::ModelConfig c;
  c.vocab_size = 64;
  c.dim = 32;
  c.n_layers = 4;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_hidden = 48;
  c.seq_len = 8;
  return c;
}

constexpr int64_t kBatch = 2;

// Micro-batch b: random tokens, some targets ignored.
struct Batches {
  explicit Batches(int m) : inputs(m), targets(m) {
    const model::ModelConfig c = config();
    const int64_t N = kBatch * c.seq_len;
    for (int b = 0; b < m; ++b) {
      for (int64_t i = 0; i < N; ++i) {
        inputs[b].push_back(static_cast<int32_t>(rng::bits(5, b, i) % c.vocab_size));
        targets[b].push_back(i % 7 == 2 ? -1 : static_cast<int32_t>(rng::bits(6, b, i) % c.vocab_size));
      }
    }
  }
  std::vector<std::vector<int32_t>> inputs, targets;
};

// The whole model over the m micro-batches, one after another.
int run_whole(const Case& c, const fs::path& dir) {
  set_num_threads(1);
  const model::ModelLayout layout(config());
  WholeUnitsSource source(layout, 13);
  model::Llama llama(layout, kBatch, 1, c.recompute_every);
  const Batches batches(c.micro_batches);
  model::LossSum loss;
  for (int b = 0; b < c.micro_batches; ++b) {
    const model::LossSum part =
        llama.forward_backward(source, batches.inputs[b].data(), batches.targets[b].data(), 1.0f / 29);
    loss.sum += part.sum;
    loss.count += part.count;
  }
  write_result(dir / "whole", layout, source, loss);
  return 0;
}

// Stage `rank` of the pipeline; the stages' blocks as balanced_stage_layers cuts them.
int run_stage(const Case& c, int rank, const fs::path& dir) {
  set_num_threads(1);
  const model::ModelLayout layout(config(), 16, {}, model::pipeline_stage(config(), c.stages, rank));
  auto store = comm::make_file_store((dir / "store").string(), "pp-test", "r0");
  auto group = comm::make_gloo_group(*store, rank, c.stages, "127.0.0.1", comm::Millis(20000));
  WholeUnitsSource source(layout, 13);
  train::PipelineStageRunner runner(layout, kBatch, 1, c.recompute_every, false, c.schedule, c.micro_batches,
                                    group.get(), comm::Millis(20000));
  const Batches batches(c.micro_batches);
  int before = 0, after = 0;
  train::PipelineStageRunner::Hooks hooks{[&](const PipelineOp&) { ++before; },
                                          [&](const PipelineOp&, double) { ++after; }};
  const model::LossSum loss = runner.step(
      source,
      [&](int b) {
        return data::Loader::Batch{batches.inputs[b].data(), batches.targets[b].data()};
      },
      hooks, 1.0f / 29);
  if (before != 2 * c.micro_batches || after != 2 * c.micro_batches) return 3;
  // Bytes on the pipeline dimension (docs/design.md): each micro-batch's activations to the next
  // stage and its input gradient to the previous one, N x C floats each, and nothing else.
  const uint64_t activation = kBatch * config().seq_len * config().dim * sizeof(float);
  const uint64_t want = c.micro_batches * activation * ((layout.has_head() ? 0 : 1) + (layout.has_embedding() ? 0 : 1));
  if (group->bytes_sent(comm::OpKind::kSend) != want) {
    std::fprintf(stderr, "stage %d sent %llu bytes point to point, want %llu\n", rank,
                 static_cast<unsigned long long>(group->bytes_sent(comm::OpKind::kSend)),
                 static_cast<unsigned long long>(want));
    return 4;
  }
  write_result(dir / fmt::format("stage{}", rank), layout, source, loss);
  return 0;
}

class PipelineParallel : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineParallel, MatchesTheWholeModel) {
  const Case c = GetParam();
  const fs::path dir = fs::path(::testing::TempDir()) / fmt::format("pp_{}_{}", name_of(c), getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  ASSERT_EQ(launch::run_local_workers(1, [&](int) { return run_whole(c, dir); }), 0);
  ASSERT_EQ(launch::run_local_workers(c.stages, [&](int rank) { return run_stage(c, rank, dir); }), 0);

  const auto [whole_loss, whole_count] = read_loss(dir / "whole");
  const auto whole = read_grads(dir / "whole");
  size_t tensors = 0;
  for (int s = 0; s < c.stages; ++s) {
    const auto [loss, count] = read_loss(dir / fmt::format("stage{}", s));
    if (s == c.stages - 1) {
      EXPECT_EQ(count, whole_count);
      EXPECT_NEAR(loss, whole_loss, 1e-5 * std::abs(whole_loss));
    } else {
      EXPECT_EQ(count, 0) << "only the last stage has a loss";
    }
    for (const auto& [name, got] : read_grads(dir / fmt::format("stage{}", s))) {
      SCOPED_TRACE(fmt::format("{} on stage {}", name, s));
      ++tensors;
      expect_close_to_whole(got, whole.at(name));
    }
  }
  EXPECT_EQ(tensors, whole.size()) << "every tensor on exactly one stage";
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Stages, PipelineParallel,
    ::testing::Values(Case{2, 3, PipelineSchedule::kOneFOneB, 0}, Case{2, 3, PipelineSchedule::kGPipe, 0},
                      Case{4, 6, PipelineSchedule::kOneFOneB, 0}, Case{4, 2, PipelineSchedule::kOneFOneB, 0},
                      Case{4, 5, PipelineSchedule::kGPipe, 1}, Case{2, 4, PipelineSchedule::kOneFOneB, 1}),
    [](const auto& p) { return name_of(p.param); });

}  // namespace
}  // namespace tessera
