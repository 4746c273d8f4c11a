// Reference kernels against double-precision forwards written here and their finite differences.
//
// Why double forwards in the test rather than finite differences of the ref forwards: the ref
// kernels store float, so differencing them with a step h has a rounding error of about
// u |out| / h, which for any useful h swamps the quantity under test. Instead each op has a short,
// independent double forward below. Two checks tie it to the ref kernel:
//   forward:  ref forward == double forward, to the float rounding of the stored result;
//   backward: ref backward == numeric gradient of L = sum(out * R) through the double forward,
//             R a fixed random tensor fed to the backward as dout.
// The ref kernels compute in double and round once, so both checks demand the exact value to
// within half an ulp: |got - want| <= u |stored| + extra, where u = 2^-24 is float's unit roundoff,
// `stored` the float the kernel wrote, and `extra` the error of `want` (below) plus, where a
// backward must consume a float intermediate (RMSNorm's rstd), a bound derived for its rounding.
//
// The numeric gradient's own error is bounded too. The stencil
// (L(x-2h) - 8 L(x-h) + 8 L(x+h) - L(x+2h)) / 12h with h = 1e-3 len, len the length over which the
// op's input varies (1 for O(1) inputs; a row's rms for RMSNorm), has truncation error about
// h^4 |L^(5)| / 30 ~ 3e-14 / len times the gradient's scale, and rounding error about
// 1.5 * 2^-53 * sum|terms of L| / h, below 1e-11 / len for the few hundred O(1) terms here.
// kFdFloor / len with kFdFloor = 1e-9 covers both with a margin and stays far below the float
// rounding the checks are about (u |g| ~ 6e-8 |g|, and |g| grows like 1 / len).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"
#include "kernels/ref/adamw.h"
#include "kernels/ref/attention.h"
#include "kernels/ref/cross_entropy.h"
#include "kernels/ref/embedding.h"
#include "kernels/ref/matmul.h"
#include "kernels/ref/rms_norm.h"
#include "kernels/ref/rope.h"
#include "kernels/ref/swiglu.h"

namespace tessera::kernels::ref {
namespace {

constexpr double kU = 0x1.0p-24;
constexpr double kFdFloor = 1e-9;
constexpr uint64_t kSeed = 20240611;

using Vec = std::vector<double>;

// N(0, scale^2) floats from their own stream; never zero in practice, unlike a zero-filled buffer
// that would hide a missing term.
std::vector<float> randn(int64_t n, uint64_t stream, double scale = 1.0) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(scale * rng::normal(kSeed, stream, i));
  return x;
}

Vec to_double(const std::vector<float>& x) { return Vec(x.begin(), x.end()); }

double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

struct NumericGrad {
  Vec g;
  Vec err;  // bound on |g - exact gradient|
};

// len (default all 1) is each input's length scale; see the top of the file.
template <typename Loss>
NumericGrad numeric_grad(Vec x, Loss&& loss, const Vec& len = {}) {
  NumericGrad out{Vec(x.size()), Vec(x.size())};
  for (size_t i = 0; i < x.size(); ++i) {
    const double l = len.empty() ? 1.0 : len[i], h = 1e-3 * l;
    const double x0 = x[i];
    x[i] = x0 - 2 * h;
    const double lm2 = loss(x);
    x[i] = x0 - h;
    const double lm1 = loss(x);
    x[i] = x0 + h;
    const double lp1 = loss(x);
    x[i] = x0 + 2 * h;
    const double lp2 = loss(x);
    x[i] = x0;
    out.g[i] = (lm2 - 8 * lm1 + 8 * lp1 - lp2) / (12 * h);
    out.err[i] = kFdFloor / l;
  }
  return out;
}

// Checks |got - want| <= u |stored| + extra elementwise (see the top of the file) and records the
// largest error-to-tolerance ratio, which shows how much slack the bound leaves.
void expect_close(const std::string& name, const Vec& got, const Vec& want, const std::vector<float>& stored,
                  const Vec& extra) {
  ASSERT_EQ(got.size(), want.size()) << name;
  ASSERT_EQ(got.size(), stored.size()) << name;
  ASSERT_EQ(got.size(), extra.size()) << name;
  double worst = 0.0;
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = kU * std::fabs(stored[i]) + extra[i];
    const double err = std::fabs(got[i] - want[i]);
    worst = std::max(worst, err / tol);
    if (!(err <= tol) && ++failures <= 5) {
      ADD_FAILURE() << name << "[" << i << "]: got " << got[i] << ", want " << want[i] << ", |err| " << err
                    << " > tol " << tol;
    }
  }
  EXPECT_EQ(failures, 0) << name;
  testing::Test::RecordProperty(name + "_max_err_over_tol", std::to_string(worst));
}

