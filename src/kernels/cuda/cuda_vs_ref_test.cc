// CUDA kernels against their ref twins (kernels/ref) on random inputs of odd sizes, and AdamW
// bit for bit against the CPU kernel. Every test needs a device and reports itself skipped
// without one (CI); scripts/gpu_check.sh runs them on a GPU machine.
//
// Tolerances: a float sum of K terms errs by about u sqrt(K) times the terms' size (u = 2^-24,
// rounding errors behaving as independent; kernels/cpu/cpu_vs_ref_test.cc derives it), expf and
// logf by 2 ulp (CUDA's documented bounds), and the ref is exact to double. The bounds below
// allow tens of u sqrt(K) at the sizes used: far under what a wrong index, a lost term or a
// wrong scale gives (errors of order one).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/bf16.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/swiglu.h"
#include "kernels/cuda/test_util.h"
#include "kernels/cuda/vector.h"
#include "kernels/ref/adamw.h"
#include "kernels/ref/cross_entropy.h"
#include "kernels/ref/embedding.h"
#include "kernels/ref/matmul.h"
#include "kernels/ref/rms_norm.h"
#include "kernels/ref/rope.h"
#include "kernels/ref/swiglu.h"
#include "kernels/ref/vector.h"

namespace tessera::kernels::cuda {
namespace {

using testing::all_close;
using testing::DeviceBuffer;
using testing::random_floats;

std::vector<float> widen(const std::vector<uint16_t>& h) {
  std::vector<float> out(h.size());
  bf16_to_f32(h.data(), out.data(), static_cast<int64_t>(h.size()));
  return out;
}

std::vector<uint16_t> round_bf16(const std::vector<float>& f) {
  std::vector<uint16_t> out(f.size());
  f32_to_bf16(f.data(), out.data(), static_cast<int64_t>(f.size()));
  return out;
}

TEST(CudaVsRef, Vector) {
  REQUIRE_CUDA_DEVICE();
  const int64_t n = 100003;
  const auto x = random_floats(n, 1), y = random_floats(n, 2);
  DeviceBuffer<float> dx(x), dy(y);
  add_inplace(dy.get(), dx.get(), n, nullptr);
  auto want = y;
  ref::add_inplace(want.data(), x.data(), n);
  EXPECT_TRUE(all_close(dy.download(), want, 0.0f, 0.0f));  // one rounded add: exact

  scale_inplace(dy.get(), n, 0.37f, nullptr);
  ref::scale_inplace(want.data(), n, 0.37f);
  EXPECT_TRUE(all_close(dy.download(), want, 0.0f, 0.0f));

  DeviceBuffer<uint16_t> h(n);
  to_bf16(h.get(), dx.get(), n, nullptr);
  EXPECT_EQ(h.download(), round_bf16(x));  // core/bf16.h's bits, NaN rule aside

  DeviceBuffer<double> total(1), ws(sum_squares_workspace_doubles());
  sum_squares(total.get(), dx.get(), n, ws.get(), nullptr);
  const double got = total.download()[0], ref_sum = ref::sum_squares(x.data(), n);
  EXPECT_NEAR(got, ref_sum, 1e-12 * ref_sum);  // double sums of float squares
  sum_squares(total.get(), dx.get(), n, ws.get(), nullptr);
  EXPECT_EQ(total.download()[0], got) << "the same sum twice must give the same bits";
}

TEST(CudaVsRef, SwiGLU) {
  REQUIRE_CUDA_DEVICE();
  const int64_t n = 37, F = 129;
  const auto h13 = random_floats(n * 2 * F, 3, 2.0f), dout = random_floats(n * F, 4);
  DeviceBuffer<float> dh13_in(h13), dd(dout), out(n * F), dh13(n * 2 * F);
  swiglu_forward(out.get(), dh13_in.get(), n, F, nullptr);
  swiglu_backward(dh13.get(), dd.get(), dh13_in.get(), n, F, nullptr);
  std::vector<float> want_out(n * F), want_dh13(n * 2 * F);
  ref::swiglu_forward(want_out.data(), h13.data(), n, F);
  ref::swiglu_backward(want_dh13.data(), dout.data(), h13.data(), n, F);
  // A handful of rounded operations and one expf each: ~10 u relative.
  EXPECT_TRUE(all_close(out.download(), want_out, 1e-6f, 1e-5f));
  EXPECT_TRUE(all_close(dh13.download(), want_dh13, 1e-6f, 1e-5f));
  // The bf16 outputs are the fp32 ones rounded, bit for bit.
  DeviceBuffer<uint16_t> out16(n * F), dh16(n * 2 * F);
  swiglu_forward_bf16(out16.get(), dh13_in.get(), n, F, nullptr);
  swiglu_backward_bf16(dh16.get(), dd.get(), dh13_in.get(), n, F, nullptr);
  EXPECT_EQ(out16.download(), round_bf16(out.download()));
  EXPECT_EQ(dh16.download(), round_bf16(dh13.download()));
}

TEST(CudaVsRef, Rope) {
  REQUIRE_CUDA_DEVICE();
  const int64_t B = 2, T = 33, H = 3, Hkv = 1, D = 16, stride = (H + 2 * Hkv) * D;
  const float theta = 10000.0f;
  const auto x = random_floats(B * T * stride, 5);
  std::vector<float> table(T * D);
  cpu::rope_table(table.data(), T, D, theta);
  DeviceBuffer<float> dx(x), dtable(table);
  rope_forward(dx.get(), dtable.get(), B, T, H, D, stride, nullptr);
  auto want = x;
  ref::rope_forward(want.data(), B, T, H, D, stride, theta);
  EXPECT_TRUE(all_close(dx.download(), want, 1e-6f, 1e-5f));  // the table's float cos/sin: a few u
  // Backward undoes forward (the rotation's transpose is its inverse).
  rope_backward(dx.get(), dtable.get(), B, T, H, D, stride, nullptr);
  EXPECT_TRUE(all_close(dx.download(), x, 1e-5f, 1e-5f));
}

TEST(CudaVsRef, RmsNorm) {
  REQUIRE_CUDA_DEVICE();
  for (const auto& [n, C] : {std::pair<int64_t, int64_t>{1, 64}, {37, 515}, {1000, 256}}) {
    SCOPED_TRACE("n=" + std::to_string(n) + " C=" + std::to_string(C));
    const auto x = random_floats(n * C, 6), w = random_floats(C, 7), dout = random_floats(n * C, 8);
    const auto dx0 = random_floats(n * C, 9), dw0 = random_floats(C, 10);
    DeviceBuffer<float> dx_in(x), dw(w), dd(dout), out(n * C), rstd(n), ddx(dx0), ddw(dw0);
    DeviceBuffer<float> ws(rms_norm_backward_workspace_floats(n, C));
    rms_norm_forward(out.get(), rstd.get(), dx_in.get(), dw.get(), n, C, 1e-5f, nullptr);
    rms_norm_backward(ddx.get(), ddw.get(), dd.get(), dx_in.get(), dw.get(), rstd.get(), n, C, ws.get(), nullptr);
    std::vector<float> want_out(n * C), want_rstd(n);
    auto want_dx = dx0, want_dw = dw0;
    ref::rms_norm_forward(want_out.data(), want_rstd.data(), x.data(), w.data(), n, C, 1e-5f);
    ref::rms_norm_backward(want_dx.data(), want_dw.data(), dout.data(), x.data(), w.data(), rstd.download().data(), n,
                           C);
    EXPECT_TRUE(all_close(rstd.download(), want_rstd, 0.0f, 1e-5f));
    EXPECT_TRUE(all_close(out.download(), want_out, 1e-6f, 1e-5f));
    // The bf16 output is the fp32 one rounded, bit for bit, beside the same rstd.
    DeviceBuffer<uint16_t> out16(n * C);
    DeviceBuffer<float> rstd16(n);
    rms_norm_forward_bf16(out16.get(), rstd16.get(), dx_in.get(), dw.get(), n, C, 1e-5f, nullptr);
    EXPECT_EQ(out16.download(), round_bf16(out.download()));
    EXPECT_EQ(rstd16.download(), rstd.download());
    EXPECT_TRUE(all_close(ddx.download(), want_dx, 1e-5f, 1e-4f));
    // The weight gradient sums n terms of size ~1: u sqrt(n) ~ 2e-6 at n = 1000.
    EXPECT_TRUE(all_close(ddw.download(), want_dw, 1e-4f, 1e-4f));
    // Bitwise the same a second time (no atomics).
    const auto first = ddw.download();
    ddw.upload(dw0);
    rms_norm_backward(ddx.get(), ddw.get(), dd.get(), dx_in.get(), dw.get(), rstd.get(), n, C, ws.get(), nullptr);
    EXPECT_EQ(ddw.download(), first);
  }
}

TEST(CudaVsRef, Embedding) {
  REQUIRE_CUDA_DEVICE();
  const int64_t n = 300, C = 70, V = 50;
  std::vector<int32_t> tokens(n);
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>((i * 7919 + i * i) % V);  // repeats
  const auto table = random_floats(V * C, 11), dout = random_floats(n * C, 12), dtable0 = random_floats(V * C, 13);
  // The whole vocabulary, and a block of it (tensor parallelism: tokens outside give zero rows).
  for (const auto& [v0, Vb] : {std::pair<int64_t, int64_t>{0, V}, {20, 17}}) {
    SCOPED_TRACE("v0=" + std::to_string(v0) + " Vb=" + std::to_string(Vb));
    const std::vector<float> block(table.begin() + v0 * C, table.begin() + (v0 + Vb) * C);
    const std::vector<float> dblock0(dtable0.begin() + v0 * C, dtable0.begin() + (v0 + Vb) * C);
    DeviceBuffer<int32_t> dtok(tokens);
    DeviceBuffer<float> dtab(block), dd(dout), out(n * C), dgrad(dblock0);
    embedding_forward(out.get(), dtok.get(), dtab.get(), n, C, v0, Vb, nullptr);
    std::vector<float> want(n * C);
    ref::embedding_forward(want.data(), tokens.data(), block.data(), n, C, v0, Vb);
    EXPECT_TRUE(all_close(out.download(), want, 0.0f, 0.0f));  // a copy

    const EmbeddingBuckets buckets = embedding_buckets(tokens.data(), n, v0, Vb);
    DeviceBuffer<int32_t> ints(buckets.ints);
    embedding_backward(dgrad.get(), dd.get(), ints.get(), buckets, C, nullptr);
    auto want_grad = dblock0;
    ref::embedding_backward(want_grad.data(), dout.data(), tokens.data(), n, C, v0, Vb);
    EXPECT_TRUE(all_close(dgrad.download(), want_grad, 1e-5f, 1e-5f));  // sums of ~n/V terms
  }
}

TEST(CudaVsRef, CrossEntropy) {
  REQUIRE_CUDA_DEVICE();
  const int64_t n = 9, V = 32003;
  const auto logits = random_floats(n * V, 14, 3.0f);
  std::vector<int32_t> targets(n);
  for (int64_t i = 0; i < n; ++i) targets[i] = static_cast<int32_t>((i * 4099) % V);
  targets[4] = -1;     // ignored
  targets[7] = V - 1;  // the last column
  const float dscale = 1.0f / 8;
  std::vector<float> want_loss(n), want_grad(n * V);
  ref::softmax_cross_entropy(want_grad.data(), want_loss.data(), logits.data(), targets.data(), n, V, dscale);

  DeviceBuffer<int32_t> dt(targets);
  DeviceBuffer<float> dz(logits), loss(n);
  // Loss alone, then the gradient in place over the logits (the model's use).
  softmax_cross_entropy(nullptr, loss.get(), dz.get(), dt.get(), n, V, dscale, nullptr);
  // The loss is log(sum of V exps) + max - target: a sum of 32000 terms and one logf.
  EXPECT_TRUE(all_close(loss.download(), want_loss, 1e-5f, 1e-5f));
  EXPECT_TRUE(all_close(dz.download(), logits, 0.0f, 0.0f)) << "the loss alone must not write the logits";
  softmax_cross_entropy(dz.get(), loss.get(), dz.get(), dt.get(), n, V, dscale, nullptr);
  EXPECT_TRUE(all_close(loss.download(), want_loss, 1e-5f, 1e-5f));
  EXPECT_TRUE(all_close(dz.download(), want_grad, 1e-9f, 1e-5f));

  dz.upload(logits);
  DeviceBuffer<uint16_t> g16(n * V);
  softmax_cross_entropy_bf16(g16.get(), loss.get(), dz.get(), dt.get(), n, V, dscale, nullptr);
  EXPECT_TRUE(all_close(loss.download(), want_loss, 1e-5f, 1e-5f));
  EXPECT_TRUE(all_close(widen(g16.download()), want_grad, 1e-9f, 1.0f / 256));  // one bf16 rounding: 2^-9
}

// Two ranks' blocks of a 32003-wide vocabulary (one odd), a target in each, one ignored, one at a
// block's last column: the three passes with the group's reductions done on the host between them.
TEST(CudaVsRef, VocabParallelCrossEntropy) {
  REQUIRE_CUDA_DEVICE();
  const int64_t n = 7, V = 32003, half = 16001;
  const int64_t blocks[2][2] = {{0, half}, {half, V - half}};  // v0, Vb
  const auto logits = random_floats(n * V, 21, 3.0f);
  std::vector<int32_t> targets = {5, 16001, -1, 32002, 16000, 9000, 20000};
  const float dscale = 1.0f / 6;
  DeviceBuffer<int32_t> dt(targets);
  std::vector<float> want_max[2], got_max[2], want_sums[2][2], got_sums[2][2];
  std::vector<float> block_logits[2];
  for (int r = 0; r < 2; ++r) {
    const auto [v0, Vb] = std::pair{blocks[r][0], blocks[r][1]};
    block_logits[r].resize(n * Vb);
    for (int64_t i = 0; i < n; ++i) std::copy_n(&logits[i * V + v0], Vb, &block_logits[r][i * Vb]);
    want_max[r].resize(n);
    ref::vocab_parallel_max(want_max[r].data(), block_logits[r].data(), targets.data(), n, Vb);
    DeviceBuffer<float> dz(block_logits[r]), mx(n);
    vocab_parallel_max(mx.get(), dz.get(), dt.get(), n, Vb, nullptr);
    got_max[r] = mx.download();
    EXPECT_TRUE(all_close(got_max[r], want_max[r], 0.0f, 0.0f)) << "rank " << r;  // a maximum is exact
  }
  // The group's maximum, as the model takes it from the gathered blocks.
  std::vector<float> gathered = want_max[0];
  gathered.insert(gathered.end(), want_max[1].begin(), want_max[1].end());
  DeviceBuffer<float> dgathered(gathered), dmax(n);
  max_of_blocks(dmax.get(), dgathered.get(), 2, n, nullptr);
  std::vector<float> row_max(n);
  for (int64_t i = 0; i < n; ++i) row_max[i] = std::max(want_max[0][i], want_max[1][i]);
  EXPECT_TRUE(all_close(dmax.download(), row_max, 0.0f, 0.0f));

  std::vector<float> sum_exp(n, 0.0f), target_logit(n, 0.0f);
  for (int r = 0; r < 2; ++r) {
    const auto [v0, Vb] = std::pair{blocks[r][0], blocks[r][1]};
    for (auto& w : want_sums[r]) w.resize(n);
    ref::vocab_parallel_sums(want_sums[r][0].data(), want_sums[r][1].data(), block_logits[r].data(), row_max.data(),
                             targets.data(), n, Vb, v0);
    DeviceBuffer<float> dz(block_logits[r]), dmx(row_max), s(n), t(n);
    vocab_parallel_sums(s.get(), t.get(), dz.get(), dmx.get(), dt.get(), n, Vb, v0, nullptr);
    EXPECT_TRUE(all_close(s.download(), want_sums[r][0], 1e-6f, 1e-5f)) << "rank " << r;
    EXPECT_TRUE(all_close(t.download(), want_sums[r][1], 0.0f, 0.0f)) << "rank " << r;  // a copy
    for (int64_t i = 0; i < n; ++i) sum_exp[i] += want_sums[r][0][i], target_logit[i] += want_sums[r][1][i];
  }
  // Each rank's losses equal the whole vocabulary's; its gradient block is the whole one's.
  std::vector<float> want_loss(n), want_grad(n * V);
  ref::softmax_cross_entropy(want_grad.data(), want_loss.data(), logits.data(), targets.data(), n, V, dscale);
  for (int r = 0; r < 2; ++r) {
    const auto [v0, Vb] = std::pair{blocks[r][0], blocks[r][1]};
    DeviceBuffer<float> dz(block_logits[r]), dmx(row_max), s(sum_exp), t(target_logit), loss(n);
    vocab_parallel_loss(nullptr, loss.get(), dz.get(), dmx.get(), s.get(), t.get(), dt.get(), n, Vb, v0, dscale,
                        nullptr);
    EXPECT_TRUE(all_close(loss.download(), want_loss, 1e-5f, 1e-5f)) << "rank " << r;
    EXPECT_TRUE(all_close(dz.download(), block_logits[r], 0.0f, 0.0f)) << "the loss alone must not write the logits";
    vocab_parallel_loss(dz.get(), loss.get(), dz.get(), dmx.get(), s.get(), t.get(), dt.get(), n, Vb, v0, dscale,
                        nullptr);  // in place, as the model runs it
    std::vector<float> want_block(n * Vb);
    for (int64_t i = 0; i < n; ++i) std::copy_n(&want_grad[i * V + v0], Vb, &want_block[i * Vb]);
    EXPECT_TRUE(all_close(loss.download(), want_loss, 1e-5f, 1e-5f)) << "rank " << r;
    EXPECT_TRUE(all_close(dz.download(), want_block, 1e-9f, 1e-5f)) << "rank " << r;
  }
}

TEST(CudaVsRef, AdamWBitwiseAsCpu) {
  REQUIRE_CUDA_DEVICE();
  const int64_t n = 77777;
  const auto p0 = random_floats(n, 15), g = random_floats(n, 16), m0 = random_floats(n, 17, 0.1f);
  auto v0 = random_floats(n, 18, 0.01f);
  for (float& x : v0) x = x * x;
  AdamWParams params;
  params.lr = 1e-3f;
  params.weight_decay = 0.1f;
  params.step = 7;
  params.grad_scale = 0.5f;
  // A unit's runs with and without weight decay, more of them than one launch takes (16), empty
  // ones among them.
  std::vector<AdamWSegment> segments;
  for (int64_t i = 1; i <= 20; ++i) segments.push_back({n * i / 20, i % 3 != 0});
  const AdamWSegment empty_after = segments[6];
  segments.insert(segments.begin() + 7, empty_after);
  DeviceBuffer<float> dp(p0), dg(g), dm(m0), dv(v0);
  DeviceBuffer<uint16_t> image(n);
  adamw_update(dp.get(), dg.get(), dm.get(), dv.get(), segments.data(), static_cast<int>(segments.size()), params,
               image.get(), nullptr);

  auto cp = p0, cm = m0, cv = v0;
  std::vector<uint16_t> cimage(n);
  cpu::adamw_update(cp.data(), g.data(), cm.data(), cv.data(), segments.data(), static_cast<int>(segments.size()),
                    params, cimage.data());
  // The same float operations in the same order, each correctly rounded on both: the same bits.
  EXPECT_TRUE(all_close(dp.download(), cp, 0.0f, 0.0f));
  EXPECT_TRUE(all_close(dm.download(), cm, 0.0f, 0.0f));
  EXPECT_TRUE(all_close(dv.download(), cv, 0.0f, 0.0f));
  EXPECT_EQ(image.download(), cimage);

  auto rp = p0, rm = m0, rv = v0;
  int64_t begin = 0;
  for (const AdamWSegment& s : segments) {
    AdamWParams sp = params;
    sp.weight_decay = s.decay ? params.weight_decay : 0.0f;
    ref::adamw_step(rp.data() + begin, g.data() + begin, rm.data() + begin, rv.data() + begin, s.end - begin, sp);
    begin = s.end;
  }
  EXPECT_TRUE(all_close(dp.download(), rp, 1e-7f, 1e-6f));
}

// Row-major C (M,N) = alpha op(A) op(B) + beta C in double, the oracle of every transpose case.
std::vector<float> gemm_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const std::vector<float>& A,
                            int64_t lda, const std::vector<float>& B, int64_t ldb, float beta, std::vector<float> C,
                            int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double s = 0.0;
      for (int64_t k = 0; k < K; ++k)
        s += double{ta ? A[k * lda + i] : A[i * lda + k]} * (tb ? B[j * ldb + k] : B[k * ldb + j]);
      C[i * ldc + j] = static_cast<float>(alpha * s + beta * C[i * ldc + j]);
    }
  }
  return C;
}

