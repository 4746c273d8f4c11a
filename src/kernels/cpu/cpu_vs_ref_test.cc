// CPU kernels against their ref twins on random inputs of odd sizes, at 1 and 2 threads.
//
// Tolerances come from a rounding model of float arithmetic, evaluated per element from the
// inputs, never tuned to the observed errors:
// - An elementary float operation (+, *, /, sqrt, a conversion) errs by at most u = 2^-24 times
//   its result. exp and log are budgeted at 4 ulp (8u), the accuracy glibc documents for the
//   libmvec SIMD variants GCC may call inside `omp simd` loops; vec_math.h's exp_fast claims 2.
// - A float sum of K terms, in whatever order the kernel takes (sequential, SIMD lanes, GEMM
//   blocks), errs by sum_k d_k S_k over its partial sums S_k, |d_k| <= u. The worst case
//   (K - 1) u sum|terms| needs adversarial data; rounding errors behave as independent, zero-mean
//   and uniform on [-u, u] (Higham & Mary, SIAM J. Sci. Comput. 2019), so the error has standard
//   deviation u sqrt(sum_k S_k^2 / 3). Summed in order, random terms with sum s and 2-norm n have
//   S_k ~ (k/K) s plus a random walk of variance (k/K) n^2, so sum_k S_k^2 ~ K (s^2/3 + n^2/2);
//   blocked and SIMD orders only shorten the partial sums. reduction_tol allows kSigmas = 6 of
//   these standard deviations: kSigmas u sqrt(K) sqrt(s^2/9 + n^2/6).
// - Other independent errors within bounds b_j (one per score, say) add the same way. Spread no
//   wider than evenly over [-b_j, b_j], each has standard deviation at most b_j / sqrt(3) (a
//   reduction's error, near-Gaussian within its 6-sigma bound, is much narrower), so their sum
//   is allowed independent_tol = kSigmas sqrt(sum_j b_j^2 / 3).
// - The ref result is itself rounded once to float: u |ref| more.
// - kTiny (1e-37) absorbs results that underflow (exp below -87): they lose what lies under
//   FLT_MIN ~ 1.2e-38 and are otherwise meaningless to compare relatively.
// The derivation for each op sits beside its test. Every comparison records its largest
// error-to-tolerance ratio as a test property, so a tolerance with too much slack shows.
//
// Separately, each kernel run twice at the same thread count must give the same bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/rng.h"
#include "core/threads.h"
#include "kernels/backend.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cpu/vector.h"
#include "kernels/ref/adamw.h"
#include "kernels/ref/attention.h"
#include "kernels/ref/cross_entropy.h"
#include "kernels/ref/embedding.h"
#include "kernels/ref/matmul.h"
#include "kernels/ref/rms_norm.h"
#include "kernels/ref/rope.h"
#include "kernels/ref/swiglu.h"
#include "kernels/ref/vector.h"

namespace tessera::kernels {
namespace {

constexpr double kU = 0x1.0p-24;
constexpr double kSigmas = 6.0;
constexpr double kTiny = 1e-37;
constexpr double kExpErr = 8 * kU;
constexpr uint64_t kSeed = 77;

using Vec = std::vector<double>;
using Floats = std::vector<float>;

Floats randn(int64_t n, uint64_t stream, double scale = 1.0) {
  Floats x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(scale * rng::normal(kSeed, stream, i));
  return x;
}

Floats nans(int64_t n) { return Floats(static_cast<size_t>(n), std::numeric_limits<float>::quiet_NaN()); }

double reduction_tol(int64_t K, double sum, double norm2) {
  return kSigmas * kU * std::sqrt(static_cast<double>(std::max<int64_t>(K, 1)) * (sum * sum / 9 + norm2 * norm2 / 6));
}

// Sum of independent errors, given the sum of their squared bounds.
double independent_tol(double bounds_sq) { return kSigmas * std::sqrt(bounds_sq / 3); }

// Worst error-to-tolerance ratio per comparison name over a test, recorded when it ends.
std::map<std::string, double>& worst_ratios() {
  static std::map<std::string, double> m;
  return m;
}

void expect_within(const std::string& name, const Floats& got, const Floats& want, const Vec& tol) {
  ASSERT_EQ(got.size(), want.size()) << name;
  ASSERT_EQ(got.size(), tol.size()) << name;
  double& worst = worst_ratios()[name];
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (tol[i] > 0) worst = std::max(worst, err / tol[i]);
    if (!(err <= tol[i]) && ++failures <= 5) {
      ADD_FAILURE() << name << "[" << i << "]: cpu " << got[i] << ", ref " << want[i] << ", |err| " << err << " > tol "
                    << tol[i];
    }
  }
  EXPECT_EQ(failures, 0) << name << ": elements out of tolerance";
}

void expect_bitwise(const std::string& name, const Floats& a, const Floats& b) {
  ASSERT_EQ(a.size(), b.size()) << name;
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << name << ": bits differ";
}

// Runs fn, which computes its outputs from fresh copies of its inputs, twice and expects the same
// bits both times; returns the first run's outputs.
template <typename Fn>
std::vector<Floats> run_twice(const std::string& name, Fn&& fn) {
  const std::vector<Floats> a = fn(), b = fn();
  EXPECT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    expect_bitwise(name + " rerun #" + std::to_string(i), a[i], b[i]);
  }
  return a;
}

class CpuVsRef : public testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    saved_threads_ = num_threads();
    set_num_threads(GetParam());
    worst_ratios().clear();
  }
  void TearDown() override {
    for (const auto& [name, ratio] : worst_ratios()) RecordProperty(name + "_max_err_over_tol", std::to_string(ratio));
    set_num_threads(saved_threads_);
  }

 private:
  int saved_threads_ = 1;
};

std::string threads_name(const testing::TestParamInfo<int>& p) {
  std::string name = "t";
  name += std::to_string(p.param);
  return name;
}
INSTANTIATE_TEST_SUITE_P(Threads, CpuVsRef, testing::Values(1, 2), threads_name);

// ---- Embedding ----
// Forward copies rows: bitwise equal. Backward adds each token's cnt rows of dout to dtable in
// float: a (cnt + 1)-term reduction.
TEST_P(CpuVsRef, Embedding) {
  const int64_t V = 17;
  for (int64_t n : {1, 7, 33, 130}) {
    for (int64_t C : {1, 7, 33, 130}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " C=" + std::to_string(C));
      std::vector<int32_t> tokens(n);
      for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>(rng::bits(kSeed, 100, i) % V);
      const Floats table = randn(V * C, 101), dout = randn(n * C, 102), dtable0 = randn(V * C, 103);

      Floats ref_out(n * C);
      ref::embedding_forward(ref_out.data(), tokens.data(), table.data(), n, C);
      const auto fwd = run_twice("embedding_forward", [&] {
        Floats out = nans(n * C);
        cpu::embedding_forward(out.data(), tokens.data(), table.data(), n, C);
        return std::vector<Floats>{out};
      });
      expect_bitwise("embedding out", fwd[0], ref_out);

      Floats ref_dtable = dtable0;
      ref::embedding_backward(ref_dtable.data(), dout.data(), tokens.data(), n, C);
      const auto bwd = run_twice("embedding_backward", [&] {
        Floats dtable = dtable0;
        cpu::embedding_backward(dtable.data(), dout.data(), tokens.data(), n, C);
        return std::vector<Floats>{dtable};
      });
      Vec count(V, 1.0), sq(V * C);
      for (int64_t i = 0; i < V * C; ++i) sq[i] = static_cast<double>(dtable0[i]) * dtable0[i];
      for (int64_t i = 0; i < n; ++i) {
        count[tokens[i]] += 1;
        for (int64_t c = 0; c < C; ++c) sq[tokens[i] * C + c] += static_cast<double>(dout[i * C + c]) * dout[i * C + c];
      }
      Vec tol(V * C);
      for (int64_t i = 0; i < V * C; ++i) {
        tol[i] = reduction_tol(static_cast<int64_t>(count[i / C]), ref_dtable[i], std::sqrt(sq[i])) +
                 kU * std::fabs(ref_dtable[i]) + kTiny;
      }
      expect_within("embedding dtable", bwd[0], ref_dtable, tol);
    }
  }
}

