// The vocabulary-parallel kernels of tensor parallelism (ref and cpu), at 1-4 ranks each holding a
// block of the vocabulary. Cross-entropy: the ranks combine their statistics as the
// tensor-parallel group's all-reduces do (the maximum of the row maxima, the sums of sum_exp and
// target_logit), and each must then hold the losses and its block of the gradient that the
// whole-vocabulary softmax_cross_entropy gives. Embedding: the blocks' lookups sum to the whole
// lookup, and their backward gives the whole table gradient's rows, to the bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/bf16.h"
#include "core/rng.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/embedding.h"
#include "kernels/ref/cross_entropy.h"
#include "kernels/ref/embedding.h"

namespace tessera::kernels {
namespace {

constexpr int64_t kRows = 9, kVocab = 24;

struct Problem {
  std::vector<float> logits;  // (kRows, kVocab)
  std::vector<int32_t> targets;
};

// Rows of mixed scale (one around 80, where exp overflows without the shift), targets in every
// block, and two ignored.
Problem problem() {
  Problem p{std::vector<float>(kRows * kVocab), {0, 23, 5, -1, 12, 17, 6, -1, 11}};
  for (int64_t i = 0; i < kRows; ++i) {
    const double scale = i == 2 ? 0.1 : 3.0, offset = i == 4 ? 80.0 : 0.0;
    for (int64_t j = 0; j < kVocab; ++j) {
      p.logits[i * kVocab + j] = static_cast<float>(offset + scale * rng::normal(3, i, j));
    }
  }
  return p;
}

// The kernels of one implementation, run as T ranks with the all-reduces done in between.
template <typename Max, typename Sums, typename Loss>
void run_ranks(int T, const Problem& p, float dscale, Max max, Sums sums, Loss loss, std::vector<float>* losses,
               std::vector<float>* grad) {
  const int64_t Vb = kVocab / T;
  std::vector<std::vector<float>> blocks(T, std::vector<float>(kRows * Vb));
  for (int t = 0; t < T; ++t) {
    for (int64_t i = 0; i < kRows; ++i) std::copy_n(&p.logits[i * kVocab + t * Vb], Vb, &blocks[t][i * Vb]);
  }
  std::vector<float> row_max(kRows, -INFINITY), sum_exp(kRows, 0.0f), target_logit(kRows, 0.0f);
  for (int t = 0; t < T; ++t) {  // all-reduce by maximum
    std::vector<float> m(kRows);
    max(m.data(), blocks[t].data(), p.targets.data(), kRows, Vb);
    for (int64_t i = 0; i < kRows; ++i) row_max[i] = std::max(row_max[i], m[i]);
  }
  for (int t = 0; t < T; ++t) {  // all-reduce by sum
    std::vector<float> s(kRows), z(kRows);
    sums(s.data(), z.data(), blocks[t].data(), row_max.data(), p.targets.data(), kRows, Vb, t * Vb);
    for (int64_t i = 0; i < kRows; ++i) sum_exp[i] += s[i], target_logit[i] += z[i];
  }
  grad->assign(kRows * kVocab, NAN);
  for (int t = 0; t < T; ++t) {
    std::vector<float> l(kRows), d = blocks[t];  // the gradient in place of the logits (aliasing)
    loss(d.data(), l.data(), d.data(), row_max.data(), sum_exp.data(), target_logit.data(), p.targets.data(), kRows, Vb,
         t * Vb, dscale);
    if (t == 0) *losses = l;
    for (int64_t i = 0; i < kRows; ++i) {
      ASSERT_EQ(l[i], (*losses)[i]) << "every rank has the same losses";
      std::copy_n(&d[i * Vb], Vb, &(*grad)[i * kVocab + t * Vb]);
    }
  }
}

void expect_matches_whole(bool cpu, double tol) {
  const Problem p = problem();
  const float dscale = 0.25f;
  std::vector<float> want_loss(kRows), want_grad(kRows * kVocab);
  ref::softmax_cross_entropy(want_grad.data(), want_loss.data(), p.logits.data(), p.targets.data(), kRows, kVocab,
                             dscale);
  for (const int T : {1, 2, 3, 4}) {
    SCOPED_TRACE("tp " + std::to_string(T));
    std::vector<float> losses, grad;
    if (cpu) {
      run_ranks(T, p, dscale, cpu::vocab_parallel_max, cpu::vocab_parallel_sums, cpu::vocab_parallel_loss, &losses,
                &grad);
    } else {
      run_ranks(T, p, dscale, ref::vocab_parallel_max, ref::vocab_parallel_sums, ref::vocab_parallel_loss, &losses,
                &grad);
    }
    for (int64_t i = 0; i < kRows; ++i) {
      ASSERT_NEAR(losses[i], want_loss[i], tol * (1 + std::abs(want_loss[i]))) << "row " << i;
      for (int64_t j = 0; j < kVocab; ++j) {
        ASSERT_NEAR(grad[i * kVocab + j], want_grad[i * kVocab + j], tol) << "row " << i << " column " << j;
      }
    }
  }
}

TEST(VocabParallelCrossEntropy, RefMatchesTheWholeVocabulary) { expect_matches_whole(false, 1e-6); }

// Float statistics and exp_fast, as the CPU softmax_cross_entropy (cpu_vs_ref_test's bound).
TEST(VocabParallelCrossEntropy, CpuMatchesTheWholeVocabulary) { expect_matches_whole(true, 2e-5); }

template <typename Forward, typename Backward>
void expect_blocks_make_the_whole_embedding(Forward forward, Backward backward) {
  constexpr int64_t V = 12, C = 5, n = 10;
  const std::vector<int32_t> tokens = {3, 11, 0, 3, 7, 6, 5, 11, 3, 9};
  std::vector<float> table(V * C), dout(n * C);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<float>(rng::normal(5, 0, i));
  for (size_t i = 0; i < dout.size(); ++i) dout[i] = static_cast<float>(rng::normal(5, 1, i));
  std::vector<float> want(n * C), want_grad(V * C, 0.0f);
  forward(want.data(), tokens.data(), table.data(), n, C, 0, V);
  backward(want_grad.data(), dout.data(), tokens.data(), n, C, 0, V);
  for (const int T : {1, 2, 3, 4}) {
    SCOPED_TRACE("tp " + std::to_string(T));
    const int64_t Vb = V / T;
    std::vector<float> sum(n * C, 0.0f), grad(V * C, NAN);
    for (int t = 0; t < T; ++t) {
      std::vector<float> out(n * C, NAN), dblock(Vb * C, 0.0f);
      forward(out.data(), tokens.data(), table.data() + t * Vb * C, n, C, t * Vb, Vb);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += out[i];
      backward(dblock.data(), dout.data(), tokens.data(), n, C, t * Vb, Vb);
      std::copy(dblock.begin(), dblock.end(), grad.begin() + t * Vb * C);
    }
    EXPECT_EQ(sum, want);
    EXPECT_EQ(grad, want_grad);
  }
}

TEST(VocabParallelEmbedding, RefBlocksMakeTheWholeLookup) {
  expect_blocks_make_the_whole_embedding(
      [](float* o, const int32_t* t, const float* w, int64_t n, int64_t C, int64_t v0, int64_t Vb) {
        ref::embedding_forward(o, t, w, n, C, v0, Vb);
      },
      [](float* d, const float* g, const int32_t* t, int64_t n, int64_t C, int64_t v0, int64_t Vb) {
        ref::embedding_backward(d, g, t, n, C, v0, Vb);
      });
}

// The bf16 lookup of a block: the float lookup of the same block of the widened table.
TEST(VocabParallelEmbedding, CpuBf16BlocksMatchTheFloatLookup) {
  constexpr int64_t V = 12, C = 5, n = 6, Vb = 4;
  const std::vector<int32_t> tokens = {3, 11, 0, 4, 7, 5};
  std::vector<uint16_t> table16(V * C);
  std::vector<float> table(V * C);
  for (size_t i = 0; i < table.size(); ++i) table16[i] = f32_to_bf16(static_cast<float>(rng::normal(6, 0, i)));
  bf16_to_f32(table16.data(), table.data(), V * C);
  for (int t = 0; t < 3; ++t) {
    std::vector<float> got(n * C, NAN), want(n * C, NAN);
    cpu::embedding_forward_bf16(got.data(), tokens.data(), table16.data() + t * Vb * C, n, C, t * Vb, Vb);
    ref::embedding_forward(want.data(), tokens.data(), table.data() + t * Vb * C, n, C, t * Vb, Vb);
    EXPECT_EQ(got, want) << "block " << t;
  }
}

TEST(VocabParallelEmbedding, CpuBlocksMakeTheWholeLookup) {
  expect_blocks_make_the_whole_embedding(
      [](float* o, const int32_t* t, const float* w, int64_t n, int64_t C, int64_t v0, int64_t Vb) {
        cpu::embedding_forward(o, t, w, n, C, v0, Vb);
      },
      [](float* d, const float* g, const int32_t* t, int64_t n, int64_t C, int64_t v0, int64_t Vb) {
        cpu::embedding_backward(d, g, t, n, C, v0, Vb);
      });
}

}  // namespace
}  // namespace tessera::kernels