// A forward check: the double forward's own error is far below kFdFloor.
void expect_close(const std::string& name, const Vec& got, const Vec& want, const std::vector<float>& stored) {
  expect_close(name, got, want, stored, Vec(got.size(), kFdFloor));
}

// A backward check against a numeric gradient, with `extra` for float intermediates if any.
void expect_close(const std::string& name, const Vec& got, const NumericGrad& want, const std::vector<float>& stored,
                  Vec extra = {}) {
  if (extra.empty()) extra.assign(got.size(), 0.0);
  for (size_t i = 0; i < extra.size() && i < want.err.size(); ++i) extra[i] += want.err[i];
  expect_close(name, got, want.g, stored, extra);
}

// ---- Embedding ----

Vec embedding_double(const std::vector<int32_t>& tokens, const Vec& table, int64_t C) {
  Vec out(tokens.size() * C);
  for (size_t i = 0; i < tokens.size(); ++i) {
    for (int64_t c = 0; c < C; ++c) out[i * C + c] = table[tokens[i] * C + c];
  }
  return out;
}

TEST(RefGradcheck, Embedding) {
  const int64_t n = 7, C = 13, V = 11;
  // Token 3 repeats three times, so the backward's scatter must add, not overwrite.
  const std::vector<int32_t> tokens = {3, 0, 10, 3, 7, 3, 0};
  const std::vector<float> table = randn(V * C, 1), R = randn(n * C, 2), dtable0 = randn(V * C, 3);

  std::vector<float> out(n * C);
  embedding_forward(out.data(), tokens.data(), table.data(), n, C);
  expect_close("out", to_double(out), embedding_double(tokens, to_double(table), C), out);

  std::vector<float> dtable = dtable0;
  embedding_backward(dtable.data(), R.data(), tokens.data(), n, C);
  Vec got(dtable.size());
  for (size_t i = 0; i < got.size(); ++i) got[i] = static_cast<double>(dtable[i]) - dtable0[i];
  const NumericGrad want =
      numeric_grad(to_double(table), [&](const Vec& t) { return dot(embedding_double(tokens, t, C), to_double(R)); });
  expect_close("dtable", got, want, dtable);
}

// ---- RMSNorm ----

constexpr float kRmsEps = 1e-5f;

Vec rms_norm_double(const Vec& x, const Vec& w, int64_t n, int64_t C, Vec* rstd = nullptr) {
  Vec out(n * C);
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0.0;
    for (int64_t c = 0; c < C; ++c) ss += x[i * C + c] * x[i * C + c];
    const double r = 1.0 / std::sqrt(ss / C + static_cast<double>(kRmsEps));
    if (rstd != nullptr) rstd->push_back(r);
    for (int64_t c = 0; c < C; ++c) out[i * C + c] = x[i * C + c] * r * w[c];
  }
  return out;
}

