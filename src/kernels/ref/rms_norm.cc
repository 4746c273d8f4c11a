// Reference RMSNorm forward and backward, sums in double.
#include "kernels/ref/rms_norm.h"

#include <cmath>

namespace tessera::kernels::ref {

void rms_norm_forward(float* out, float* rstd, const float* x, const float* weight, int64_t n, int64_t C, float eps) {
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * C;
    double ss = 0.0;
    for (int64_t c = 0; c < C; ++c) ss += static_cast<double>(xi[c]) * xi[c];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(C) + eps);
    for (int64_t c = 0; c < C; ++c) out[i * C + c] = static_cast<float>(xi[c] * r * weight[c]);
    rstd[i] = static_cast<float>(r);
  }
}

void rms_norm_backward(float* dx, float* dweight, const float* dout, const float* x, const float* weight,
                       const float* rstd, int64_t n, int64_t C) {
  // With y = x * r * w and r = (mean(x^2) + eps)^(-1/2), dr/dx_c = -r^3 x_c / C, so
  // dx_c = r w_c g_c - r^3 x_c / C * sum_j(w_j g_j x_j).
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * C;
    const float* gi = dout + i * C;
    const double r = rstd[i];
    double dot = 0.0;
    for (int64_t c = 0; c < C; ++c) dot += static_cast<double>(weight[c]) * gi[c] * xi[c];
    const double k = r * r * r * dot / static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) {
      dx[i * C + c] = static_cast<float>(dx[i * C + c] + (r * weight[c] * gi[c] - k * xi[c]));
    }
  }
  for (int64_t c = 0; c < C; ++c) {
    double sum = dweight[c];
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(dout[i * C + c]) * x[i * C + c] * rstd[i];
    dweight[c] = static_cast<float>(sum);
  }
}

}  // namespace tessera::kernels::ref
