// The model under tensor parallelism (Megatron-LM's split, model/layout.h) against the whole
// model: T ranks in real processes over real Gloo on loopback, each holding its blocks of the same
// weights, run one micro-batch forward and backward; the loss must be the whole model's and the
// gradients, put back together from the ranks' blocks, the whole model's, within 1e-5 (relative,
// per tensor), at tp 2 and 4, tied and untied embeddings, grouped-query attention, ignored
// targets, with and without recompute. Replicated tensors (norm gains) must get the same gradient
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

namespace tessera {
namespace {

namespace fs = std::filesystem;

struct Case {
  int tp;
  bool tied;
  int64_t recompute_every;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "tp" << c.tp << (c.tied ? "_tied" : "") << (c.recompute_every > 0 ? "_recompute" : "");
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

// Element i of whole tensor `name`: the same on every rank and at every tp.
float weight(const model::TensorSpec& t, int64_t i) {
  const uint64_t stream = std::hash<std::string>{}(t.name);
  if (!t.decay) return 1.0f + 0.5f * static_cast<float>(rng::uniform(11, stream, i) - 0.5);  // norm gains
  return 0.08f * static_cast<float>(rng::normal(11, stream, i));
}

// A parameter source holding this rank's units whole (no sharding), with the tp group.
class Source final : public model::ParamSource {
 public:
  Source(const model::ModelLayout& layout, comm::ProcessGroup* tp) : tp_(tp) {
    for (const model::UnitLayout& u : layout.units()) {
      params_.emplace_back(u.padded, 0.0f);
      grads_.emplace_back(u.padded, 0.0f);
      for (const model::TensorSpec& t : u.tensors) {
        std::vector<float> whole(static_cast<size_t>(t.full_numel()));
        for (size_t i = 0; i < whole.size(); ++i) whole[i] = weight(t, static_cast<int64_t>(i));
        copy_block_out(t, layout.tensor_parallel().rank, whole.data(), params_.back().data() + t.offset);
      }
    }
  }
  const float* acquire(int unit) override { return params_[unit].data(); }
  void release(int) override {}
  float* grads(int unit) override { return grads_[unit].data(); }
  void grads_ready(int) override {}
  void tp_all_reduce(float* data, int64_t count) override {
    tp_->all_reduce(data, count, comm::DType::kF32, {comm::Millis(20000)})->wait();
  }
  void tp_all_gather(const float* in, float* out, int64_t count) override {
    tp_->all_gather(in, out, count, comm::DType::kF32, {comm::Millis(20000)})->wait();
  }
  const std::vector<float>& unit_grads(int unit) const { return grads_[unit]; }

 private:
  comm::ProcessGroup* tp_;
  std::vector<std::vector<float>> params_, grads_;
};

// One micro-batch forward and backward as rank `rank` of a tp group of `tp` (tp 1: the whole
// model, no group); writes the loss and this rank's gradient blocks under dir.
int run_rank(const Case& c, int tp, int rank, const fs::path& dir) {
  set_num_threads(1);
  const model::ModelConfig cfg = config(c.tied);
  const model::ModelLayout layout(cfg, 16, {tp, rank});
  std::unique_ptr<comm::Store> store;
  std::unique_ptr<comm::ProcessGroup> group;
  if (tp > 1) {
    store = comm::make_file_store((dir / "store").string(), "tp-test", "r0");
    group = comm::make_gloo_group(*store, rank, tp, "127.0.0.1", comm::Millis(20000));
  }
  Source source(layout, group.get());
  model::Llama llama(layout, kBatch, 1, c.recompute_every);
  const int64_t N = kBatch * cfg.seq_len;
  std::vector<int32_t> inputs(N), targets(N);
  for (int64_t i = 0; i < N; ++i) {
    inputs[i] = static_cast<int32_t>(rng::bits(3, 0, i) % cfg.vocab_size);
    targets[i] = i % 5 == 3 ? -1 : static_cast<int32_t>(rng::bits(3, 1, i) % cfg.vocab_size);
  }
  const model::LossSum loss = llama.forward_backward(source, inputs.data(), targets.data(), 1.0f / 13);
  std::vector<checkpoint::NamedTensor> grads;
  for (int u = 0; u < layout.num_units(); ++u) {
    for (const model::TensorSpec& t : layout.units()[u].tensors) {
      const float* g = source.unit_grads(u).data() + t.offset;
      grads.push_back({t.name, t.shape, std::vector<float>(g, g + t.numel())});
    }
  }
  checkpoint::write_safetensors((dir / fmt::format("grads.{}.{}.safetensors", tp, rank)).string(), grads);
  FILE* f = std::fopen((dir / fmt::format("loss.{}.{}", tp, rank)).c_str(), "w");
  std::fprintf(f, "%.17g %lld\n", loss.sum, static_cast<long long>(loss.count));
  std::fclose(f);
  return 0;
}

std::pair<double, int64_t> read_loss(const fs::path& dir, int tp, int rank) {
  double sum = 0;
  long long count = 0;
  FILE* f = std::fopen((dir / fmt::format("loss.{}.{}", tp, rank)).c_str(), "r");
  EXPECT_NE(f, nullptr);
  if (f == nullptr) return {NAN, 0};
  EXPECT_EQ(std::fscanf(f, "%lf %lld", &sum, &count), 2);
  std::fclose(f);
  return {sum, count};
}

std::map<std::string, std::vector<float>> read_grads(const fs::path& dir, int tp, int rank) {
  std::map<std::string, std::vector<float>> out;
  for (auto& t : checkpoint::read_safetensors((dir / fmt::format("grads.{}.{}.safetensors", tp, rank)).string())) {
    out[t.name] = std::move(t.data);
  }
  return out;
}

class TensorParallel : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallel, MatchesTheWholeModel) {
  const Case c = GetParam();
  const fs::path dir = fs::path(::testing::TempDir()) / fmt::format("tp_{}_{}_{}", c.tp, c.tied, c.recompute_every);
  fs::remove_all(dir);
  fs::create_directories(dir);
  ASSERT_EQ(launch::run_local_workers(1, [&](int) { return run_rank(c, 1, 0, dir); }), 0);
  ASSERT_EQ(launch::run_local_workers(c.tp, [&](int rank) { return run_rank(c, c.tp, rank, dir); }), 0);

  const auto [whole_loss, whole_count] = read_loss(dir, 1, 0);
  const auto whole = read_grads(dir, 1, 0);
  const model::ModelConfig cfg = config(c.tied);
  std::vector<std::map<std::string, std::vector<float>>> blocks;
  for (int r = 0; r < c.tp; ++r) {
    const auto [loss, count] = read_loss(dir, c.tp, r);
    EXPECT_EQ(count, whole_count);
    EXPECT_NEAR(loss, whole_loss, 1e-5 * std::abs(whole_loss)) << "rank " << r;
    blocks.push_back(read_grads(dir, c.tp, r));
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
      double scale = 0, err = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        scale = std::max(scale, static_cast<double>(std::abs(want[i])));
        err = std::max(err, static_cast<double>(std::abs(got[i] - want[i])));
      }
      EXPECT_GT(scale, 0.0);
      EXPECT_LE(err, 1e-5 * scale) << "max |difference| " << err << " against max |gradient| " << scale;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, TensorParallel,
                         ::testing::Values(Case{2, false, 0}, Case{4, false, 0}, Case{2, true, 0}, Case{4, true, 1},
                                           Case{2, false, 1}),
                         ::testing::PrintToStringParamName());

}  // namespace
}  // namespace tessera
