// CPU fused softmax + cross-entropy: one pass for the max, one for the sum, one to write the
// gradient; the probability row is never stored separately.
#include "kernels/cpu/cross_entropy.h"

#include <cmath>

#include "core/threads.h"
#include "kernels/cpu/vec_math.h"

namespace tessera::kernels::cpu {

void softmax_cross_entropy(float* dlogits, float* losses, const float* logits, const int32_t* targets, int64_t n,
                           int64_t V, float dscale) {
  parallel_for(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* z = logits + i * V;
      float* dz = dlogits != nullptr ? dlogits + i * V : nullptr;
      const int32_t target = targets[i];
      if (target < 0) {
        losses[i] = 0.0f;
        if (dz != nullptr) {
          for (int64_t j = 0; j < V; ++j) dz[j] = 0.0f;
        }
        continue;
      }
      float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < V; ++j) mx = z[j] > mx ? z[j] : mx;
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < V; ++j) sum += exp_fast(z[j] - mx);
      const float log_sum = std::log(sum);
      losses[i] = log_sum + mx - z[target];
      if (dz != nullptr) {
        const float k = dscale / sum;
#pragma omp simd
        for (int64_t j = 0; j < V; ++j) dz[j] = exp_fast(z[j] - mx) * k;
        dz[target] -= dscale;
      }
    }
  });
}

}  // namespace tessera::kernels::cpu