TEST(RefGradcheck, RmsNorm) {
  const int64_t n = 7, C = 13;
  std::vector<float> x = randn(n * C, 10);
  // Rows of very different scale: at 3e-3 the mean square is comparable to eps, whose term the
  // backward must then get right too.
  const double row_scale[n] = {1.0, 3e-3, 2.5, 0.2, 1e-2, 7.0, 0.6};
  for (int64_t i = 0; i < n * C; ++i) x[i] = static_cast<float>(x[i] * row_scale[i / C]);
  std::vector<float> w = randn(C, 11, 0.3);
  for (float& v : w) v += 1.0f;
  const std::vector<float> R = randn(n * C, 12), dx0 = randn(n * C, 13), dw0 = randn(C, 14);

  std::vector<float> out(n * C), rstd(n);
  rms_norm_forward(out.data(), rstd.data(), x.data(), w.data(), n, C, kRmsEps);
  Vec rstd_want;
  expect_close("out", to_double(out), rms_norm_double(to_double(x), to_double(w), n, C, &rstd_want), out);
  expect_close("rstd", to_double(rstd), rstd_want, rstd);

  std::vector<float> dx = dx0, dw = dw0;
  rms_norm_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(), n, C);

  // The backward takes rstd as a float, off the exact value by up to u r. dx_c = r w_c g_c -
  // r^3 x_c dot / C with dot = sum_j w_j g_j x_j moves by at most u r |w_c g_c| + 3u r^3 |x_c dot| / C,
  // and dweight_c = sum_i g_ic x_ic r_i by at most u sum_i |g_ic x_ic r_i|.
  Vec dx_extra(n * C), dw_extra(C, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const double r = rstd_want[i];
    double d = 0.0;
    for (int64_t c = 0; c < C; ++c) d += static_cast<double>(w[c]) * R[i * C + c] * x[i * C + c];
    for (int64_t c = 0; c < C; ++c) {
      dx_extra[i * C + c] = kU * (r * std::fabs(w[c] * R[i * C + c]) + 3 * r * r * r * std::fabs(x[i * C + c] * d) / C);
      dw_extra[c] += kU * std::fabs(static_cast<double>(R[i * C + c]) * x[i * C + c] * r);
    }
  }
  Vec got_dx(n * C), got_dw(C);
  for (int64_t i = 0; i < n * C; ++i) got_dx[i] = static_cast<double>(dx[i]) - dx0[i];
  for (int64_t c = 0; c < C; ++c) got_dw[c] = static_cast<double>(dw[c]) - dw0[c];
  const Vec xd = to_double(x), wd = to_double(w), Rd = to_double(R);
  Vec x_len(n * C);
  for (int64_t i = 0; i < n * C; ++i) x_len[i] = 1.0 / rstd_want[i / C];
  expect_close("dx", got_dx,
               numeric_grad(xd, [&](const Vec& v) { return dot(rms_norm_double(v, wd, n, C), Rd); }, x_len), dx,
               dx_extra);
  expect_close("dweight", got_dw,
               numeric_grad(wd, [&](const Vec& v) { return dot(rms_norm_double(xd, v, n, C), Rd); }), dw, dw_extra);
}

// ---- Linear ----

Vec linear_double(const Vec& x, const Vec& w, int64_t M, int64_t N, int64_t K) {
  Vec y(M * N, 0.0);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t k = 0; k < K; ++k) y[m * N + n] += x[m * K + k] * w[n * K + k];
    }
  }
  return y;
}

