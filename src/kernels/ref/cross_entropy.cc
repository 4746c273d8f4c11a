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

}  // namespace tessera::kernels::ref
