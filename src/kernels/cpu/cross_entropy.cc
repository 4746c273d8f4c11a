// CPU fused softmax + cross-entropy: one pass for the max, one for the sum, one to write the
// gradient.
#include "kernels/cpu/cross_entropy.h"

#include <cmath>
#include <type_traits>
#include <vector>

#include "core/bf16.h"
#include "core/threads.h"
#include "kernels/cpu/vec_math.h"

namespace tessera::kernels::cpu {

namespace {

// Out: float, or uint16_t for the gradient rounded to bf16 as it is written (each value is the
// fp32 path's, rounded: the same bits as rounding that path's output afterwards). With a gradient,
// the pass that sums the exponentials keeps them, in the gradient's row (fp32) or in a row of the
// thread's own (bf16; 4V bytes, in cache), for the pass that scales them: one exp per logit.
template <typename Out>
void softmax_cross_entropy_impl(Out* dlogits, float* losses, const float* logits, const int32_t* targets, int64_t n,
                                int64_t V, float dscale) {
  parallel_for(n, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> own_row;
    if constexpr (!std::is_same_v<Out, float>) {
      if (dlogits != nullptr && own_row.size() < static_cast<size_t>(V)) own_row.resize(static_cast<size_t>(V));
    }
    for (int64_t i = begin; i < end; ++i) {
      const float* z = logits + i * V;
      Out* dz = dlogits != nullptr ? dlogits + i * V : nullptr;
      const int32_t target = targets[i];
      if (target < 0) {
        losses[i] = 0.0f;
        if (dz != nullptr) {
          for (int64_t j = 0; j < V; ++j) dz[j] = Out{0};
        }
        continue;
      }
      float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < V; ++j) mx = z[j] > mx ? z[j] : mx;
      const float zt = z[target];  // read before an in-place gradient overwrites it
      float sum = 0.0f;
      if (dz == nullptr) {
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < V; ++j) sum += exp_fast(z[j] - mx);
        losses[i] = std::log(sum) + mx - zt;
        continue;
      }
      float* e = nullptr;
      if constexpr (std::is_same_v<Out, float>) {
        e = dz;
      } else {
        e = own_row.data();
      }
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < V; ++j) {
        e[j] = exp_fast(z[j] - mx);
        sum += e[j];
      }
      losses[i] = std::log(sum) + mx - zt;
      const float k = dscale / sum;
      const float dt = e[target] * k - dscale;
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) store_as(dz + j, e[j] * k);
      store_as(dz + target, dt);
    }
  });
}

}  // namespace

void softmax_cross_entropy(float* dlogits, float* losses, const float* logits, const int32_t* targets, int64_t n,
                           int64_t V, float dscale) {
  softmax_cross_entropy_impl(dlogits, losses, logits, targets, n, V, dscale);
}

void softmax_cross_entropy_bf16(uint16_t* dlogits, float* losses, const float* logits, const int32_t* targets,
                                int64_t n, int64_t V, float dscale) {
  softmax_cross_entropy_impl(dlogits, losses, logits, targets, n, V, dscale);
}

void vocab_parallel_max(float* row_max, const float* logits, const int32_t* targets, int64_t n, int64_t Vb) {
  parallel_for(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* z = logits + i * Vb;
      float mx = targets[i] < 0 ? 0.0f : -INFINITY;
      if (targets[i] >= 0) {
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < Vb; ++j) mx = z[j] > mx ? z[j] : mx;
      }
      row_max[i] = mx;
    }
  });
}

void vocab_parallel_sums(float* sum_exp, float* target_logit, const float* logits, const float* row_max,
                         const int32_t* targets, int64_t n, int64_t Vb, int64_t v0) {
  parallel_for(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* z = logits + i * Vb;
      const float mx = row_max[i];
      const int64_t local = static_cast<int64_t>(targets[i]) - v0;
      float sum = 0.0f;
      if (targets[i] >= 0) {
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < Vb; ++j) sum += exp_fast(z[j] - mx);
      }
      sum_exp[i] = sum;
      target_logit[i] = targets[i] >= 0 && local >= 0 && local < Vb ? z[local] : 0.0f;
    }
  });
}

void vocab_parallel_loss(float* dlogits, float* losses, const float* logits, const float* row_max,
                         const float* sum_exp, const float* target_logit, const int32_t* targets, int64_t n,
                         int64_t Vb, int64_t v0, float dscale) {
  parallel_for(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* z = logits + i * Vb;
      float* dz = dlogits != nullptr ? dlogits + i * Vb : nullptr;
      const int64_t local = static_cast<int64_t>(targets[i]) - v0;
      if (targets[i] < 0) {
        losses[i] = 0.0f;
        if (dz != nullptr) {
          for (int64_t j = 0; j < Vb; ++j) dz[j] = 0.0f;
        }
        continue;
      }
      const float mx = row_max[i];
      losses[i] = std::log(sum_exp[i]) + mx - target_logit[i];
      if (dz != nullptr) {
        const float k = dscale / sum_exp[i];
#pragma omp simd
        for (int64_t j = 0; j < Vb; ++j) dz[j] = exp_fast(z[j] - mx) * k;
        if (local >= 0 && local < Vb) dz[local] -= dscale;
      }
    }
  });
}

}  // namespace tessera::kernels::cpu