// ---- RMSNorm ----
// Forward: ss = sum x^2 has relative error reduction_tol(C, ss, ||x^2||) / ss; r = 1/sqrt(ss/C +
// eps) carries half of that relative to ss + C eps, plus 4u for /C, +eps, sqrt and 1/; out =
// x r w two roundings more. Backward is fed the ref's rstd, so both start from the same r:
// dot = sum w g x is a C-term reduction (its products' own roundings are a walk of size
// u ||terms||, inside the bound); k = r^3 dot / C adds 5u|k|; dx = dx0 + r g w - k x adds
// u (3|r g w| + 2|k x| + |dx0|) and the ref's rounding. dweight = dw0 + sum_i g x r is an
// (n + 1)-term reduction.
TEST_P(CpuVsRef, RmsNorm) {
  const float eps = 1e-5f;
  for (int64_t n : {1, 7, 33}) {
    for (int64_t C : {1, 7, 33, 130, 1031}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " C=" + std::to_string(C));
      Floats x = randn(n * C, 110);
      // Every third row small enough that eps matters.
      for (int64_t i = 0; i < n * C; ++i) x[i] *= (i / C) % 3 == 1 ? 3e-3f : 1.0f;
      Floats w = randn(C, 111, 0.2);
      for (float& v : w) v += 1.0f;
      const Floats dout = randn(n * C, 112), dx0 = randn(n * C, 113), dw0 = randn(C, 114);

      Floats ref_out(n * C), ref_rstd(n);
      ref::rms_norm_forward(ref_out.data(), ref_rstd.data(), x.data(), w.data(), n, C, eps);
      const auto fwd = run_twice("rms_norm_forward", [&] {
        Floats out = nans(n * C), rstd = nans(n);
        cpu::rms_norm_forward(out.data(), rstd.data(), x.data(), w.data(), n, C, eps);
        return std::vector<Floats>{out, rstd};
      });
      Vec tol_out(n * C), tol_rstd(n);
      for (int64_t i = 0; i < n; ++i) {
        double ss = 0.0, ss2 = 0.0;
        for (int64_t c = 0; c < C; ++c) {
          const double xx = static_cast<double>(x[i * C + c]) * x[i * C + c];
          ss += xx;
          ss2 += xx * xx;
        }
        const double rel_r = 0.5 * reduction_tol(C, ss, std::sqrt(ss2)) / (ss + C * static_cast<double>(eps)) + 4 * kU;
        tol_rstd[i] = (rel_r + kU) * ref_rstd[i] + kTiny;
        for (int64_t c = 0; c < C; ++c) tol_out[i * C + c] = (rel_r + 3 * kU) * std::fabs(ref_out[i * C + c]) + kTiny;
      }
      expect_within("rms_norm out", fwd[0], ref_out, tol_out);
      expect_within("rms_norm rstd", fwd[1], ref_rstd, tol_rstd);
      // The bf16 output is the fp32 one rounded, bit for bit, beside the same rstd.
      std::vector<uint16_t> out16(n * C, 0xffff);
      Floats rstd16 = nans(n);
      cpu::rms_norm_forward_bf16(out16.data(), rstd16.data(), x.data(), w.data(), n, C, eps);
      expect_bitwise("rms_norm_forward_bf16 rstd", rstd16, fwd[1]);
      for (int64_t i = 0; i < n * C; ++i) ASSERT_EQ(out16[i], f32_to_bf16(fwd[0][i])) << "out element " << i;

      Floats ref_dx = dx0, ref_dw = dw0;
      ref::rms_norm_backward(ref_dx.data(), ref_dw.data(), dout.data(), x.data(), w.data(), ref_rstd.data(), n, C);
      const auto bwd = run_twice("rms_norm_backward", [&] {
        Floats dx = dx0, dw = dw0;
        cpu::rms_norm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), ref_rstd.data(), n, C);
        return std::vector<Floats>{dx, dw};
      });
      Vec tol_dx(n * C), dw_sq(C);
      for (int64_t c = 0; c < C; ++c) dw_sq[c] = static_cast<double>(dw0[c]) * dw0[c];
      for (int64_t i = 0; i < n; ++i) {
        const double r = ref_rstd[i];
        double dot = 0.0, dot2 = 0.0;
        for (int64_t c = 0; c < C; ++c) {
          const double t = static_cast<double>(w[c]) * dout[i * C + c] * x[i * C + c];
          dot += t;
          dot2 += t * t;
          const double gxr = static_cast<double>(dout[i * C + c]) * x[i * C + c] * r;
          dw_sq[c] += gxr * gxr;
        }
        const double k = r * r * r * dot / C;
        const double dk = r * r * r / C * reduction_tol(C, dot, std::sqrt(dot2)) + 5 * kU * std::fabs(k);
        for (int64_t c = 0; c < C; ++c) {
          const double xc = x[i * C + c], rgw = r * dout[i * C + c] * w[c];
          tol_dx[i * C + c] = std::fabs(xc) * dk +
                              kU * (3 * std::fabs(rgw) + 2 * std::fabs(k * xc) + std::fabs(dx0[i * C + c]) +
                                    std::fabs(ref_dx[i * C + c])) +
                              kTiny;
        }
      }
      Vec tol_dw(C);
      for (int64_t c = 0; c < C; ++c) {
        tol_dw[c] = reduction_tol(n + 1, ref_dw[c], std::sqrt(dw_sq[c])) + kU * std::fabs(ref_dw[c]) + kTiny;
      }
      expect_within("rms_norm dx", bwd[0], ref_dx, tol_dx);
      expect_within("rms_norm dweight", bwd[1], ref_dw, tol_dw);
    }
  }
}

// ---- Linear and GEMM ----
// Each output is a K-term reduction (N for dx, M for dw), one term more when it adds into an
// existing value; its 2-norm of terms is sqrt of the same product over squared inputs, which the
// ref linear computes.
Floats squared(const Floats& a) {
  Floats s(a.size());
  for (size_t i = 0; i < a.size(); ++i) s[i] = a[i] * a[i];
  return s;
}

// The ref's linear_forward and linear_backward (dx from dx0, accumulated or not; dw from dw0),
// each element with its tolerance: sums of K (y), N (dx) and M (dw) products.
struct LinearRef {
  Floats y, dx, dw;
  Vec tol_y, tol_dx, tol_dw;
};
LinearRef linear_ref(const Floats& x, const Floats& w, const Floats& dy, const Floats& dx0, const Floats& dw0,
                     int64_t M, int64_t N, int64_t K, bool accumulate) {
  const Floats x2 = squared(x), w2 = squared(w), dy2 = squared(dy);
  LinearRef r{Floats(M * N), dx0, dw0, Vec(M * N), Vec(M * K), Vec(N * K)};
  Floats y_sq(M * N), dx_sq = squared(dx0), dw_sq = squared(dw0);
  ref::linear_forward(r.y.data(), x.data(), w.data(), M, N, K);
  ref::linear_forward(y_sq.data(), x2.data(), w2.data(), M, N, K);
  ref::linear_backward(r.dx.data(), r.dw.data(), dy.data(), x.data(), w.data(), M, N, K, accumulate);
  ref::linear_backward(dx_sq.data(), dw_sq.data(), dy2.data(), x2.data(), w2.data(), M, N, K, accumulate);
  for (int64_t i = 0; i < M * N; ++i) {
    r.tol_y[i] = reduction_tol(K, r.y[i], std::sqrt(y_sq[i])) + kU * std::fabs(r.y[i]) + kTiny;
  }
  for (int64_t i = 0; i < M * K; ++i) {
    r.tol_dx[i] = reduction_tol(N + accumulate, r.dx[i], std::sqrt(dx_sq[i])) + kU * std::fabs(r.dx[i]) + kTiny;
  }
  for (int64_t i = 0; i < N * K; ++i) {
    r.tol_dw[i] = reduction_tol(M + 1, r.dw[i], std::sqrt(dw_sq[i])) + kU * std::fabs(r.dw[i]) + kTiny;
  }
  return r;
}

TEST_P(CpuVsRef, Linear) {
  struct Shape {
    int64_t M, N, K;
  };
  for (const Shape& s : {Shape{1, 1, 1}, Shape{7, 13, 33}, Shape{33, 7, 130}, Shape{130, 67, 257}, Shape{5, 131, 1023},
                         Shape{67, 1, 7}}) {
    const int64_t M = s.M, N = s.N, K = s.K;
    SCOPED_TRACE("M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
    const Floats x = randn(M * K, 120), w = randn(N * K, 121), dy = randn(M * N, 122);
    const Floats dx0 = randn(M * K, 123), dw0 = randn(N * K, 124);
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(accumulate ? "accumulate_dx" : "overwrite dx");
      const LinearRef want = linear_ref(x, w, dy, dx0, dw0, M, N, K, accumulate);
      if (!accumulate) {
        const auto fwd = run_twice("linear_forward", [&] {
          Floats y = nans(M * N);
          cpu::linear_forward(y.data(), x.data(), w.data(), M, N, K);
          return std::vector<Floats>{y};
        });
        expect_within("linear y", fwd[0], want.y, want.tol_y);
      }
      const auto bwd = run_twice("linear_backward", [&] {
        Floats dx = accumulate ? dx0 : nans(M * K), dw = dw0;
        cpu::linear_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), M, N, K, accumulate);
        return std::vector<Floats>{dx, dw};
      });
      expect_within("linear dx", bwd[0], want.dx, want.tol_dx);
      expect_within("linear dw", bwd[1], want.dw, want.tol_dw);
    }

    // Without dx only dw is produced, and it is the same computation.
    const LinearRef want = linear_ref(x, w, dy, dx0, dw0, M, N, K, false);
    Floats dw = dw0;
    cpu::linear_backward(nullptr, dw.data(), dy.data(), x.data(), w.data(), M, N, K, false);
    expect_within("linear dw without dx", dw, want.dw, want.tol_dw);
  }
}

