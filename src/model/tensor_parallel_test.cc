// The tensor-parallel layout (layout.h, TensorParallel): every split tensor is tiled exactly by
// its ranks' blocks, and the blocks are Megatron-LM's split, checked on the math itself: a
// column-parallel product is the whole product's columns, the row-parallel products of the ranks
// sum to the whole one, an MLP of matching blocks sums to the whole MLP, grouped-query heads find
// their key/value head inside their rank's block, and the vocabulary-parallel head's logits are
// the whole logits' columns.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "kernels/ref/matmul.h"
#include "kernels/ref/swiglu.h"
#include "model/layout.h"

namespace tessera::model {
namespace {

namespace ref = kernels::ref;

// Grouped-query attention (8 query heads, 4 key/value heads), divisible by tp = 1, 2 and 4.
ModelConfig gqa_config() {
  ModelConfig c;
  c.vocab_size = 32;
  c.dim = 16;
  c.n_layers = 2;
  c.n_heads = 8;
  c.n_kv_heads = 4;
  c.ffn_hidden = 24;
  c.seq_len = 8;
  return c;
}

std::vector<float> random_tensor(int64_t n, uint64_t stream) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(rng::normal(7, stream, i));
  return v;
}

// Rank t's block of `whole` under tp = T.
std::vector<float> block_of(const std::string& unit, const std::string& tensor, const std::vector<float>& whole, int T,
                            int t) {
  const ModelLayout layout(gqa_config(), 16, {T, t});
  for (const UnitLayout& u : layout.units()) {
    if (u.name != unit) continue;
    const TensorSpec& spec = u.tensor(tensor);
    std::vector<float> block(static_cast<size_t>(spec.numel()));
    copy_block_out(spec, t, whole.data(), block.data());
    return block;
  }
  ADD_FAILURE() << unit;
  return {};
}

void expect_near_all(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-4 * (1 + std::abs(want[i]))) << what << " at " << i;
  }
}

TEST(TensorParallelLayout, BlocksTileEveryTensorOnce) {
  const ModelConfig c = gqa_config();
  const ModelLayout whole_layout(c);
  for (const int T : {1, 2, 4}) {
    for (size_t u = 0; u < whole_layout.units().size(); ++u) {
      for (size_t k = 0; k < whole_layout.units()[u].tensors.size(); ++k) {
        const TensorSpec& whole_spec = whole_layout.units()[u].tensors[k];
        SCOPED_TRACE(whole_spec.name + " at tp " + std::to_string(T));
        const std::vector<float> whole = random_tensor(whole_spec.numel(), u * 100 + k);
        std::vector<float> rebuilt(whole.size(), NAN);
        std::vector<int> writes(whole.size(), 0);
        int64_t held = 0;
        for (int t = 0; t < T; ++t) {
          const ModelLayout layout(c, 16, {T, t});
          const TensorSpec& spec = layout.units()[u].tensors[k];
          ASSERT_EQ(spec.name, whole_spec.name);
          ASSERT_EQ(spec.full_shape, whole_spec.shape);
          std::vector<float> block(static_cast<size_t>(spec.numel()));
          copy_block_out(spec, t, whole.data(), block.data());
          // Mark what this block writes back: each element of a split tensor exactly once.
          std::vector<float> marks(block.size(), 1.0f), counted(whole.size(), 0.0f);
          copy_block_in(spec, t, marks.data(), counted.data());
          for (size_t i = 0; i < whole.size(); ++i) writes[i] += counted[i] == 1.0f;
          copy_block_in(spec, t, block.data(), rebuilt.data());
          held += spec.numel();
          if (spec.split_dim < 0) {
            EXPECT_EQ(block, whole);
          }
        }
        // Every matrix is split, every norm gain replicated.
        const bool split = T > 1 && whole_spec.shape.size() == 2;
        EXPECT_EQ(held, split ? whole_spec.numel() : T * whole_spec.numel());
        for (size_t i = 0; i < whole.size(); ++i) {
          ASSERT_EQ(rebuilt[i], whole[i]) << i;
          ASSERT_EQ(writes[i], split ? 1 : T) << i;
        }
      }
    }
  }
}

