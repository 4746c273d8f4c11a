// Reference fused softmax + cross-entropy, log-sum-exp in double.
#include "kernels/ref/cross_entropy.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace tessera::kernels::ref {

void softmax_cross_entropy(float* dlogits, float* losses, const float* logits, const int32_t* targets, int64_t n,
                           int64_t V, float dscale) {
  for (int64_t i = 0; i < n; ++i) {
    const float* row = logits + i * V;
    const int32_t target = targets[i];
    CHECK(target < V);
    if (target < 0) {
      losses[i] = 0.0f;
      if (dlogits != nullptr) {
        for (int64_t j = 0; j < V; ++j) dlogits[i * V + j] = 0.0f;
      }
      continue;
    }
    double mx = row[0];
    for (int64_t j = 1; j < V; ++j) mx = std::max(mx, static_cast<double>(row[j]));
    double sum = 0.0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(row[j] - mx);
    const double lse = mx + std::log(sum);
    losses[i] = static_cast<float>(lse - row[target]);
    if (dlogits != nullptr) {
      // Element j is read before it is written, so dlogits may alias logits.
      for (int64_t j = 0; j < V; ++j) {
        const double p = std::exp(row[j] - lse);
        dlogits[i * V + j] = static_cast<float>((p - (j == target ? 1.0 : 0.0)) * dscale);
      }
    }
  }
}

void vocab_parallel_max(float* row_max, const float* logits, const int32_t* targets, int64_t n, int64_t Vb) {
  for (int64_t i = 0; i < n; ++i) {
    const float* row = logits + i * Vb;
    float mx = targets[i] < 0 ? 0.0f : row[0];
    for (int64_t j = 1; targets[i] >= 0 && j < Vb; ++j) mx = std::max(mx, row[j]);
    row_max[i] = mx;
  }
}

void vocab_parallel_sums(float* sum_exp, float* target_logit, const float* logits, const float* row_max,
                         const int32_t* targets, int64_t n, int64_t Vb, int64_t v0) {
  for (int64_t i = 0; i < n; ++i) {
    const float* row = logits + i * Vb;
    const int64_t local = static_cast<int64_t>(targets[i]) - v0;
    double sum = 0.0;
    for (int64_t j = 0; targets[i] >= 0 && j < Vb; ++j) sum += std::exp(static_cast<double>(row[j]) - row_max[i]);
    sum_exp[i] = static_cast<float>(sum);
    target_logit[i] = targets[i] >= 0 && local >= 0 && local < Vb ? row[local] : 0.0f;
  }
}

void vocab_parallel_loss(float* dlogits, float* losses, const float* logits, const float* row_max,
                         const float* sum_exp, const float* target_logit, const int32_t* targets, int64_t n,
                         int64_t Vb, int64_t v0, float dscale) {
  for (int64_t i = 0; i < n; ++i) {
    const float* row = logits + i * Vb;
    const int64_t local = static_cast<int64_t>(targets[i]) - v0;
    if (targets[i] < 0) {
      losses[i] = 0.0f;
      for (int64_t j = 0; dlogits != nullptr && j < Vb; ++j) dlogits[i * Vb + j] = 0.0f;
      continue;
    }
    CHECK(sum_exp[i] > 0.0f);
    const double lse = static_cast<double>(row_max[i]) + std::log(static_cast<double>(sum_exp[i]));
    losses[i] = static_cast<float>(lse - target_logit[i]);
    // Element j is read before it is written, so dlogits may alias logits.
    for (int64_t j = 0; dlogits != nullptr && j < Vb; ++j) {
      const double p = std::exp(static_cast<double>(row[j]) - lse);
      dlogits[i * Vb + j] = static_cast<float>((p - (j == local ? 1.0 : 0.0)) * dscale);
    }
  }
}

}  // namespace tessera::kernels::ref