// gemm has no ref twin; attention leans on its transposes, strides and beta, so it is checked
// against double loops: C = alpha op(A) op(B) + beta C is a (K + 1)-term reduction whose terms are
// alpha a b and beta c, plus the roundings of the products by alpha and beta and the ref's own.
TEST_P(CpuVsRef, GemmTransposesStridesBeta) {
  const int64_t M = 13, N = 7, K = 33, pad = 3;
  const float alpha = 0.7f, beta = 0.3f;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(std::string(ta ? "A^T" : "A") + (tb ? " B^T" : " B"));
      const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
      const int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
      const Floats A = randn(a_rows * lda, 130), B = randn(b_rows * ldb, 131), C0 = randn(M * ldc, 132);
      auto a = [&](int64_t m, int64_t k) -> double { return ta ? A[k * lda + m] : A[m * lda + k]; };
      auto b = [&](int64_t k, int64_t n) -> double { return tb ? B[n * ldb + k] : B[k * ldb + n]; };
      const auto got = run_twice("gemm", [&] {
        Floats C = C0;
        cpu::gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
        return std::vector<Floats>{C};
      });
      Floats want = C0;
      Vec tol(M * ldc, 0.0);  // the padding between rows must come back untouched
      for (int64_t m = 0; m < M; ++m) {
        for (int64_t n = 0; n < N; ++n) {
          double sum = 0.0, sq = 0.0;
          for (int64_t k = 0; k < K; ++k) {
            const double t = alpha * a(m, k) * b(k, n);
            sum += t;
            sq += t * t;
          }
          const double ab = sum;
          const double c = static_cast<double>(beta) * C0[m * ldc + n];
          sum += c;
          sq += c * c;
          want[m * ldc + n] = static_cast<float>(sum);
          tol[m * ldc + n] = reduction_tol(K + 1, sum, std::sqrt(sq)) +
                             kU * (2 * std::fabs(ab) + std::fabs(c) + std::fabs(sum)) + kTiny;
        }
      }
      expect_within("gemm C", got[0], want, tol);
    }
  }
}

// ---- bf16 GEMM ----
// A product of two bf16 values (8 significant bits each) is exact in fp32 (24 bits), so a GEMM on
// bf16 inputs with fp32 accumulation errs only in its sums, and the fp32 GEMM's tolerance applies
// against the double result on the same bf16 values. (avx512_bf16's dot-product instruction
// flushes denormals; normal random inputs have none.)
using Halves = std::vector<uint16_t>;

Halves round_bf16(const Floats& x) {
  Halves h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = f32_to_bf16(x[i]);
  return h;
}

Floats widen(const Halves& h) {
  Floats x(h.size());
  for (size_t i = 0; i < h.size(); ++i) x[i] = bf16_to_f32(h[i]);
  return x;
}

TEST_P(CpuVsRef, GemmBf16TransposesStridesBeta) {
  struct Shape {
    int64_t M, N, K;
  };
  struct Scale {
    float alpha, beta;
  };
  for (const Shape& s : {Shape{1, 1, 1}, Shape{13, 7, 33}, Shape{67, 130, 257}, Shape{5, 131, 1023}}) {
    for (const Scale& sc : {Scale{1.0f, 0.0f}, Scale{1.0f, 1.0f}, Scale{0.7f, 0.3f}}) {
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          const int64_t M = s.M, N = s.N, K = s.K, pad = 3;
          SCOPED_TRACE("M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                       " alpha=" + std::to_string(sc.alpha) + " beta=" + std::to_string(sc.beta) +
                       (ta ? " A^T" : " A") + (tb ? " B^T" : " B"));
          const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
          const int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
          const Halves A = round_bf16(randn(a_rows * lda, 135)), B = round_bf16(randn(b_rows * ldb, 136));
          const Floats Af = widen(A), Bf = widen(B);
          // beta = 0 must not read C: NaN there would show.
          Floats C0 = sc.beta == 0.0f ? nans(M * ldc) : randn(M * ldc, 137);
          if (sc.beta == 0.0f) {
            for (int64_t m = 0; m < M; ++m) {
              for (int64_t n = N; n < ldc; ++n) C0[m * ldc + n] = 1.5f;  // padding: not NaN, so it compares
            }
          }
          auto a = [&](int64_t m, int64_t k) -> double { return ta ? Af[k * lda + m] : Af[m * lda + k]; };
          auto b = [&](int64_t k, int64_t n) -> double { return tb ? Bf[n * ldb + k] : Bf[k * ldb + n]; };
          const auto got = run_twice("gemm_bf16", [&] {
            Floats C = C0;
            cpu::gemm_bf16(ta, tb, M, N, K, sc.alpha, A.data(), lda, B.data(), ldb, sc.beta, C.data(), ldc);
            return std::vector<Floats>{C};
          });
          Floats want = C0;
          Vec tol(M * ldc, 0.0);  // the padding between rows must come back untouched
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = 0; n < N; ++n) {
              double sum = 0.0, sq = 0.0;
              for (int64_t k = 0; k < K; ++k) {
                const double t = sc.alpha * a(m, k) * b(k, n);
                sum += t;
                sq += t * t;
              }
              const double ab = sum;
              const double c = sc.beta == 0.0f ? 0.0 : static_cast<double>(sc.beta) * C0[m * ldc + n];
              sum += c;
              sq += c * c;
              want[m * ldc + n] = static_cast<float>(sum);
              tol[m * ldc + n] = reduction_tol(K + 1, sum, std::sqrt(sq)) +
                                 kU * (2 * std::fabs(ab) + std::fabs(c) + std::fabs(sum)) + kTiny;
            }
          }
          expect_within("gemm_bf16 C", got[0], want, tol);
        }
      }
    }
  }
}