TEST(RefGradcheck, Linear) {
  const int64_t M = 7, N = 5, K = 13;
  const std::vector<float> x = randn(M * K, 20), w = randn(N * K, 21), R = randn(M * N, 22);
  const std::vector<float> dx0 = randn(M * K, 23), dw0 = randn(N * K, 24);
  const Vec xd = to_double(x), wd = to_double(w), Rd = to_double(R);

  std::vector<float> y(M * N);
  linear_forward(y.data(), x.data(), w.data(), M, N, K);
  expect_close("y", to_double(y), linear_double(xd, wd, M, N, K), y);

  const NumericGrad want_dx = numeric_grad(xd, [&](const Vec& v) { return dot(linear_double(v, wd, M, N, K), Rd); });
  const NumericGrad want_dw = numeric_grad(wd, [&](const Vec& v) { return dot(linear_double(xd, v, M, N, K), Rd); });
  auto minus = [](const std::vector<float>& a, const std::vector<float>& b) {
    Vec d(a.size());
    for (size_t i = 0; i < a.size(); ++i) d[i] = static_cast<double>(a[i]) - b[i];
    return d;
  };
  const std::vector<float> zeros_dx(M * K, 0.0f);
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulate_dx" : "overwrite dx");
    std::vector<float> dx = dx0, dw = dw0;
    linear_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), M, N, K, accumulate);
    const std::string tag = accumulate ? "_acc" : "";
    expect_close("dx" + tag, minus(dx, accumulate ? dx0 : zeros_dx), want_dx, dx);
    expect_close("dw" + tag, minus(dw, dw0), want_dw, dw);
  }
  std::vector<float> dw = dw0;
  linear_backward(nullptr, dw.data(), R.data(), x.data(), w.data(), M, N, K, false);
  expect_close("dw_no_dx", minus(dw, dw0), want_dw, dw);
}

// ---- RoPE ----

Vec rope_double(Vec x, int64_t B, int64_t T, int64_t n_heads, int64_t D, int64_t stride, double theta) {
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < n_heads; ++h) {
        for (int64_t i = 0; i < D / 2; ++i) {
          const double angle = t * std::pow(theta, -2.0 * i / D);
          double* p = &x[(b * T + t) * stride + h * D + 2 * i];
          const double x0 = p[0], x1 = p[1];
          p[0] = x0 * std::cos(angle) - x1 * std::sin(angle);
          p[1] = x0 * std::sin(angle) + x1 * std::cos(angle);
        }
      }
    }
  }
  return x;
}

TEST(RefGradcheck, Rope) {
  // Rows wider than the rotated heads (as in a fused qkv row): the tail must pass through.
  const int64_t B = 2, T = 9, n_heads = 3, D = 8, stride = n_heads * D + 5;
  // A small theta makes the high-frequency and low-frequency pairs both turn visibly in 9 steps.
  for (float theta : {10000.0f, 7.0f}) {
    SCOPED_TRACE(theta);
    const std::vector<float> x0 = randn(B * T * stride, 30), R = randn(B * T * stride, 31);
    const std::string tag = "_theta" + std::to_string(static_cast<int>(theta));
    std::vector<float> x = x0;
    rope_forward(x.data(), B, T, n_heads, D, stride, theta);
    expect_close("out" + tag, to_double(x), rope_double(to_double(x0), B, T, n_heads, D, stride, theta), x);

    std::vector<float> dx = R;
    rope_backward(dx.data(), B, T, n_heads, D, stride, theta);
    const NumericGrad want = numeric_grad(to_double(x0), [&](const Vec& v) {
      return dot(rope_double(v, B, T, n_heads, D, stride, theta), to_double(R));
    });
    expect_close("dx" + tag, to_double(dx), want, dx);
  }
}

// ---- Attention ----

struct AttnShape {
  int64_t B, T, H, Hkv, D;
};