// A block at one tensor-parallel size, put together from the blocks at another (a checkpoint
// resumed at another tp): exactly the block cut from the whole tensor, for every pair of sizes.
TEST(TensorParallelLayout, ReblockRebuildsABlockFromAnotherSplit) {
  const ModelConfig c = gqa_config();
  const ModelLayout whole_layout(c);
  for (const int from : {1, 2, 4}) {
    for (const int to : {1, 2, 4}) {
      for (size_t u = 0; u < whole_layout.units().size(); ++u) {
        for (size_t k = 0; k < whole_layout.units()[u].tensors.size(); ++k) {
          const std::vector<float> whole = random_tensor(whole_layout.units()[u].tensors[k].numel(), u * 100 + k);
          std::vector<std::vector<float>> from_blocks(static_cast<size_t>(from));
          for (int r = 0; r < from; ++r) {
            const ModelLayout layout(c, 16, {from, r});
            const TensorSpec& spec = layout.units()[u].tensors[k];
            from_blocks[r].resize(static_cast<size_t>(spec.numel()));
            copy_block_out(spec, r, whole.data(), from_blocks[r].data());
          }
          for (int t = 0; t < to; ++t) {
            const ModelLayout layout(c, 16, {to, t});
            const TensorSpec& spec = layout.units()[u].tensors[k];
            SCOPED_TRACE(spec.name + " from tp " + std::to_string(from) + " to rank " + std::to_string(t) + " of " +
                         std::to_string(to));
            std::vector<float> want(static_cast<size_t>(spec.numel())), got(want.size(), NAN);
            copy_block_out(spec, t, whole.data(), want.data());
            for (const Reblock& p : reblock(spec, t, from)) {
              ASSERT_LE(p.from + p.count, static_cast<int64_t>(from_blocks[p.from_rank].size()));
              std::copy_n(from_blocks[p.from_rank].data() + p.from, p.count, got.data() + p.to);
            }
            ASSERT_EQ(got, want);
          }
        }
      }
    }
  }
}

TEST(TensorParallelLayout, LocalSizesDivideTheModel) {
  const ModelConfig c = gqa_config();
  for (const int T : {1, 2, 4}) {
    for (int t = 0; t < T; ++t) {
      const ModelLayout layout(c, 16, {T, t});
      const LocalSizes& l = layout.local();
      EXPECT_EQ(l.heads * T, c.n_heads);
      EXPECT_EQ(l.kv_heads * T, c.n_kv_heads);
      EXPECT_EQ(l.ffn_hidden * T, c.ffn_hidden);
      EXPECT_EQ(l.vocab * T, c.vocab_size);
      EXPECT_EQ(l.vocab_begin, t * l.vocab);
      // Local query head j is global head t*heads + j; its key/value head, global (t*heads + j) /
      // (H / Hkv), lies in this rank's key/value block at the same local ratio.
      const int64_t group = c.n_heads / c.n_kv_heads;
      for (int64_t j = 0; j < l.heads; ++j) {
        EXPECT_EQ((t * l.heads + j) / group, t * l.kv_heads + j / group) << "tp " << T << " rank " << t;
      }
      const TensorSpec& wq = layout.units()[1].tensor("layers.0.attention.wq.weight");
      EXPECT_EQ(wq.shape, (std::vector<int64_t>{l.heads * c.head_dim(), c.dim}));
    }
  }
}

