// The CPU backend: kernels/cpu on host memory, work done before each call returns.
#include "kernels/backend.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/bf16.h"
#include "core/threads.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cpu/vector.h"

namespace tessera::kernels {

namespace {

void free_host(void* p) { std::free(p); }

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::kCpu; }

  Memory allocate(size_t bytes) override {
    constexpr size_t kAlign = 256;
    const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, rounded == 0 ? kAlign : rounded);
    if (p == nullptr) throw std::bad_alloc();
    // Touched here, not in the first step; by this thread alone (a process forked after OpenMP
    // started its threads hangs in its next parallel region, and test ranks allocate forked).
    std::memset(p, 0, rounded);
    return Memory(static_cast<std::byte*>(p), MemoryFree{free_host});
  }
  Memory allocate_host(size_t bytes) override { return allocate(bytes); }
  void to_device(void* dst, const void* host_src, size_t bytes) override { copy(dst, host_src, bytes); }
  void to_host(void* host_dst, const void* src, size_t bytes) override { copy(host_dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override {
    auto* d = static_cast<std::byte*>(dst);
    const auto* s = static_cast<const std::byte*>(src);
    parallel_for(static_cast<int64_t>(bytes),
                 [&](int64_t begin, int64_t end) { std::memcpy(d + begin, s + begin, end - begin); });
  }
  void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows,
                 int64_t cols) override {
    for (int64_t i = 0; i < rows; ++i) std::memcpy(dst + i * dst_stride, src + i * src_stride, sizeof(float) * cols);
  }
  void zero(void* dst, size_t bytes) override {
    // Threaded from 1 MiB: a step's gradient zeroing (~4 bytes a parameter) on two threads took
    // 5.8 ms where one took 10.3 (Zen 5, 234 MiB), with the other thread idle meanwhile.
    auto* d = static_cast<std::byte*>(dst);
    if (bytes < (size_t{1} << 20)) {
      std::memset(d, 0, bytes);
      return;
    }
    parallel_for(static_cast<int64_t>(bytes),
                 [&](int64_t begin, int64_t end) { std::memset(d + begin, 0, end - begin); });
  }
  void synchronize() override {}

  void linear(float* y, const float* x, const float* w, int64_t M, int64_t N, int64_t K, float beta) override {
    cpu::gemm(false, true, M, N, K, 1.0f, x, K, w, K, beta, y, N);
  }
  void linear_bf16(float* y, const uint16_t* x, Bf16Weight w, int64_t M, int64_t N, int64_t K, float beta) override {
    if (w.pack != nullptr) {
      cpu::gemm_bf16_packed(false, M, N, K, 1.0f, x, K, w.pack, beta, y, N);
    } else {
      cpu::gemm_bf16(false, true, M, N, K, 1.0f, x, K, w.image, K, beta, y, N);
    }
  }
  void linear_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, int64_t M, int64_t N,
                       int64_t K) override {
    cpu::linear_backward(dx, dw, dy, x, w, M, N, K, false);
  }
  void linear_backward_bf16(float* dx, float* dw, const uint16_t* dy, const uint16_t* x, Bf16Weight w, int64_t M,
                            int64_t N, int64_t K) override {
    if (w.pack == nullptr) return cpu::linear_backward_bf16(dx, dw, dy, x, w.image, M, N, K, false);
    if (dx != nullptr) cpu::gemm_bf16_packed(false, M, K, N, 1.0f, dy, N, w.pack, 0.0f, dx, K);
    cpu::linear_backward_bf16(nullptr, dw, dy, x, nullptr, M, N, K, false);
  }
  // The GEMM's B is w^T (K, N) in the forward, w (N, K) in dx's product.
  int64_t packed_weight_bytes(int64_t N, int64_t K, WeightUse use) const override {
    return use == WeightUse::kForward ? cpu::packed_b_bytes(K, N) : cpu::packed_b_bytes(N, K);
  }
  void pack_weight_bf16(void* packed, const uint16_t* w, int64_t N, int64_t K, WeightUse use) override {
    if (use == WeightUse::kForward) {
      cpu::pack_b(packed, true, w, K, K, N);
    } else {
      cpu::pack_b(packed, false, w, K, N, K);
    }
  }

  void to_bf16(uint16_t* out, const float* in, int64_t n) override { cpu::to_bf16(out, in, n); }
  void from_bf16(float* out, const uint16_t* in, int64_t n) override { bf16_to_f32(in, out, n); }
  void add_inplace(float* y, const float* x, int64_t n) override { cpu::add_inplace(y, x, n); }

  void rms_norm_forward(float* out, float* rstd, const float* x, const float* weight, int64_t n, int64_t C,
                        float eps) override {
    cpu::rms_norm_forward(out, rstd, x, weight, n, C, eps);
  }
  void rms_norm_forward_bf16(uint16_t* out, float* rstd, const float* x, const float* weight, int64_t n, int64_t C,
                             float eps) override {
    cpu::rms_norm_forward_bf16(out, rstd, x, weight, n, C, eps);
  }
  int64_t rms_norm_workspace_floats(int64_t, int64_t) const override { return 0; }
  void rms_norm_backward(float* dx, float* dweight, const float* dout, const float* x, const float* weight,
                         const float* rstd, int64_t n, int64_t C, float*) override {
    cpu::rms_norm_backward(dx, dweight, dout, x, weight, rstd, n, C);
  }

  void rope_forward(float* x, const float* table, int64_t B, int64_t T, int64_t n_heads, int64_t D,
                    int64_t stride) override {
    cpu::rope_forward(x, table, B, T, n_heads, D, stride);
  }
  void rope_backward(float* dx, const float* table, int64_t B, int64_t T, int64_t n_heads, int64_t D,
                     int64_t stride) override {
    cpu::rope_backward(dx, table, B, T, n_heads, D, stride);
  }

  int64_t attention_workspace_floats(int64_t, int64_t T, int64_t, int64_t D, int threads) const override {
    return cpu::attention_workspace_floats(T, D, threads);
  }
  void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                         int64_t D, bool allow_bf16, float* workspace) override {
    cpu::attention_forward(out, lse, qkv, B, T, H, Hkv, D, workspace, allow_bf16);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                          int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, bool allow_bf16,
                          float* workspace) override {
    cpu::attention_backward(dqkv, dout, qkv, out, lse, B, T, H, Hkv, D, workspace, allow_bf16);
  }
  int64_t attention_cached_workspace_floats(int64_t max_context, int threads) const override {
    return cpu::attention_cached_workspace_floats(max_context, threads);
  }
  void attention_cached(float* out, const float* q, int64_t q_stride, const float* k, const float* v, int64_t kv_stride,
                        int64_t max_context, const int64_t*, const int64_t*, const int64_t* host_rows,
                        const int64_t* host_start, int64_t B, int64_t H, int64_t Hkv, int64_t D,
                        float* workspace) override {
    cpu::attention_cached(out, q, q_stride, k, v, kv_stride, max_context, host_rows, host_start, B, H, Hkv, D,
                          workspace);
  }

  void swiglu_forward(float* out, const float* h13, int64_t n, int64_t F) override {
    cpu::swiglu_forward(out, h13, n, F);
  }
  void swiglu_backward(float* dh13, const float* dout, const float* h13, int64_t n, int64_t F) override {
    cpu::swiglu_backward(dh13, dout, h13, n, F);
  }
  void swiglu_forward_bf16(uint16_t* out, const float* h13, int64_t n, int64_t F) override {
    cpu::swiglu_forward_bf16(out, h13, n, F);
  }
  void swiglu_backward_bf16(uint16_t* dh13, const float* dout, const float* h13, int64_t n, int64_t F) override {
    cpu::swiglu_backward_bf16(dh13, dout, h13, n, F);
  }

  void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t n, int64_t C, int64_t v0,
                         int64_t Vb) override {
    cpu::embedding_forward(out, tokens, table, n, C, v0, Vb);
  }
  void embedding_forward_bf16(float* out, const int32_t* tokens, const uint16_t* table, int64_t n, int64_t C,
                              int64_t v0, int64_t Vb) override {
    cpu::embedding_forward_bf16(out, tokens, table, n, C, v0, Vb);
  }
  int64_t embedding_workspace_ints(int64_t) const override { return 0; }
  void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, const int32_t*, int64_t n, int64_t C,
                          int64_t v0, int64_t Vb, int32_t*) override {
    cpu::embedding_backward(dtable, dout, tokens, n, C, v0, Vb);
  }

  void softmax_cross_entropy(float* dlogits, float* losses, const float* logits, const int32_t* targets, int64_t n,
                             int64_t V, float dscale) override {
    cpu::softmax_cross_entropy(dlogits, losses, logits, targets, n, V, dscale);
  }
  void softmax_cross_entropy_bf16(uint16_t* dlogits, float* losses, const float* logits, const int32_t* targets,
                                  int64_t n, int64_t V, float dscale) override {
    cpu::softmax_cross_entropy_bf16(dlogits, losses, logits, targets, n, V, dscale);
  }
  void vocab_parallel_max(float* row_max, const float* logits, const int32_t* targets, int64_t n, int64_t Vb) override {
    cpu::vocab_parallel_max(row_max, logits, targets, n, Vb);
  }
  void vocab_parallel_sums(float* sum_exp, float* target_logit, const float* logits, const float* row_max,
                           const int32_t* targets, int64_t n, int64_t Vb, int64_t v0) override {
    cpu::vocab_parallel_sums(sum_exp, target_logit, logits, row_max, targets, n, Vb, v0);
  }
  void vocab_parallel_loss(float* dlogits, float* losses, const float* logits, const float* row_max,
                           const float* sum_exp, const float* target_logit, const int32_t* targets, int64_t n,
                           int64_t Vb, int64_t v0, float dscale) override {
    cpu::vocab_parallel_loss(dlogits, losses, logits, row_max, sum_exp, target_logit, targets, n, Vb, v0, dscale);
  }
  void max_of_blocks(float* out, const float* blocks, int64_t count, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) {
      float mx = blocks[i];
      for (int64_t b = 1; b < count; ++b) mx = std::max(mx, blocks[b * n + i]);
      out[i] = mx;
    }
  }

  void adamw_update(float* param, const float* grad, float* m, float* v, const AdamWSegment* segments, int count,
                    const AdamWParams& p, uint16_t* param_bf16) override {
    cpu::adamw_update(param, grad, m, v, segments, count, p, param_bf16);
  }
  double sum_squares(const float* x, int64_t n) override { return cpu::sum_squares(x, n); }
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace tessera::kernels