// Straight from the definition: masked score matrix, softmax, weighted sum of values.
Vec attention_double(const Vec& qkv, const AttnShape& s, Vec* lse = nullptr) {
  const int64_t row = (s.H + 2 * s.Hkv) * s.D;
  Vec out(s.B * s.T * s.H * s.D, 0.0);
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.H; ++h) {
      const int64_t g = h / (s.H / s.Hkv);
      for (int64_t i = 0; i < s.T; ++i) {
        Vec sc(i + 1);
        for (int64_t j = 0; j <= i; ++j) {
          double d = 0.0;
          for (int64_t c = 0; c < s.D; ++c) {
            d += qkv[(b * s.T + i) * row + h * s.D + c] * qkv[(b * s.T + j) * row + (s.H + g) * s.D + c];
          }
          sc[j] = d / std::sqrt(static_cast<double>(s.D));
        }
        const double mx = *std::max_element(sc.begin(), sc.end());
        double z = 0.0;
        for (double v : sc) z += std::exp(v - mx);
        if (lse != nullptr) lse->push_back(mx + std::log(z));
        for (int64_t j = 0; j <= i; ++j) {
          const double p = std::exp(sc[j] - mx) / z;
          for (int64_t c = 0; c < s.D; ++c) {
            out[(b * s.T + i) * s.H * s.D + h * s.D + c] += p * qkv[(b * s.T + j) * row + (s.H + s.Hkv + g) * s.D + c];
          }
        }
      }
    }
  }
  return out;
}

void check_attention(const AttnShape& s) {
  const int64_t n_qkv = s.B * s.T * (s.H + 2 * s.Hkv) * s.D, n_out = s.B * s.T * s.H * s.D;
  const std::vector<float> qkv = randn(n_qkv, 40), R = randn(n_out, 41);
  std::vector<float> out(n_out), lse(s.B * s.H * s.T);
  attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.H, s.Hkv, s.D);

  // The double forward gives lse in (t, head) order; the kernel stores (b, h, t).
  Vec lse_bth;
  expect_close("out", to_double(out), attention_double(to_double(qkv), s, &lse_bth), out);
  Vec lse_want(lse.size());
  for (int64_t b = 0, k = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.H; ++h) {
      for (int64_t i = 0; i < s.T; ++i) lse_want[(b * s.H + h) * s.T + i] = lse_bth[k++];
    }
  }
  expect_close("lse", to_double(lse), lse_want, lse);

  std::vector<float> dqkv(n_qkv, 1e30f);  // overwritten, never read
  attention_backward(dqkv.data(), R.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.H, s.Hkv, s.D);
  const NumericGrad want =
      numeric_grad(to_double(qkv), [&](const Vec& v) { return dot(attention_double(v, s), to_double(R)); });
  expect_close("dqkv", to_double(dqkv), want, dqkv);
}

TEST(RefGradcheck, AttentionGroupedQuery) { check_attention({2, 9, 4, 2, 6}); }
TEST(RefGradcheck, AttentionMultiHead) { check_attention({2, 9, 3, 3, 6}); }
TEST(RefGradcheck, AttentionMultiQuery) { check_attention({1, 7, 4, 1, 4}); }

// ---- SwiGLU ----

Vec swiglu_double(const Vec& h13, int64_t n, int64_t F) {
  Vec out(n * F);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t f = 0; f < F; ++f) {
      const double g = h13[i * 2 * F + f], u = h13[i * 2 * F + F + f];
      out[i * F + f] = g / (1.0 + std::exp(-g)) * u;
    }
  }
  return out;
}

TEST(RefGradcheck, Swiglu) {
  const int64_t n = 7, F = 13;
  // Gates up to |g| ~ 10 reach both tails of the sigmoid.
  const std::vector<float> h13 = randn(n * 2 * F, 50, 3.0), R = randn(n * F, 51);
  std::vector<float> out(n * F);
  swiglu_forward(out.data(), h13.data(), n, F);
  expect_close("out", to_double(out), swiglu_double(to_double(h13), n, F), out);

  std::vector<float> dh13(n * 2 * F, 1e30f);
  swiglu_backward(dh13.data(), R.data(), h13.data(), n, F);
  const NumericGrad want =
      numeric_grad(to_double(h13), [&](const Vec& v) { return dot(swiglu_double(v, n, F), to_double(R)); });
  expect_close("dh13", to_double(dh13), want, dh13);
}

// ---- Cross-entropy ----

