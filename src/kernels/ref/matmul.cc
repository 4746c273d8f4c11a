// Reference linear layer: triple loops with double accumulators.
#include "kernels/ref/matmul.h"

namespace tessera::kernels::ref {

void linear_forward(float* y, const float* x, const float* w, int64_t M, int64_t N, int64_t K) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double sum = 0.0;
      for (int64_t k = 0; k < K; ++k) sum += static_cast<double>(x[m * K + k]) * w[n * K + k];
      y[m * N + n] = static_cast<float>(sum);
    }
  }
}

void linear_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, int64_t M, int64_t N,
                     int64_t K, bool accumulate_dx) {
  if (dx != nullptr) {
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t k = 0; k < K; ++k) {
        double sum = accumulate_dx ? dx[m * K + k] : 0.0;
        for (int64_t n = 0; n < N; ++n) sum += static_cast<double>(dy[m * N + n]) * w[n * K + k];
        dx[m * K + k] = static_cast<float>(sum);
      }
    }
  }
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      double sum = dw[n * K + k];
      for (int64_t m = 0; m < M; ++m) sum += static_cast<double>(dy[m * N + n]) * x[m * K + k];
      dw[n * K + k] = static_cast<float>(sum);
    }
  }
}

}  // namespace tessera::kernels::ref