// The math of the split on one block and the head, with random weights and inputs.
TEST(TensorParallelLayout, BlocksAreMegatronsSplit) {
  const ModelConfig c = gqa_config();
  const int64_t N = 5, C = c.dim, D = c.head_dim(), H = c.n_heads, F = c.ffn_hidden, V = c.vocab_size;
  const std::vector<float> x = random_tensor(N * C, 1);
  const std::vector<float> wq = random_tensor(H * D * C, 2), wo = random_tensor(C * H * D, 3);
  const std::vector<float> w1 = random_tensor(F * C, 4), w3 = random_tensor(F * C, 5), w2 = random_tensor(C * F, 6);
  const std::vector<float> out = random_tensor(V * C, 7), attn = random_tensor(N * H * D, 8);
  // The whole products.
  std::vector<float> q(N * H * D), y(N * C), logits(N * V);
  ref::linear_forward(q.data(), x.data(), wq.data(), N, H * D, C);
  ref::linear_forward(y.data(), attn.data(), wo.data(), N, C, H * D);
  ref::linear_forward(logits.data(), x.data(), out.data(), N, V, C);
  auto mlp = [&](const float* a, const float* b, const float* down, int64_t f) {
    std::vector<float> h13(N * 2 * f), h(N * f), o(N * C);
    std::vector<float> h1(N * f), h3(N * f);
    ref::linear_forward(h1.data(), x.data(), a, N, f, C);
    ref::linear_forward(h3.data(), x.data(), b, N, f, C);
    for (int64_t n = 0; n < N; ++n) {  // the fused layout: gate | up per row
      std::copy_n(&h1[n * f], f, &h13[n * 2 * f]);
      std::copy_n(&h3[n * f], f, &h13[n * 2 * f + f]);
    }
    ref::swiglu_forward(h.data(), h13.data(), N, f);
    ref::linear_forward(o.data(), h.data(), down, N, C, f);
    return o;
  };
  const std::vector<float> mlp_whole = mlp(w1.data(), w3.data(), w2.data(), F);
  for (const int T : {2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(T));
    std::vector<float> y_sum(N * C, 0.0f), mlp_sum(N * C, 0.0f);
    for (int t = 0; t < T; ++t) {
      const std::string b = "layers.0.";
      // Column-parallel: this rank's heads, whole.
      const std::vector<float> wq_t = block_of("block.0", b + "attention.wq.weight", wq, T, t);
      const int64_t HD = H * D / T;
      std::vector<float> q_t(N * HD);
      ref::linear_forward(q_t.data(), x.data(), wq_t.data(), N, HD, C);
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t i = 0; i < HD; ++i) ASSERT_EQ(q_t[n * HD + i], q[n * H * D + t * HD + i]);
      }
      // Row-parallel: this rank's heads' part of the output projection, summed over ranks.
      const std::vector<float> wo_t = block_of("block.0", b + "attention.wo.weight", wo, T, t);
      std::vector<float> attn_t(N * HD), y_t(N * C);
      for (int64_t n = 0; n < N; ++n) std::copy_n(&attn[n * H * D + t * HD], HD, &attn_t[n * HD]);
      ref::linear_forward(y_t.data(), attn_t.data(), wo_t.data(), N, C, HD);
      for (size_t i = 0; i < y_sum.size(); ++i) y_sum[i] += y_t[i];
      // The MLP of matching blocks is a partial sum of the whole MLP.
      const std::vector<float> mlp_t = mlp(block_of("block.0", b + "feed_forward.w1.weight", w1, T, t).data(),
                                           block_of("block.0", b + "feed_forward.w3.weight", w3, T, t).data(),
                                           block_of("block.0", b + "feed_forward.w2.weight", w2, T, t).data(), F / T);
      for (size_t i = 0; i < mlp_sum.size(); ++i) mlp_sum[i] += mlp_t[i];
      // Vocabulary-parallel head: this rank's columns of the logits.
      const std::vector<float> out_t = block_of("head", "output.weight", out, T, t);
      std::vector<float> logits_t(N * V / T);
      ref::linear_forward(logits_t.data(), x.data(), out_t.data(), N, V / T, C);
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t v = 0; v < V / T; ++v) ASSERT_EQ(logits_t[n * V / T + v], logits[n * V + t * (V / T) + v]);
      }
    }
    expect_near_all(y_sum, y, "row-parallel output projection");
    expect_near_all(mlp_sum, mlp_whole, "tensor-parallel MLP");
  }
}

}  // namespace
}  // namespace tessera::model