// linear_*_bf16 against the fp32 ref on the same bf16 values, with the fp32 linear's tolerances:
// the kernels reading the plain weight, and (where the CPU packs) the backend's products reading
// it packed for each use (Backend::pack_weight_bf16).
TEST_P(CpuVsRef, LinearBf16) {
  struct Shape {
    int64_t M, N, K;
  };
  Backend& be = cpu_backend();
  for (const Shape& s : {Shape{1, 1, 1}, Shape{7, 13, 33}, Shape{130, 67, 257}, Shape{5, 131, 1023}, Shape{67, 96, 40},
                         Shape{37, 1030, 70}}) {
    for (bool packed : {false, true}) {
      const int64_t M = s.M, N = s.N, K = s.K;
      if (packed && be.packed_weight_bytes(N, K, WeightUse::kForward) == 0) continue;
      SCOPED_TRACE("M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                   (packed ? " packed" : " plain"));
      const Halves x16 = round_bf16(randn(M * K, 140)), w16 = round_bf16(randn(N * K, 141)),
                   dy16 = round_bf16(randn(M * N, 142));
      const Floats x = widen(x16), w = widen(w16), dy = widen(dy16), dx0 = randn(M * K, 143), dw0 = randn(N * K, 144);
      // The packs start as NaN: a byte the products read but the pack did not write shows.
      std::vector<uint16_t> pack_fwd(be.packed_weight_bytes(N, K, WeightUse::kForward) / 2, 0x7fc1),
          pack_dx(be.packed_weight_bytes(N, K, WeightUse::kInputGrad) / 2, 0x7fc1);
      if (packed) {
        be.pack_weight_bf16(pack_fwd.data(), w16.data(), N, K, WeightUse::kForward);
        be.pack_weight_bf16(pack_dx.data(), w16.data(), N, K, WeightUse::kInputGrad);
      }
      for (bool accumulate : {false, true}) {
        if (packed && accumulate) continue;  // the backend's product overwrites dx
        SCOPED_TRACE(accumulate ? "accumulate_dx" : "overwrite dx");
        const LinearRef want = linear_ref(x, w, dy, dx0, dw0, M, N, K, accumulate);
        if (!accumulate) {
          const auto fwd = run_twice("linear_forward_bf16", [&] {
            Floats y = nans(M * N);
            if (packed) {
              be.linear_bf16(y.data(), x16.data(), Bf16Weight::packed(pack_fwd.data()), M, N, K, 0.0f);
            } else {
              cpu::linear_forward_bf16(y.data(), x16.data(), w16.data(), M, N, K);
            }
            return std::vector<Floats>{y};
          });
          expect_within("linear_bf16 y", fwd[0], want.y, want.tol_y);
        }
        const auto bwd = run_twice("linear_backward_bf16", [&] {
          Floats dx = accumulate ? dx0 : nans(M * K), dw = dw0;
          if (packed) {
            be.linear_backward_bf16(dx.data(), dw.data(), dy16.data(), x16.data(), Bf16Weight::packed(pack_dx.data()),
                                    M, N, K);
          } else {
            cpu::linear_backward_bf16(dx.data(), dw.data(), dy16.data(), x16.data(), w16.data(), M, N, K, accumulate);
          }
          return std::vector<Floats>{dx, dw};
        });
        expect_within("linear_bf16 dx", bwd[0], want.dx, want.tol_dx);
        expect_within("linear_bf16 dw", bwd[1], want.dw, want.tol_dw);
      }
    }
  }
}

// The threaded conversion is the scalar rounding of core/bf16.h, bit for bit, including ties,
// infinities, NaN, denormals and signed zeros.
TEST_P(CpuVsRef, ToBf16MatchesScalarRounding) {
  for (int64_t n : {1, 7, 130, 100003}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    Floats x = randn(n, 150);
    const float specials[] = {0.0f,
                              -0.0f,
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::denorm_min(),
                              1.0f + 0x1.0p-8f,
                              1.0f + 0x1.8p-7f,
                              std::numeric_limits<float>::max()};
    for (size_t i = 0; i < std::size(specials) && static_cast<int64_t>(i) < n; ++i)
      x[i * (n / 9 + 1) % n] = specials[i];
    Halves got(n), want(n);
    cpu::to_bf16(got.data(), x.data(), n);
    for (int64_t i = 0; i < n; ++i) want[i] = f32_to_bf16(x[i]);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), n * sizeof(uint16_t)));
  }
}

TEST_P(CpuVsRef, EmbeddingBf16IsTheWidenedLookup) {
  const int64_t V = 37, C = 19, n = 53;
  const Halves table16 = round_bf16(randn(V * C, 160));
  const Floats table = widen(table16);
  std::vector<int32_t> tokens(n);
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>((i * 7 + 3) % V);
  Floats want(n * C), got = nans(n * C);
  ref::embedding_forward(want.data(), tokens.data(), table.data(), n, C);
  cpu::embedding_forward_bf16(got.data(), tokens.data(), table16.data(), n, C);
  expect_bitwise("embedding_forward_bf16", got, want);
}

// ---- RoPE ----
// The table holds cos and sin rounded once from double. A rotated pair (a c - b s, a s + b c)
// from rounded c and s errs by at most u(2|a c| + 2|b s|) + u|result| <= 3u (|a| + |b|), and the
// ref's own rounding adds u (|a| + |b|) more. Channels past n_heads * D are not touched: exact.
TEST_P(CpuVsRef, Rope) {
  for (float theta : {10000.0f, 500000.0f}) {
    for (int64_t T : {1, 7, 130}) {
      for (int64_t D : {2, 8, 64}) {
        for (int64_t n_heads : {1, 3}) {
          SCOPED_TRACE("theta=" + std::to_string(theta) + " T=" + std::to_string(T) + " D=" + std::to_string(D) +
                       " heads=" + std::to_string(n_heads));
          const int64_t B = 2, stride = n_heads * D + 3;
          Floats table(T * D);
          cpu::rope_table(table.data(), T, D, theta);
          Floats want_table(T * D);
          Vec tol_table(T * D);
          for (int64_t t = 0; t < T; ++t) {
            for (int64_t i = 0; i < D / 2; ++i) {
              const double angle = t * std::pow(static_cast<double>(theta), -2.0 * i / D);
              want_table[(t * D / 2 + i) * 2] = static_cast<float>(std::cos(angle));
              want_table[(t * D / 2 + i) * 2 + 1] = static_cast<float>(std::sin(angle));
              tol_table[(t * D / 2 + i) * 2] = kU * std::fabs(std::cos(angle)) + 1e-15;
              tol_table[(t * D / 2 + i) * 2 + 1] = kU * std::fabs(std::sin(angle)) + 1e-15;
            }
          }
          expect_within("rope table", table, want_table, tol_table);

          const Floats x0 = randn(B * T * stride, 140);
          Vec tol(B * T * stride, 0.0);
          for (int64_t row = 0; row < B * T; ++row) {
            for (int64_t c = 0; c < n_heads * D; c += 2) {
              const double ab = std::fabs(x0[row * stride + c]) + std::fabs(x0[row * stride + c + 1]);
              tol[row * stride + c] = tol[row * stride + c + 1] = 4 * kU * ab + kTiny;
            }
          }
          Floats ref_fwd = x0, ref_bwd = x0;
          ref::rope_forward(ref_fwd.data(), B, T, n_heads, D, stride, theta);
          ref::rope_backward(ref_bwd.data(), B, T, n_heads, D, stride, theta);
          const auto got = run_twice("rope", [&] {
            Floats fwd = x0, bwd = x0;
            cpu::rope_forward(fwd.data(), table.data(), B, T, n_heads, D, stride);
            cpu::rope_backward(bwd.data(), table.data(), B, T, n_heads, D, stride);
            return std::vector<Floats>{fwd, bwd};
          });
          expect_within("rope forward", got[0], ref_fwd, tol);
          expect_within("rope backward", got[1], ref_bwd, tol);
        }
      }
    }
  }
}

// ---- Attention ----
// Errors that are independent from term to term (each score is its own dot product, each exp its
// own call) combine as independent_tol of their bounds, written "ind" below; an error
// shared by a whole row (the softmax sum, the saved lse, the row's dout . out) scales the row's
// result and adds linearly. Per query row i, sums over keys j <= i, in double from float inputs:
//   score s_j, a D-term reduction scaled by a rounded 1/sqrt(D): ds_j = reduction_tol(D, s_j,
//     ||q k|| / sqrt(D)) + 3u|s_j|. e_j = exp(s_j - max) then has relative error a_j = ds_j +
//     u (8 + |s_j - max|) (score, exp, the shift's rounding; the max's own error cancels).
//   z = sum_j e_j: relative error cz = ind(p_j a_j) + reduction_tol(i + 1,
//     z, ||e||) / z; every p_j = e_j / z shares cz + 2u, and carries its own a_j.
//   out_d = sum_j p_j v_jd: ind(p_j a_j v_jd) + (cz + 2u)|out_d| + reduction_tol(i + 1, out_d,
//     ||p v_d||) + the ref's u|out_d|.   lse = max + log z: cz + 2u|log z| + 2u|lse|.
// The backward gets the ref's float out and lse, each within u of exact, and recomputes
//   p_j = exp(s_j - lse): own error b_j = ds_j + u (|s_j - lse| + 8), shared cl = u|lse|;
//   dp_j = dout . v_j, a D-term reduction + u|dp_j| (own); Di = dout . out, a D-term reduction +
//     u sum|dout out| for the rounded out (shared, dDi);
//   ds_j = p_j (dp_j - Di): own error o_j = p_j d(dp_j) + b_j p_j |dp_j - Di| + 2u|ds_j|, shared
//     p_j dDi and cl |ds_j|.
//   dq_d = sum_j ds_j k_jd / sqrt(D): ind(o_j k_jd) + dDi |sum_j p_j k_jd| + cl |sum_j ds_j k_jd|,
//     all over sqrt(D), + reduction_tol(i + 1, ...) + 3u|dq_d| (the scale, the ref).
//   dk and dv sum over all (head, query) pairs of the group that see key j, G (T - j) terms whose
//     errors, shared ones included, are independent from pair to pair.
struct AttnShape {
  int64_t B, T, H, Hkv, D;
};

struct AttnTol {
  Vec out, lse, dqkv;
};

