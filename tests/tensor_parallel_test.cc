// The model under tensor parallelism (Megatron-LM's split, model/layout.h) against the whole
// model: T ranks in real processes over real Gloo on loopback, each holding its blocks of the same
// weights, run one micro-batch forward and backward; the loss must be the whole model's and the
// gradients, put back together from the ranks' blocks, the whole model's, within 1e-5 (relative,
// per tensor), at tp 2 and 4, tied and untied embeddings, grouped-query attention, ignored
// targets, with and without recompute, with and without sequence parallelism (the residual stream
// cut by tokens, layout.h TensorParallel::sequence). Replicated tensors (norm gains) must get the same gradient
// on every rank. Norm gains are jittered away from 1 so that a gain read for the wrong norm shows.
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

struct Case {
  int tp;
  bool tied;
  int64_t recompute_every;
  bool sequence = false;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "tp" << c.tp << (c.tied ? "_tied" : "") << (c.recompute_every > 0 ? "_recompute" : "")
      << (c.sequence ? "_sequence" : "");
}

// Grouped-query attention (8 query heads, 4 key/value heads), divisible by tp 2 and 4.
model::ModelConfig config(bool tied) {
  model::ModelConfig c;
  c.vocab_size = 64;
  c.dim = 32;
  c.n_layers = 2;
  c.n_heads = 8;
  c.n_kv_heads = 4;
  c.ffn_hidden = 48;
  c.seq_len = 8;
  c.tied_embeddings = tied;
  return c;
}

constexpr int64_t kBatch = 2;

// One micro-batch forward and backward as rank `rank` of a tp group of `tp` (tp 1: the whole
// model, no group); writes the loss and this rank's gradient blocks under dir.
int run_rank(const Case& c, int tp, int rank, const fs::path& dir) {
  set_num_threads(1);
  const model::ModelConfig cfg = config(c.tied);
  const model::ModelLayout layout(cfg, 16, {tp, rank, c.sequence});
  std::unique_ptr<comm::Store> store;
  std::unique_ptr<comm::ProcessGroup> group;
  if (tp > 1) {
    store = comm::make_file_store((dir / "store").string(), "tp-test", "r0");
    group = comm::make_gloo_group(*store, rank, tp, "127.0.0.1", comm::Millis(20000));
  }
  WholeUnitsSource source(layout, 11, group.get());
  model::Llama llama(layout, kBatch, 1, c.recompute_every);
  const int64_t N = kBatch * cfg.seq_len;
  std::vector<int32_t> inputs(N), targets(N);
  for (int64_t i = 0; i < N; ++i) {
    inputs[i] = static_cast<int32_t>(rng::bits(3, 0, i) % cfg.vocab_size);
    targets[i] = i % 5 == 3 ? -1 : static_cast<int32_t>(rng::bits(3, 1, i) % cfg.vocab_size);
  }
  const model::LossSum loss = llama.forward_backward(source, inputs.data(), targets.data(), 1.0f / 13);
  write_result(dir / fmt::format("tp{}.rank{}", tp, rank), layout, source, loss);
  return 0;
}

class TensorParallel : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallel, MatchesTheWholeModel) {
  const Case c = GetParam();
  const fs::path dir =
      fs::path(::testing::TempDir()) / fmt::format("tp_{}_{}_{}_{}", c.tp, c.tied, c.recompute_every, c.sequence);
  fs::remove_all(dir);
  fs::create_directories(dir);
  ASSERT_EQ(launch::run_local_workers(1, [&](int) { return run_rank(c, 1, 0, dir); }), 0);
  ASSERT_EQ(launch::run_local_workers(c.tp, [&](int rank) { return run_rank(c, c.tp, rank, dir); }), 0);

  const auto [whole_loss, whole_count] = read_loss(dir / "tp1.rank0");
  const auto whole = read_grads(dir / "tp1.rank0");
  const model::ModelConfig cfg = config(c.tied);
  std::vector<std::map<std::string, std::vector<float>>> blocks;
  for (int r = 0; r < c.tp; ++r) {
    const auto [loss, count] = read_loss(dir / fmt::format("tp{}.rank{}", c.tp, r));
    EXPECT_EQ(count, whole_count);
    EXPECT_NEAR(loss, whole_loss, 1e-5 * std::abs(whole_loss)) << "rank " << r;
    blocks.push_back(read_grads(dir / fmt::format("tp{}.rank{}", c.tp, r)));
  }
  const model::ModelLayout whole_layout(cfg);
  for (int u = 0; u < whole_layout.num_units(); ++u) {
    for (const model::TensorSpec& t : whole_layout.units()[u].tensors) {
      SCOPED_TRACE(t.name);
      const std::vector<float>& want = whole.at(t.name);
      std::vector<float> got(want.size(), NAN);
      for (int r = 0; r < c.tp; ++r) {
        const model::ModelLayout layout(cfg, 16, {c.tp, r});
        const model::TensorSpec& spec = layout.units()[u].tensor(t.name);
        if (spec.split_dim < 0 && r > 0) {
          EXPECT_EQ(blocks[r].at(t.name), blocks[0].at(t.name)) << "a replicated gradient differs on rank " << r;
        }
        copy_block_in(spec, r, blocks[r].at(t.name).data(), got.data());
      }
      expect_close_to_whole(got, want);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, TensorParallel,
                         ::testing::Values(Case{2, false, 0}, Case{4, false, 0}, Case{2, true, 0}, Case{4, true, 1},
                                           Case{2, false, 1}, Case{2, false, 0, true}, Case{4, true, 1, true},
                                           Case{4, false, 0, true}),
                         ::testing::PrintToStringParamName());

}  // namespace
}  // namespace tessera
