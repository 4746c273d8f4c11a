// CPU elementwise helpers.
#include "kernels/cpu/vector.h"

#include <algorithm>
#include <vector>

#include "core/bf16.h"
#include "core/threads.h"

namespace tessera::kernels::cpu {

void add_inplace(float* y, const float* x, int64_t n) {
  parallel_for(n, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) y[i] += x[i];
  });
}

void scale_inplace(float* x, int64_t n, float s) {
  parallel_for(n, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) x[i] *= s;
  });
}

void to_bf16(uint16_t* out, const float* in, int64_t n) {
  parallel_for(n, [&](int64_t begin, int64_t end) { f32_to_bf16(in + begin, out + begin, end - begin); });
}

float* thread_row(int64_t n) {
  thread_local std::vector<float> row;
  if (row.size() < static_cast<size_t>(n)) row.resize(static_cast<size_t>(n));
  return row.data();
}

double sum_squares(const float* x, int64_t n) {
  // Fixed-size blocks summed in index order: the result does not depend on the thread count.
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  double total = 0.0;
  for (int64_t b0 = 0; b0 < blocks; b0 += 256) {
    double partial[256];
    const int64_t nb = std::min<int64_t>(256, blocks - b0);
    parallel_for(nb, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const int64_t i0 = (b0 + b) * kBlock, i1 = std::min(n, i0 + kBlock);
        // Eight independent sums (GCC leaves a double `omp simd` reduction as one serial chain of
        // adds here: 3.7 GB/s over a model's gradients, against 36 with lanes of its own).
        double lane[8] = {};
        int64_t i = i0;
        for (; i + 8 <= i1; i += 8) {
          for (int j = 0; j < 8; ++j) lane[j] += static_cast<double>(x[i + j]) * x[i + j];
        }
        for (; i < i1; ++i) lane[0] += static_cast<double>(x[i]) * x[i];
        partial[b] = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
      }
    });
    for (int64_t b = 0; b < nb; ++b) total += partial[b];
  }
  return total;
}

}  // namespace tessera::kernels::cpu