AttnTol attention_tol(const Floats& qkv, const Floats& dout, const Floats& lse_f, const AttnShape& s) {
  const int64_t T = s.T, H = s.H, Hkv = s.Hkv, D = s.D, G = H / Hkv, row = (H + 2 * Hkv) * D;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  AttnTol tol{Vec(s.B * T * H * D), Vec(s.B * H * T), Vec(s.B * T * row)};
  Vec sc(T), ds_err(T), a(T), p(T), b_own(T), dS(T), o_own(T);
  // Per key j and channel d of the current kv head: value, sum of squared terms, sum of squared
  // per-term error bounds.
  Vec dk_val(T * D), dk_sq(T * D), dk_err2(T * D), dv_val(T * D), dv_sq(T * D), dv_err2(T * D);
  for (int64_t b = 0; b < s.B; ++b) {
    auto at = [&](int64_t t, int64_t col) -> double { return qkv[(b * T + t) * row + col]; };
    for (int64_t g = 0; g < Hkv; ++g) {
      for (Vec* v : {&dk_val, &dk_sq, &dk_err2, &dv_val, &dv_sq, &dv_err2}) std::fill(v->begin(), v->end(), 0.0);
      const int64_t kc = (H + g) * D, vc = (H + Hkv + g) * D;
      for (int64_t h = g * G; h < (g + 1) * G; ++h) {
        const int64_t qc = h * D;
        for (int64_t i = 0; i < T; ++i) {
          double mx = -INFINITY;
          for (int64_t j = 0; j <= i; ++j) {
            double dot = 0.0, sq = 0.0;
            for (int64_t d = 0; d < D; ++d) {
              const double t = at(i, qc + d) * at(j, kc + d);
              dot += t;
              sq += t * t;
            }
            sc[j] = dot * scale;
            ds_err[j] = reduction_tol(D, sc[j], std::sqrt(sq) * scale) + 3 * kU * std::fabs(sc[j]);
            mx = std::max(mx, sc[j]);
          }
          double z = 0.0, z_sq = 0.0;
          for (int64_t j = 0; j <= i; ++j) {
            const double e = std::exp(sc[j] - mx);
            z += e;
            z_sq += e * e;
            a[j] = ds_err[j] + kU * (8 + (mx - sc[j]));
          }
          const double lse = mx + std::log(z);
          double pa2 = 0.0;
          for (int64_t j = 0; j <= i; ++j) {
            p[j] = std::exp(sc[j] - lse);
            pa2 += p[j] * a[j] * (p[j] * a[j]);
          }
          const double cz = independent_tol(pa2) + reduction_tol(i + 1, z, std::sqrt(z_sq)) / z;
          tol.lse[(b * H + h) * T + i] = cz + kU * (2 * std::fabs(std::log(z)) + 2 * std::fabs(lse)) + kTiny;

          const float* go = dout.data() + (b * T + i) * H * D + h * D;
          double Di = 0.0, Di_sq = 0.0, Di_abs = 0.0;
          for (int64_t d = 0; d < D; ++d) {
            double od = 0.0, sq_pv = 0.0, err2 = 0.0;
            for (int64_t j = 0; j <= i; ++j) {
              const double pv = p[j] * at(j, vc + d);
              od += pv;
              sq_pv += pv * pv;
              err2 += pv * a[j] * (pv * a[j]);
            }
            tol.out[(b * T + i) * H * D + h * D + d] = independent_tol(err2) + (cz + 2 * kU) * std::fabs(od) +
                                                       reduction_tol(i + 1, od, std::sqrt(sq_pv)) + kU * std::fabs(od) +
                                                       kTiny;
            Di += go[d] * od;
            Di_sq += (go[d] * od) * (go[d] * od);
            Di_abs += std::fabs(go[d] * od);
          }
          const double dDi = reduction_tol(D, Di, std::sqrt(Di_sq)) + kU * Di_abs;

          const double lse_in = lse_f[(b * H + h) * T + i], cl = kU * std::fabs(lse_in);
          for (int64_t j = 0; j <= i; ++j) {
            b_own[j] = ds_err[j] + kU * (std::fabs(sc[j] - lse_in) + 8);
            double dp = 0.0, dp_sq = 0.0;
            for (int64_t d = 0; d < D; ++d) {
              const double t = go[d] * at(j, vc + d);
              dp += t;
              dp_sq += t * t;
            }
            const double ddp = reduction_tol(D, dp, std::sqrt(dp_sq)) + kU * std::fabs(dp);
            dS[j] = p[j] * (dp - Di);
            o_own[j] = p[j] * ddp + b_own[j] * p[j] * std::fabs(dp - Di) + 2 * kU * std::fabs(dS[j]);
          }
          for (int64_t d = 0; d < D; ++d) {
            double dq = 0.0, dq_sq = 0.0, dq_err2 = 0.0, pk = 0.0;
            const double qd = at(i, qc + d), god = go[d];
            for (int64_t j = 0; j <= i; ++j) {
              const double kd = at(j, kc + d);
              const double t = scale * dS[j] * kd;
              dq += t;
              dq_sq += t * t;
              dq_err2 += o_own[j] * kd * (o_own[j] * kd);
              pk += p[j] * kd;
              const double tk = scale * dS[j] * qd, ek = scale * (o_own[j] + p[j] * dDi + cl * std::fabs(dS[j])) * qd;
              dk_val[j * D + d] += tk;
              dk_sq[j * D + d] += tk * tk;
              dk_err2[j * D + d] += ek * ek;
              const double tv = p[j] * god, ev = (b_own[j] + cl) * tv;
              dv_val[j * D + d] += tv;
              dv_sq[j * D + d] += tv * tv;
              dv_err2[j * D + d] += ev * ev;
            }
            tol.dqkv[(b * T + i) * row + qc + d] = scale * (independent_tol(dq_err2) + dDi * std::fabs(pk)) +
                                                   cl * std::fabs(dq) + reduction_tol(i + 1, dq, std::sqrt(dq_sq)) +
                                                   3 * kU * std::fabs(dq) + kTiny;
          }
        }
      }
      for (int64_t j = 0; j < T; ++j) {
        const int64_t n_terms = G * (T - j);
        for (int64_t d = 0; d < D; ++d) {
          const int64_t e = j * D + d;
          tol.dqkv[(b * T + j) * row + kc + d] = independent_tol(dk_err2[e]) +
                                                 reduction_tol(n_terms, dk_val[e], std::sqrt(dk_sq[e])) +
                                                 3 * kU * std::fabs(dk_val[e]) + kTiny;
          tol.dqkv[(b * T + j) * row + vc + d] = independent_tol(dv_err2[e]) +
                                                 reduction_tol(n_terms, dv_val[e], std::sqrt(dv_sq[e])) +
                                                 2 * kU * std::fabs(dv_val[e]) + kTiny;
        }
      }
    }
  }
  return tol;
}

// Both fp32 implementations: the sgemm tiles every CPU has, and the AVX-512 tiles where they run.
TEST_P(CpuVsRef, Attention) {
  struct Heads {
    int64_t H, Hkv;
  };
  for (const bool tiles : {false, true}) {
    if (tiles && !cpu::attention_tiles_available(false)) continue;
    const std::string name = tiles ? "attention tiles" : "attention sgemm";
    for (int64_t T : {1, 5, 67, 130}) {
      for (int64_t D : {8, 16, 64}) {
        for (const Heads& hh : {Heads{4, 4}, Heads{4, 2}, Heads{3, 1}}) {
          const AttnShape s{2, T, hh.H, hh.Hkv, D};
          SCOPED_TRACE(name + " T=" + std::to_string(T) + " D=" + std::to_string(D) + " H=" + std::to_string(s.H) +
                       " Hkv=" + std::to_string(s.Hkv));
          const int64_t n_qkv = s.B * T * (s.H + 2 * s.Hkv) * D, n_out = s.B * T * s.H * D, n_lse = s.B * s.H * T;
          const Floats qkv = randn(n_qkv, 150), dout = randn(n_out, 151);

          Floats ref_out(n_out), ref_lse(n_lse), ref_dqkv(n_qkv);
          ref::attention_forward(ref_out.data(), ref_lse.data(), qkv.data(), s.B, T, s.H, s.Hkv, D);
          ref::attention_backward(ref_dqkv.data(), dout.data(), qkv.data(), ref_out.data(), ref_lse.data(), s.B, T, s.H,
                                  s.Hkv, D);
          const AttnTol tol = attention_tol(qkv, dout, ref_lse, s);

          // Workspace and outputs start as NaN: nothing the kernels leave unwritten may be read.
          const int64_t ws = tiles ? cpu::attention_tiles_workspace_floats(false, T, D, num_threads())
                                   : cpu::attention_sgemm_workspace_floats(T, D, num_threads());
          const auto got = run_twice(name, [&] {
            Floats out = nans(n_out), lse = nans(n_lse), dqkv = nans(n_qkv), workspace = nans(ws);
            // The backward is fed the ref's forward results so that its error is measured alone.
            if (tiles) {
              cpu::attention_forward_tiles(false, out.data(), lse.data(), qkv.data(), s.B, T, s.H, s.Hkv, D,
                                           workspace.data());
              cpu::attention_backward_tiles(false, dqkv.data(), dout.data(), qkv.data(), ref_out.data(), ref_lse.data(),
                                            s.B, T, s.H, s.Hkv, D, workspace.data());
            } else {
              cpu::attention_forward_sgemm(out.data(), lse.data(), qkv.data(), s.B, T, s.H, s.Hkv, D, workspace.data());
              cpu::attention_backward_sgemm(dqkv.data(), dout.data(), qkv.data(), ref_out.data(), ref_lse.data(), s.B,
                                            T, s.H, s.Hkv, D, workspace.data());
            }
            return std::vector<Floats>{out, lse, dqkv};
          });
          expect_within(name + " out", got[0], ref_out, tol.out);
          expect_within(name + " lse", got[1], ref_lse, tol.lse);
          expect_within(name + " dqkv", got[2], ref_dqkv, tol.dqkv);
        }
      }
    }
  }
}

