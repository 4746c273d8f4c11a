// Vocabulary-parallel cross-entropy (ref and cpu kernels): T ranks, each holding a block of the
// vocabulary's logits, combine their statistics as the tensor-parallel group's all-reduces do
// (the maximum of the row maxima, the sums of sum_exp and target_logit), and each must then hold
// the losses and its block of the gradient that the whole-vocabulary softmax_cross_entropy gives.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/ref/cross_entropy.h"

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

}  // namespace
}  // namespace tessera::kernels
