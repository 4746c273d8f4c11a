// Reference causal grouped-query attention: plain O(T^2 D) loops per (batch, head), in double.
#include "kernels/ref/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"

namespace tessera::kernels::ref {
namespace {

struct Layout {
  int64_t T, H, Hkv, D, row;  // row: floats per (b, t) row of qkv
  const float* q(const float* qkv, int64_t b, int64_t t, int64_t h) const { return qkv + (b * T + t) * row + h * D; }
  const float* k(const float* qkv, int64_t b, int64_t t, int64_t g) const {
    return qkv + (b * T + t) * row + (H + g) * D;
  }
  const float* v(const float* qkv, int64_t b, int64_t t, int64_t g) const {
    return qkv + (b * T + t) * row + (H + Hkv + g) * D;
  }
};

Layout make_layout(int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  CHECK(Hkv > 0 && H % Hkv == 0);
  return Layout{T, H, Hkv, D, (H + 2 * Hkv) * D};
}

// Scaled scores s[j] = q_i . k_j / sqrt(D) for j <= i; returns their log-sum-exp.
double scores(std::vector<double>& s, const Layout& L, const float* qkv, int64_t b, int64_t h, int64_t g, int64_t i) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(L.D));
  const float* q = L.q(qkv, b, i, h);
  double mx = -INFINITY;
  for (int64_t j = 0; j <= i; ++j) {
    const float* k = L.k(qkv, b, j, g);
    double dot = 0.0;
    for (int64_t d = 0; d < L.D; ++d) dot += static_cast<double>(q[d]) * k[d];
    s[j] = dot * scale;
    mx = std::max(mx, s[j]);
  }
  double sum = 0.0;
  for (int64_t j = 0; j <= i; ++j) sum += std::exp(s[j] - mx);
  return mx + std::log(sum);
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                       int64_t D) {
  const Layout L = make_layout(T, H, Hkv, D);
  std::vector<double> s(static_cast<size_t>(T)), o(static_cast<size_t>(D));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / Hkv);
      for (int64_t i = 0; i < T; ++i) {
        const double m = scores(s, L, qkv, b, h, g, i);
        std::fill(o.begin(), o.end(), 0.0);
        for (int64_t j = 0; j <= i; ++j) {
          const double p = std::exp(s[j] - m);
          const float* v = L.v(qkv, b, j, g);
          for (int64_t d = 0; d < D; ++d) o[d] += p * v[d];
        }
        float* dst = out + (b * T + i) * H * D + h * D;
        for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<float>(o[d]);
        lse[(b * H + h) * T + i] = static_cast<float>(m);
      }
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* /*out*/,
                        const float* /*lse*/, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  // The oracle recomputes the softmax in double instead of trusting the float out and lse from
  // the forward, so its gradients carry no error but their final rounding.
  const Layout L = make_layout(T, H, Hkv, D);
  const int64_t group = H / Hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> s(static_cast<size_t>(T)), p(static_cast<size_t>(T)), dp(static_cast<size_t>(T));
  std::vector<double> dq(static_cast<size_t>(D));
  std::vector<double> dk(static_cast<size_t>(T * D)), dv(static_cast<size_t>(T * D));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t g = 0; g < Hkv; ++g) {
      // Every query head of the group adds into the same key and value gradients.
      std::fill(dk.begin(), dk.end(), 0.0);
      std::fill(dv.begin(), dv.end(), 0.0);
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        for (int64_t i = 0; i < T; ++i) {
          const double m = scores(s, L, qkv, b, h, g, i);
          const float* q = L.q(qkv, b, i, h);
          const float* go = dout + (b * T + i) * H * D + h * D;
          // Softmax backward: with dp_j = dout_i . v_j, the score gradient is p_j (dp_j - p . dp).
          double pdp = 0.0;
          for (int64_t j = 0; j <= i; ++j) {
            const float* v = L.v(qkv, b, j, g);
            double dot = 0.0;
            for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(go[d]) * v[d];
            p[j] = std::exp(s[j] - m);
            dp[j] = dot;
            pdp += p[j] * dot;
          }
          std::fill(dq.begin(), dq.end(), 0.0);
          for (int64_t j = 0; j <= i; ++j) {
            const double ds = p[j] * (dp[j] - pdp) * scale;
            const float* k = L.k(qkv, b, j, g);
            for (int64_t d = 0; d < D; ++d) {
              dq[d] += ds * k[d];
              dk[j * D + d] += ds * q[d];
              dv[j * D + d] += p[j] * go[d];
            }
          }
          float* dst = dqkv + (b * T + i) * L.row + h * D;
          for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<float>(dq[d]);
        }
      }
      for (int64_t j = 0; j < T; ++j) {
        float* dkj = dqkv + (b * T + j) * L.row + (H + g) * D;
        float* dvj = dqkv + (b * T + j) * L.row + (H + Hkv + g) * D;
        for (int64_t d = 0; d < D; ++d) {
          dkj[d] = static_cast<float>(dk[j * D + d]);
          dvj[d] = static_cast<float>(dv[j * D + d]);
        }
      }
    }
  }
}

}  // namespace tessera::kernels::ref