// The bf16 variant against the same fp32 reference, with the CUDA bf16 variant's bounds
// (kernels/cuda/attention_test.cc, Bf16MatchesRef, where they are derived): operands rounded to
// bf16 (relative 2^-9) move scores by ~4e-3, lse as much, out ~1e-2, the gradients a few times
// that; a wrong mask, head, scale or padding errs by order one. Workspace and outputs start as NaN,
// so a padding the packing leaves unwritten (0 x NaN is NaN) fails. The ragged sizes (T 67, 130,
// 257; D 8 and 24, not multiples of the 16 lanes) exercise every edge of the tiles.
TEST_P(CpuVsRef, AttentionBf16) {
  if (!cpu::attention_tiles_available(true)) GTEST_SKIP() << "no avx512_bf16 on this CPU";
  struct Heads {
    int64_t H, Hkv;
  };
  for (int64_t T : {1, 5, 67, 130, 257}) {
    for (int64_t D : {8, 24, 64, 128}) {
      for (const Heads& hh : {Heads{4, 4}, Heads{4, 2}, Heads{3, 1}}) {
        const AttnShape s{2, T, hh.H, hh.Hkv, D};
        SCOPED_TRACE("T=" + std::to_string(T) + " D=" + std::to_string(D) + " H=" + std::to_string(s.H) +
                     " Hkv=" + std::to_string(s.Hkv));
        const int64_t n_qkv = s.B * T * (s.H + 2 * s.Hkv) * D, n_out = s.B * T * s.H * D, n_lse = s.B * s.H * T;
        const Floats qkv = randn(n_qkv, 152), dout = randn(n_out, 153);
        Floats ref_out(n_out), ref_lse(n_lse), ref_dqkv(n_qkv);
        ref::attention_forward(ref_out.data(), ref_lse.data(), qkv.data(), s.B, T, s.H, s.Hkv, D);
        ref::attention_backward(ref_dqkv.data(), dout.data(), qkv.data(), ref_out.data(), ref_lse.data(), s.B, T, s.H,
                                s.Hkv, D);
        const int64_t ws = cpu::attention_tiles_workspace_floats(true, T, D, num_threads());
        const auto got = run_twice("attention bf16", [&] {
          Floats out = nans(n_out), lse = nans(n_lse), dqkv = nans(n_qkv), workspace = nans(ws);
          cpu::attention_forward_tiles(true, out.data(), lse.data(), qkv.data(), s.B, T, s.H, s.Hkv, D,
                                       workspace.data());
          cpu::attention_backward_tiles(true, dqkv.data(), dout.data(), qkv.data(), ref_out.data(), ref_lse.data(), s.B,
                                        T, s.H, s.Hkv, D, workspace.data());
          return std::vector<Floats>{out, lse, dqkv};
        });
        auto bound = [](const Floats& want, double tol) {
          Vec v(want.size());
          for (size_t i = 0; i < want.size(); ++i) v[i] = tol + tol * std::fabs(want[i]);
          return v;
        };
        expect_within("attention bf16 out", got[0], ref_out, bound(ref_out, 2e-2));
        expect_within("attention bf16 lse", got[1], ref_lse, bound(ref_lse, 2e-2));
        expect_within("attention bf16 dqkv", got[2], ref_dqkv, bound(ref_dqkv, 5e-2));
      }
    }
  }
}

// The cached kernel in two calls per sequence (a prompt, then the rest, at different splits per
// sequence), against the ref's whole-sequence forward, within the forward's tolerance above: the
// same sums in the same kind of order. Cache rows not yet written are NaN, so reading past a
// sequence's length (an off-by-one in the causal bound) fails.
TEST_P(CpuVsRef, AttentionCached) {
  struct Heads {
    int64_t H, Hkv;
  };
  for (int64_t T : {1, 5, 67, 130}) {
    for (int64_t D : {8, 64}) {
      for (const Heads& hh : {Heads{4, 4}, Heads{4, 2}, Heads{3, 1}}) {
        const AttnShape s{2, T, hh.H, hh.Hkv, D};
        SCOPED_TRACE("T=" + std::to_string(T) + " D=" + std::to_string(D) + " H=" + std::to_string(s.H) +
                     " Hkv=" + std::to_string(s.Hkv));
        const int64_t row = (s.H + 2 * s.Hkv) * D, kv = s.Hkv * D, n_out = s.B * T * s.H * D, Tc = T + 3;
        const Floats qkv = randn(s.B * T * row, 152), dout = randn(n_out, 153);
        Floats ref_out(n_out), ref_lse(s.B * s.H * T);
        ref::attention_forward(ref_out.data(), ref_lse.data(), qkv.data(), s.B, T, s.H, s.Hkv, D);
        const AttnTol tol = attention_tol(qkv, dout, ref_lse, s);

        const int64_t split[2] = {T / 2, T / 3};
        const auto got = run_twice("attention cached", [&] {
          Floats out = nans(n_out), k = nans(s.B * Tc * kv), v = nans(s.B * Tc * kv),
                 ws = nans(cpu::attention_cached_workspace_floats(Tc, num_threads()));
          Floats q(s.B * T * s.H * D);
          auto fill = [&](int64_t b, int64_t t0, int64_t t1) {  // cache rows [t0, t1) of sequence b
            for (int64_t t = t0; t < t1; ++t) {
              const float* r = qkv.data() + (b * T + t) * row;
              std::copy(r + s.H * D, r + s.H * D + kv, k.data() + (b * Tc + t) * kv);
              std::copy(r + s.H * D + kv, r + row, v.data() + (b * Tc + t) * kv);
            }
          };
          auto run = [&](const int64_t* from, const int64_t* to) {
            int64_t rows[3] = {0, 0, 0};
            for (int64_t b = 0; b < s.B; ++b) {
              fill(b, from[b], to[b]);
              for (int64_t t = from[b]; t < to[b]; ++t) {
                const float* r = qkv.data() + (b * T + t) * row;
                std::copy(r, r + s.H * D, q.data() + (rows[b] + t - from[b]) * s.H * D);
              }
              rows[b + 1] = rows[b] + to[b] - from[b];
            }
            Floats part(rows[s.B] * s.H * D);
            cpu::attention_cached(part.data(), q.data(), s.H * D, k.data(), v.data(), kv, Tc, rows, from, s.B, s.H,
                                  s.Hkv, D, ws.data());
            for (int64_t b = 0; b < s.B; ++b) {
              std::copy(part.begin() + rows[b] * s.H * D, part.begin() + rows[b + 1] * s.H * D,
                        out.begin() + (b * T + from[b]) * s.H * D);
            }
          };
          const int64_t zero[2] = {0, 0}, end[2] = {T, T};
          run(zero, split);
          run(split, end);
          return std::vector<Floats>{out};
        });
        expect_within("attention cached out", got[0], ref_out, tol.out);
      }
    }
  }
}