Vec cross_entropy_double(const Vec& logits, const std::vector<int32_t>& targets, int64_t V) {
  Vec losses(targets.size(), 0.0);
  for (size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] < 0) continue;
    const double* row = &logits[i * V];
    const double mx = *std::max_element(row, row + V);
    double z = 0.0;
    for (int64_t j = 0; j < V; ++j) z += std::exp(row[j] - mx);
    losses[i] = mx + std::log(z) - row[targets[i]];
  }
  return losses;
}

TEST(RefGradcheck, CrossEntropy) {
  const int64_t n = 7, V = 13;
  const std::vector<int32_t> targets = {4, 0, -1, 12, 7, 4, -100};
  const std::vector<float> logits = randn(n * V, 60, 3.0);
  const float dscale = 0.37f;

  std::vector<float> losses(n), dlogits(n * V, 1e30f);
  softmax_cross_entropy(dlogits.data(), losses.data(), logits.data(), targets.data(), n, V, dscale);
  expect_close("losses", to_double(losses), cross_entropy_double(to_double(logits), targets, V), losses);
  const NumericGrad want = numeric_grad(to_double(logits), [&](const Vec& v) {
    Vec l = cross_entropy_double(v, targets, V);
    double s = 0.0;
    for (double x : l) s += x;
    return s * static_cast<double>(dscale);
  });
  expect_close("dlogits", to_double(dlogits), want, dlogits);
  for (int64_t i : {2, 6}) {  // ignored targets: exactly nothing
    EXPECT_EQ(losses[i], 0.0f);
    for (int64_t j = 0; j < V; ++j) EXPECT_EQ(dlogits[i * V + j], 0.0f) << "row " << i << " col " << j;
  }

  // In place: the same bits as out of place.
  std::vector<float> inplace = logits, losses2(n);
  softmax_cross_entropy(inplace.data(), losses2.data(), inplace.data(), targets.data(), n, V, dscale);
  EXPECT_EQ(inplace, dlogits);
  EXPECT_EQ(losses2, losses);

  // Without dlogits only the losses are produced.
  std::vector<float> losses3(n);
  softmax_cross_entropy(nullptr, losses3.data(), logits.data(), targets.data(), n, V, dscale);
  EXPECT_EQ(losses3, losses);
}

// ---- AdamW ----

// AdamW has no backward to check; its first step has a closed form instead. With m = v = 0 and
// t = 1, bias correction gives m_hat = g and sqrt(v_hat) = |g| exactly, so
// p' = p (1 - lr wd) - lr g / (|g| + eps): a step of nearly lr against the gradient's sign.
TEST(RefGradcheck, AdamWFirstStepClosedForm) {
  const int64_t n = 33;
  std::vector<float> p = randn(n, 70), g = randn(n, 71, 1e-3), m(n, 0.0f), v(n, 0.0f);
  g[5] = 1e-9f;  // |g| ~ eps: the eps term must be in the denominator, not outside the sqrt
  const std::vector<float> p0 = p;
  AdamWParams hp;
  hp.lr = 1e-2f;
  hp.weight_decay = 0.1f;
  hp.step = 1;
  adamw_step(p.data(), g.data(), m.data(), v.data(), n, hp);
  for (int64_t i = 0; i < n; ++i) {
    const double lr = hp.lr, gi = g[i];
    const double want = p0[i] * (1.0 - lr * static_cast<double>(hp.weight_decay)) - lr * gi / (std::fabs(gi) + hp.eps);
    // m and v are stored as float, each rounded once from (1 - beta) g and (1 - beta2) g^2.
    EXPECT_NEAR(m[i], (1.0 - static_cast<double>(hp.beta1)) * gi, kU * std::fabs(m[i]) + 1e-30) << i;
    EXPECT_NEAR(v[i], (1.0 - static_cast<double>(hp.beta2)) * gi * gi, kU * v[i] + 1e-30) << i;
    EXPECT_NEAR(p[i], want, kU * std::fabs(p[i]) + 1e-15) << i;
  }
}

}  // namespace
}  // namespace tessera::kernels::ref