TEST(CudaVsRef, GemmEveryTransposeAndStride) {
  REQUIRE_CUDA_DEVICE();
  Blas blas;  // TF32 off: IEEE fp32 products
  const int64_t M = 37, N = 53, K = 129;
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "trans_a=" << ta << " trans_b=" << tb);
      // Strides wider than the rows, and buffers one float past an aligned start (alignment 4).
      const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
      const auto A = random_floats((ta ? K : M) * lda, 19), B = random_floats((tb ? N : K) * ldb, 20);
      const auto C = random_floats(M * ldc, 21);
      DeviceBuffer<float> dA(A.size() + 1), dB(B.size() + 1), dC(C.size() + 1);
      CUDA_CHECK(cudaMemcpy(dA.get() + 1, A.data(), A.size() * 4, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(dB.get() + 1, B.data(), B.size() * 4, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(dC.get() + 1, C.data(), C.size() * 4, cudaMemcpyHostToDevice));
      blas.gemm(GemmInput::kF32, ta, tb, M, N, K, 0.5f, dA.get() + 1, lda, dB.get() + 1, ldb, 0.25f, dC.get() + 1, ldc,
                nullptr);
      const auto got_all = dC.download();
      const std::vector<float> got(got_all.begin() + 1, got_all.end());
      const auto want = gemm_ref(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 0.25f, C, ldc);
      // K = 129 products of unit normals: sums of size ~11, u sqrt(K) ~ 7e-7 relative to that.
      EXPECT_TRUE(all_close(got, want, 2e-4f, 1e-5f));
    }
  }
}