// ---- SwiGLU ----
// s = 1/(1 + exp(-a)) has relative error 8u (exp) + 2u; out = a s b two roundings more, the ref
// one. db = dout a s likewise. For da = dout b s (1 + a (1 - s)), the factor F = 1 + a(1 - s)
// errs by |a| (u + 10u s) + u|a(1-s)| + u|F| <= u (12|a| + 1) + 2u|F| relative to |dout b s|;
// all told da is within u (16|da| + |dout b s| (12|a| + 1)).
TEST_P(CpuVsRef, Swiglu) {
  for (int64_t n : {1, 7, 33}) {
    for (int64_t F : {1, 7, 33, 130, 1408}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " F=" + std::to_string(F));
      Floats h13 = randn(n * 2 * F, 160, 3.0);
      // Gates deep in both tails, including where exp(-a) overflows float.
      const float tails[] = {-100.0f, -30.0f, 20.0f, 95.0f};
      for (int64_t k = 0; k < 4 && k < n * F; ++k) h13[(k % n) * 2 * F + (k * 5) % F] = tails[k];
      const Floats dout = randn(n * F, 161);

      Floats ref_out(n * F), ref_dh13(n * 2 * F);
      ref::swiglu_forward(ref_out.data(), h13.data(), n, F);
      ref::swiglu_backward(ref_dh13.data(), dout.data(), h13.data(), n, F);
      const auto got = run_twice("swiglu", [&] {
        Floats out = nans(n * F), dh13 = nans(n * 2 * F);
        cpu::swiglu_forward(out.data(), h13.data(), n, F);
        cpu::swiglu_backward(dh13.data(), dout.data(), h13.data(), n, F);
        return std::vector<Floats>{out, dh13};
      });
      Vec tol_out(n * F), tol_d(n * 2 * F);
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t f = 0; f < F; ++f) {
          const double a = h13[i * 2 * F + f], b = h13[i * 2 * F + F + f], g = dout[i * F + f];
          const double sig = 1.0 / (1.0 + std::exp(-a));
          tol_out[i * F + f] = 13 * kU * std::fabs(ref_out[i * F + f]) + kTiny;
          tol_d[i * 2 * F + F + f] = 13 * kU * std::fabs(ref_dh13[i * 2 * F + F + f]) + kTiny;
          tol_d[i * 2 * F + f] =
              kU * (16 * std::fabs(ref_dh13[i * 2 * F + f]) + std::fabs(g * b * sig) * (12 * std::fabs(a) + 1)) + kTiny;
        }
      }
      expect_within("swiglu out", got[0], ref_out, tol_out);
      expect_within("swiglu dh13", got[1], ref_dh13, tol_d);
      // The bf16 outputs are the fp32 ones rounded, bit for bit.
      std::vector<uint16_t> out16(n * F, 0xffff), dh16(n * 2 * F, 0xffff);
      cpu::swiglu_forward_bf16(out16.data(), h13.data(), n, F);
      cpu::swiglu_backward_bf16(dh16.data(), dout.data(), h13.data(), n, F);
      for (int64_t i = 0; i < n * F; ++i) ASSERT_EQ(out16[i], f32_to_bf16(got[0][i])) << "out element " << i;
      for (int64_t i = 0; i < n * 2 * F; ++i) ASSERT_EQ(dh16[i], f32_to_bf16(got[1][i])) << "dh13 element " << i;
    }
  }
}

// ---- Cross-entropy ----
// z = sum_j exp(l_j - max): relative error ez = reduction_tol(V, z, ||exp||) / z + u (8 +
// max|l_j - max|) (the sum, exp, the shift's rounding). loss = (log z + max) - l_t: ez + 2u|log z|
// (log) + u|log z + max| + u|loss| + the ref's u|loss|. dlogits_j = exp(l_j - max) (dscale / z) -
// [j = t] dscale: dscale p_j (ez + u (10 + |l_j - max|)) + 2u|d_j|. Ignored rows are exact zeros.
TEST_P(CpuVsRef, CrossEntropy) {
  const float dscale = 0.37f;
  for (int64_t n : {1, 7, 33}) {
    for (int64_t V : {1, 7, 33, 130, 1031}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " V=" + std::to_string(V));
      Floats logits = randn(n * V, 170, 3.0);
      for (int64_t j = 0; j < V; ++j) logits[j] += 60.0f;  // a far-from-zero row: the max shift matters
      std::vector<int32_t> targets(n);
      for (int64_t i = 0; i < n; ++i) {
        targets[i] = i % 4 == 3 ? -1 : static_cast<int32_t>(rng::bits(kSeed, 171, i) % V);
      }

      Floats ref_losses(n), ref_d(n * V);
      ref::softmax_cross_entropy(ref_d.data(), ref_losses.data(), logits.data(), targets.data(), n, V, dscale);
      const auto got = run_twice("cross_entropy", [&] {
        Floats losses = nans(n), d = nans(n * V), losses_only = nans(n), in_place = logits, losses_in_place = nans(n);
        cpu::softmax_cross_entropy(d.data(), losses.data(), logits.data(), targets.data(), n, V, dscale);
        cpu::softmax_cross_entropy(nullptr, losses_only.data(), logits.data(), targets.data(), n, V, dscale);
        cpu::softmax_cross_entropy(in_place.data(), losses_in_place.data(), in_place.data(), targets.data(), n, V,
                                   dscale);
        return std::vector<Floats>{losses, d, losses_only, in_place, losses_in_place};
      });
      // The bf16 gradient is the fp32 one rounded, bit for bit; the losses are the same.
      std::vector<uint16_t> d16(n * V, 0xffff);
      Floats losses16 = nans(n);
      cpu::softmax_cross_entropy_bf16(d16.data(), losses16.data(), logits.data(), targets.data(), n, V, dscale);
      EXPECT_EQ(losses16, got[0]);
      for (int64_t i = 0; i < n * V; ++i) ASSERT_EQ(d16[i], f32_to_bf16(got[1][i])) << "element " << i;
      Vec tol_loss(n, 0.0), tol_d(n * V, 0.0);
      for (int64_t i = 0; i < n; ++i) {
        if (targets[i] < 0) continue;
        const float* l = logits.data() + i * V;
        const double mx = *std::max_element(l, l + V);
        double z = 0.0, z_sq = 0.0, shift = 0.0;
        for (int64_t j = 0; j < V; ++j) {
          const double e = std::exp(l[j] - mx);
          z += e;
          z_sq += e * e;
          shift = std::max(shift, mx - l[j]);
        }
        const double ez = reduction_tol(V, z, std::sqrt(z_sq)) / z + kU * (8 + shift);
        const double loss = std::log(z) + mx - l[targets[i]];
        tol_loss[i] =
            ez + kU * (2 * std::fabs(std::log(z)) + std::fabs(std::log(z) + mx) + 2 * std::fabs(loss)) + kTiny;
        for (int64_t j = 0; j < V; ++j) {
          const double p = std::exp(l[j] - mx) / z;
          tol_d[i * V + j] = dscale * p * (ez + kU * (10 + (mx - l[j]))) + 2 * kU * std::fabs(ref_d[i * V + j]) + kTiny;
        }
      }
      expect_within("cross_entropy losses", got[0], ref_losses, tol_loss);
      expect_within("cross_entropy dlogits", got[1], ref_d, tol_d);
      expect_bitwise("cross_entropy losses without dlogits", got[2], got[0]);
      expect_bitwise("cross_entropy dlogits in place", got[3], got[1]);
      expect_bitwise("cross_entropy losses in place", got[4], got[0]);
    }
  }
}

// ---- AdamW ----
// In float: m = b1 m0 + (1-b1) g errs by 3u (|b1 m0| + |(1-b1) g|) counting the ref's rounding,
// v = b2 v0 + (1-b2) g^2 by 5u of its size. A = sqrt(v / bc2) has relative error dv/(2v) + 3u
// (sqrt, the rounded 1/sqrt(bc2), the product) and denom = A + eps adds u. The update U =
// (lr/bc1) m / denom errs by |U| (3u + d(denom)/denom) + (lr/bc1) dm / denom; the decayed
// parameter by 3u |p0 (1 - lr wd)| (the float decay factor and product); the final subtraction
// and the ref's rounding by 2u |p|. Both scale the gradient by grad_scale in float first (the
// same product), so g below is the scaled gradient. The bf16 image the cpu kernel writes in the
// same pass is its own parameters rounded, bit for bit.
TEST_P(CpuVsRef, AdamW) {
  for (int64_t n : {1, 7, 33, 1030}) {
    for (int64_t step : {1, 7}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " step=" + std::to_string(step));
      AdamWParams hp;
      hp.lr = 1e-2f;
      hp.weight_decay = 0.1f;
      hp.step = step;
      hp.grad_scale = step == 1 ? 1.0f : 0.37f;
      const Floats p0 = randn(n, 180), raw_g = randn(n, 181, 1e-2);
      Floats g(n);
      for (int64_t i = 0; i < n; ++i) g[i] = raw_g[i] * hp.grad_scale;
      Floats m0(n, 0.0f), v0(n, 0.0f);
      if (step > 1) {
        m0 = randn(n, 182, 1e-2);
        v0 = squared(randn(n, 183, 1e-2));
      }
      Floats ref_p = p0, ref_m = m0, ref_v = v0;
      ref::adamw_step(ref_p.data(), raw_g.data(), ref_m.data(), ref_v.data(), n, hp);
      const auto got = run_twice("adamw", [&] {
        Floats p = p0, m = m0, v = v0;
        cpu::adamw_step(p.data(), raw_g.data(), m.data(), v.data(), n, hp);
        return std::vector<Floats>{p, m, v};
      });
      Floats p1 = p0, m1 = m0, v1 = v0;
      std::vector<uint16_t> image(n, 0xffff);
      cpu::adamw_step(p1.data(), raw_g.data(), m1.data(), v1.data(), n, hp, image.data());
      EXPECT_EQ(p1, got[0]);  // writing the image changes nothing else
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(image[i], f32_to_bf16(p1[i])) << "image element " << i;
      const double b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr, eps = hp.eps;
      const double bc1 = 1 - std::pow(b1, static_cast<double>(step)), bc2 = 1 - std::pow(b2, static_cast<double>(step));
      Vec tol_p(n), tol_m(n), tol_v(n);
      for (int64_t i = 0; i < n; ++i) {
        const double gi = g[i], m = b1 * m0[i] + (1 - b1) * gi, v = b2 * v0[i] + (1 - b2) * gi * gi;
        tol_m[i] = 3 * kU * (std::fabs(b1 * m0[i]) + std::fabs((1 - b1) * gi)) + kTiny;
        tol_v[i] = 5 * kU * v + kTiny;
        const double A = std::sqrt(v / bc2), denom = A + eps, U = lr / bc1 * m / denom;
        const double d_denom = A * (tol_v[i] / (2 * v) + 3 * kU) + kU * denom;
        const double dU = std::fabs(U) * (3 * kU + d_denom / denom) + lr / bc1 * tol_m[i] / denom;
        tol_p[i] = 3 * kU * std::fabs(p0[i] * (1 - lr * hp.weight_decay)) + dU + 2 * kU * std::fabs(ref_p[i]) + kTiny;
      }
      expect_within("adamw param", got[0], ref_p, tol_p);
      expect_within("adamw m", got[1], ref_m, tol_m);
      expect_within("adamw v", got[2], ref_v, tol_v);
    }
  }
}

// A unit in one pass over its segments: each element bitwise as adamw_step steps it alone with the
// segment's weight decay (or none), the image too; empty segments, one at the end too, change nothing.
TEST_P(CpuVsRef, AdamWUnitInOnePass) {
  const AdamWSegment segments[] = {{5, false}, {5, true}, {700, true}, {701, false}, {1030, true}, {1030, false}};
  const int64_t n = 1030;
  AdamWParams hp;
  hp.lr = 1e-2f;
  hp.weight_decay = 0.1f;
  hp.step = 3;
  hp.grad_scale = 0.37f;
  const Floats p0 = randn(n, 190), g = randn(n, 191, 1e-2), m0 = randn(n, 192, 1e-2), v0 = squared(randn(n, 193, 1e-2));
  Floats p = p0, m = m0, v = v0;
  std::vector<uint16_t> image(n);
  cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), segments, 6, hp, image.data());
  Floats want_p = p0, want_m = m0, want_v = v0;
  std::vector<uint16_t> want_image(n);
  int64_t begin = 0;
  for (const AdamWSegment& s : segments) {
    AdamWParams sp = hp;
    sp.weight_decay = s.decay ? hp.weight_decay : 0.0f;
    cpu::adamw_step(want_p.data() + begin, g.data() + begin, want_m.data() + begin, want_v.data() + begin,
                    s.end - begin, sp, want_image.data() + begin);
    begin = s.end;
  }
  EXPECT_EQ(p, want_p);
  EXPECT_EQ(m, want_m);
  EXPECT_EQ(v, want_v);
  EXPECT_EQ(image, want_image);
}

// ---- Elementwise helpers ----
// Sums and products of two floats are correctly rounded whether formed in float or, as the ref
// does, in double and rounded once (53 >= 2 * 24 + 2 bits), so add and scale match bitwise.
// sum_squares accumulates exact squares in double in any order: each of ref and cpu is within
// (n - 1) 2^-53 of the exact sum, so they agree within 2 n 2^-53 sum.
TEST_P(CpuVsRef, Vector) {
  // 1,100,003 spans more than 256 blocks of 4096, past the cpu kernel's first outer batch.
  for (int64_t n : {1, 7, 33, 130, 4097, 1100003}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const Floats x = randn(n, 190), y0 = randn(n, 191);
    const float s = 0.7310586f;
    Floats ref_y = y0, ref_x = x;
    ref::add_inplace(ref_y.data(), x.data(), n);
    ref::scale_inplace(ref_x.data(), n, s);
    const auto got = run_twice("vector", [&] {
      Floats y = y0, xs = x;
      cpu::add_inplace(y.data(), x.data(), n);
      cpu::scale_inplace(xs.data(), n, s);
      return std::vector<Floats>{y, xs};
    });
    expect_bitwise("add_inplace", got[0], ref_y);
    expect_bitwise("scale_inplace", got[1], ref_x);
    const double ref_ss = ref::sum_squares(x.data(), n), ss = cpu::sum_squares(x.data(), n);
    EXPECT_EQ(ss, cpu::sum_squares(x.data(), n)) << "sum_squares rerun";
    EXPECT_NEAR(ss, ref_ss, 2.0 * n * 0x1.0p-53 * ref_ss);
  }
}

// Zero rows (an empty batch, a rank with no tokens) must be a no-op, not a fault: outputs that
// accumulate keep their values.
TEST_P(CpuVsRef, EmptyInputs) {
  const int64_t C = 7, V = 5, N = 3, K = 4;
  Floats table = randn(V * C, 200), w = randn(C, 201), dw = randn(C, 202), lw = randn(N * K, 203),
         ldw = randn(N * K, 204);
  const Floats dw0 = dw, ldw0 = ldw;
  float none = 0.0f;
  cpu::embedding_forward(&none, nullptr, table.data(), 0, C);
  cpu::embedding_backward(table.data(), &none, nullptr, 0, C);
  cpu::rms_norm_forward(&none, &none, &none, w.data(), 0, C, 1e-5f);
  cpu::rms_norm_backward(&none, dw.data(), &none, &none, w.data(), &none, 0, C);
  cpu::linear_forward(&none, &none, lw.data(), 0, N, K);
  cpu::linear_backward(&none, ldw.data(), &none, &none, lw.data(), 0, N, K, false);
  const uint16_t none16 = 0;
  const Halves lw16 = round_bf16(lw);
  cpu::linear_forward_bf16(&none, &none16, lw16.data(), 0, N, K);
  cpu::linear_backward_bf16(&none, ldw.data(), &none16, &none16, lw16.data(), 0, N, K, false);
  cpu::embedding_forward_bf16(&none, nullptr, &none16, 0, C);
  cpu::swiglu_forward(&none, &none, 0, C);
  cpu::swiglu_backward(&none, &none, &none, 0, C);
  cpu::softmax_cross_entropy(&none, &none, &none, nullptr, 0, V, 1.0f);
  cpu::adamw_step(&none, &none, &none, &none, 0, AdamWParams{});
  cpu::add_inplace(&none, &none, 0);
  cpu::scale_inplace(&none, 0, 2.0f);
  EXPECT_EQ(cpu::sum_squares(&none, 0), 0.0);
  const int64_t ws = cpu::attention_workspace_floats(5, 8, num_threads());  // fits every implementation
  Floats workspace = nans(std::max<int64_t>(ws, 1));
  cpu::attention_forward_sgemm(&none, &none, &none, 0, 5, 2, 1, 8, workspace.data());
  cpu::attention_backward_sgemm(&none, &none, &none, &none, &none, 0, 5, 2, 1, 8, workspace.data());
  for (const bool bf16 : {false, true}) {
    if (!cpu::attention_tiles_available(bf16)) continue;
    cpu::attention_forward_tiles(bf16, &none, &none, &none, 0, 5, 2, 1, 8, workspace.data());
    cpu::attention_backward_tiles(bf16, &none, &none, &none, &none, &none, 0, 5, 2, 1, 8, workspace.data());
  }
  Floats rope_table(5 * 8);
  cpu::rope_table(rope_table.data(), 5, 8, 10000.0f);
  cpu::rope_forward(&none, rope_table.data(), 0, 5, 2, 8, 16);
  cpu::rope_backward(&none, rope_table.data(), 0, 5, 2, 8, 16);
  expect_bitwise("rms_norm dweight after no rows", dw, dw0);
  expect_bitwise("linear dw after no rows", ldw, ldw0);
  EXPECT_EQ(none, 0.0f);
}

}  // namespace
}  // namespace tessera::kernels