TEST(CudaVsRef, Linear) {
  REQUIRE_CUDA_DEVICE();
  Blas blas;
  const int64_t M = 65, N = 96, K = 80;
  const auto x = random_floats(M * K, 22), w = random_floats(N * K, 23), dy = random_floats(M * N, 24);
  const auto dw0 = random_floats(N * K, 25);
  DeviceBuffer<float> dx_in(x), dw_in(w), ddy(dy), y(M * N), dx(M * K), dw(dw0);
  linear_forward(blas, y.get(), dx_in.get(), dw_in.get(), M, N, K, 0.0f, nullptr);
  linear_backward(blas, dx.get(), dw.get(), ddy.get(), dx_in.get(), dw_in.get(), M, N, K, false, nullptr);
  std::vector<float> want_y(M * N), want_dx(M * K);
  auto want_dw = dw0;
  ref::linear_forward(want_y.data(), x.data(), w.data(), M, N, K);
  ref::linear_backward(want_dx.data(), want_dw.data(), dy.data(), x.data(), w.data(), M, N, K, false);
  EXPECT_TRUE(all_close(y.download(), want_y, 2e-4f, 1e-5f));
  EXPECT_TRUE(all_close(dx.download(), want_dx, 2e-4f, 1e-5f));
  EXPECT_TRUE(all_close(dw.download(), want_dw, 2e-4f, 1e-5f));

  // bf16 inputs: the oracle takes the same rounded inputs; products of bf16 are exact in fp32, so
  // only the fp32 accumulation differs from it.
  const auto x16 = round_bf16(x), w16 = round_bf16(w), dy16 = round_bf16(dy);
  DeviceBuffer<uint16_t> dx16(x16), dw16(w16), ddy16(dy16);
  dw.upload(dw0);
  linear_forward_bf16(blas, y.get(), dx16.get(), dw16.get(), M, N, K, 0.0f, nullptr);
  linear_backward_bf16(blas, dx.get(), dw.get(), ddy16.get(), dx16.get(), dw16.get(), M, N, K, false, nullptr);
  want_dw = dw0;
  ref::linear_forward(want_y.data(), widen(x16).data(), widen(w16).data(), M, N, K);
  ref::linear_backward(want_dx.data(), want_dw.data(), widen(dy16).data(), widen(x16).data(), widen(w16).data(), M, N,
                       K, false);
  EXPECT_TRUE(all_close(y.download(), want_y, 2e-4f, 1e-5f));
  EXPECT_TRUE(all_close(dx.download(), want_dx, 2e-4f, 1e-5f));
  EXPECT_TRUE(all_close(dw.download(), want_dw, 2e-4f, 1e-5f));
  EXPECT_GE(blas.plans(), 3u);
}

TEST(CudaVsRef, LinearTf32IsCloseButNotExact) {
  REQUIRE_CUDA_DEVICE();
  // TF32 keeps 10 mantissa bits of each input: relative errors ~2^-11 per product, far over fp32's.
  Blas tf32(/*allow_tf32=*/true);
  const int64_t M = 128, N = 128, K = 256;
  const auto x = random_floats(M * K, 26), w = random_floats(N * K, 27);
  DeviceBuffer<float> dx(x), dw(w), y(M * N);
  linear_forward(tf32, y.get(), dx.get(), dw.get(), M, N, K, 0.0f, nullptr);
  std::vector<float> want(M * N);
  ref::linear_forward(want.data(), x.data(), w.data(), M, N, K);
  EXPECT_TRUE(all_close(y.download(), want, 0.1f, 1e-2f));
}

}  // namespace
}  // namespace tessera::kernels::cuda
