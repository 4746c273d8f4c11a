// The profiling backend (profiling_backend.h): every op forwarded to the inner backend between two
// of its synchronize() calls, timed on the host's steady clock.
#include "kernels/profiling_backend.h"

#include <type_traits>

#include "core/timer.h"

namespace tessera::kernels {

void OpProfile::add(const char* op, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  Total& t = totals_[op];
  ++t.calls;
  t.seconds += seconds;
}

void OpProfile::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  totals_.clear();
}

std::map<std::string, OpProfile::Total> OpProfile::totals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return totals_;
}

namespace {

class ProfilingBackend final : public Backend {
 public:
  ProfilingBackend(Backend& inner, OpProfile& profile) : inner_(inner), profile_(profile) {}

  Device device() const override { return inner_.device(); }
  Memory allocate(size_t bytes) override { return inner_.allocate(bytes); }
  Memory allocate_host(size_t bytes) override { return inner_.allocate_host(bytes); }
  void to_device(void* dst, const void* host_src, size_t bytes) override {
    timed("to_device", [&] { inner_.to_device(dst, host_src, bytes); });
  }
  void to_host(void* host_dst, const void* src, size_t bytes) override {
    timed("to_host", [&] { inner_.to_host(host_dst, src, bytes); });
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    timed("copy", [&] { inner_.copy(dst, src, bytes); });
  }
  void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows,
                 int64_t cols) override {
    timed("copy_rows", [&] { inner_.copy_rows(dst, dst_stride, src, src_stride, rows, cols); });
  }
  void zero(void* dst, size_t bytes) override {
    timed("zero", [&] { inner_.zero(dst, bytes); });
  }
  void synchronize() override { inner_.synchronize(); }
  DeviceMemory device_memory() const override { return inner_.device_memory(); }
  std::string pci_bus_id() const override { return inner_.pci_bus_id(); }
  void* stream() const override { return inner_.stream(); }
  int device_index() const override { return inner_.device_index(); }
  void linear(float* y, const float* x, const float* w, int64_t M, int64_t N, int64_t K, float beta) override {
    timed("linear", [&] { inner_.linear(y, x, w, M, N, K, beta); });
  }
  void linear_bf16(float* y, const uint16_t* x, Bf16Weight w, int64_t M, int64_t N, int64_t K, float beta) override {
    timed("linear_bf16", [&] { inner_.linear_bf16(y, x, w, M, N, K, beta); });
  }
  void linear_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, int64_t M, int64_t N,
                       int64_t K) override {
    timed("linear_backward", [&] { inner_.linear_backward(dx, dw, dy, x, w, M, N, K); });
  }
  void linear_backward_bf16(float* dx, float* dw, const uint16_t* dy, const uint16_t* x, Bf16Weight w, int64_t M,
                            int64_t N, int64_t K) override {
    timed("linear_backward_bf16", [&] { inner_.linear_backward_bf16(dx, dw, dy, x, w, M, N, K); });
  }
  int64_t packed_weight_bytes(int64_t N, int64_t K, WeightUse use) const override {
    return inner_.packed_weight_bytes(N, K, use);
  }
  void pack_weight_bf16(void* packed, const uint16_t* w, int64_t N, int64_t K, WeightUse use) override {
    timed("pack_weight_bf16", [&] { inner_.pack_weight_bf16(packed, w, N, K, use); });
  }
  void to_bf16(uint16_t* out, const float* in, int64_t n) override {
    timed("to_bf16", [&] { inner_.to_bf16(out, in, n); });
  }
  void from_bf16(float* out, const uint16_t* in, int64_t n) override {
    timed("from_bf16", [&] { inner_.from_bf16(out, in, n); });
  }
  void add_inplace(float* y, const float* x, int64_t n) override {
    timed("add_inplace", [&] { inner_.add_inplace(y, x, n); });
  }
  void rms_norm_forward(float* out, float* rstd, const float* x, const float* weight, int64_t n, int64_t C,
                        float eps) override {
    timed("rms_norm_forward", [&] { inner_.rms_norm_forward(out, rstd, x, weight, n, C, eps); });
  }
  void rms_norm_forward_bf16(uint16_t* out, float* rstd, const float* x, const float* weight, int64_t n, int64_t C,
                             float eps) override {
    timed("rms_norm_forward_bf16", [&] { inner_.rms_norm_forward_bf16(out, rstd, x, weight, n, C, eps); });
  }
  int64_t rms_norm_workspace_floats(int64_t n, int64_t C) const override {
    return inner_.rms_norm_workspace_floats(n, C);
  }
  void rms_norm_backward(float* dx, float* dweight, const float* dout, const float* x, const float* weight,
                         const float* rstd, int64_t n, int64_t C, float* workspace) override {
    timed("rms_norm_backward", [&] { inner_.rms_norm_backward(dx, dweight, dout, x, weight, rstd, n, C, workspace); });
  }
  void rope_forward(float* x, const float* table, int64_t B, int64_t T, int64_t n_heads, int64_t D,
                    int64_t stride) override {
    timed("rope_forward", [&] { inner_.rope_forward(x, table, B, T, n_heads, D, stride); });
  }
  void rope_backward(float* dx, const float* table, int64_t B, int64_t T, int64_t n_heads, int64_t D,
                     int64_t stride) override {
    timed("rope_backward", [&] { inner_.rope_backward(dx, table, B, T, n_heads, D, stride); });
  }
  int64_t attention_workspace_floats(int64_t B, int64_t T, int64_t H, int64_t D, int threads) const override {
    return inner_.attention_workspace_floats(B, T, H, D, threads);
  }
  void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                         int64_t D, bool allow_bf16, float* workspace) override {
    timed("attention_forward",
          [&] { inner_.attention_forward(out, lse, qkv, B, T, H, Hkv, D, allow_bf16, workspace); });
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                          int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, bool allow_bf16,
                          float* workspace) override {
    timed("attention_backward",
          [&] { inner_.attention_backward(dqkv, dout, qkv, out, lse, B, T, H, Hkv, D, allow_bf16, workspace); });
  }
  int64_t attention_cached_workspace_floats(int64_t max_context, int threads) const override {
    return inner_.attention_cached_workspace_floats(max_context, threads);
  }
  void attention_cached(float* out, const float* q, int64_t q_stride, const float* k, const float* v, int64_t kv_stride,
                        int64_t max_context, const int64_t* rows, const int64_t* start, const int64_t* host_rows,
                        const int64_t* host_start, int64_t B, int64_t H, int64_t Hkv, int64_t D,
                        float* workspace) override {
    timed("attention_cached", [&] {
      inner_.attention_cached(out, q, q_stride, k, v, kv_stride, max_context, rows, start, host_rows, host_start, B, H,
                              Hkv, D, workspace);
    });
  }
  void swiglu_forward(float* out, const float* h13, int64_t n, int64_t F) override {
    timed("swiglu_forward", [&] { inner_.swiglu_forward(out, h13, n, F); });
  }
  void swiglu_backward(float* dh13, const float* dout, const float* h13, int64_t n, int64_t F) override {
    timed("swiglu_backward", [&] { inner_.swiglu_backward(dh13, dout, h13, n, F); });
  }
  void swiglu_forward_bf16(uint16_t* out, const float* h13, int64_t n, int64_t F) override {
    timed("swiglu_forward_bf16", [&] { inner_.swiglu_forward_bf16(out, h13, n, F); });
  }
  void swiglu_backward_bf16(uint16_t* dh13, const float* dout, const float* h13, int64_t n, int64_t F) override {
    timed("swiglu_backward_bf16", [&] { inner_.swiglu_backward_bf16(dh13, dout, h13, n, F); });
  }
  void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t n, int64_t C, int64_t v0,
                         int64_t Vb) override {
    timed("embedding_forward", [&] { inner_.embedding_forward(out, tokens, table, n, C, v0, Vb); });
  }
  void embedding_forward_bf16(float* out, const int32_t* tokens, const uint16_t* table, int64_t n, int64_t C,
                              int64_t v0, int64_t Vb) override {
    timed("embedding_forward_bf16", [&] { inner_.embedding_forward_bf16(out, tokens, table, n, C, v0, Vb); });
  }
  int64_t embedding_workspace_ints(int64_t n) const override { return inner_.embedding_workspace_ints(n); }
  void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, const int32_t* host_tokens,
                          int64_t n, int64_t C, int64_t v0, int64_t Vb, int32_t* workspace) override {
    timed("embedding_backward",
          [&] { inner_.embedding_backward(dtable, dout, tokens, host_tokens, n, C, v0, Vb, workspace); });
  }
  void softmax_cross_entropy(float* dlogits, float* losses, const float* logits, const int32_t* targets, int64_t n,
                             int64_t V, float dscale) override {
    timed("softmax_cross_entropy",
          [&] { inner_.softmax_cross_entropy(dlogits, losses, logits, targets, n, V, dscale); });
  }
  void softmax_cross_entropy_bf16(uint16_t* dlogits, float* losses, const float* logits, const int32_t* targets,
                                  int64_t n, int64_t V, float dscale) override {
    timed("softmax_cross_entropy_bf16",
          [&] { inner_.softmax_cross_entropy_bf16(dlogits, losses, logits, targets, n, V, dscale); });
  }
  void vocab_parallel_max(float* row_max, const float* logits, const int32_t* targets, int64_t n, int64_t Vb) override {
    timed("vocab_parallel_max", [&] { inner_.vocab_parallel_max(row_max, logits, targets, n, Vb); });
  }
  void vocab_parallel_sums(float* sum_exp, float* target_logit, const float* logits, const float* row_max,
                           const int32_t* targets, int64_t n, int64_t Vb, int64_t v0) override {
    timed("vocab_parallel_sums",
          [&] { inner_.vocab_parallel_sums(sum_exp, target_logit, logits, row_max, targets, n, Vb, v0); });
  }
  void vocab_parallel_loss(float* dlogits, float* losses, const float* logits, const float* row_max,
                           const float* sum_exp, const float* target_logit, const int32_t* targets, int64_t n,
                           int64_t Vb, int64_t v0, float dscale) override {
    timed("vocab_parallel_loss", [&] {
      inner_.vocab_parallel_loss(dlogits, losses, logits, row_max, sum_exp, target_logit, targets, n, Vb, v0, dscale);
    });
  }
  void max_of_blocks(float* out, const float* blocks, int64_t count, int64_t n) override {
    timed("max_of_blocks", [&] { inner_.max_of_blocks(out, blocks, count, n); });
  }
  void adamw_update(float* param, const float* grad, float* m, float* v, const AdamWSegment* segments, int count,
                    const AdamWParams& p, uint16_t* param_bf16) override {
    timed("adamw_update", [&] { inner_.adamw_update(param, grad, m, v, segments, count, p, param_bf16); });
  }
  double sum_squares(const float* x, int64_t n) override {
    return timed("sum_squares", [&] { return inner_.sum_squares(x, n); });
  }

 private:
  // Runs f, one of inner_'s ops, alone: the work queued before it done first, its own after it.
  template <typename F>
  std::invoke_result_t<F> timed(const char* op, F&& f) {
    inner_.synchronize();
    const double start = now_seconds();
    if constexpr (std::is_void_v<std::invoke_result_t<F>>) {
      f();
      inner_.synchronize();
      profile_.add(op, now_seconds() - start);
    } else {
      auto result = f();
      inner_.synchronize();
      profile_.add(op, now_seconds() - start);
      return result;
    }
  }

  Backend& inner_;
  OpProfile& profile_;
};

}  // namespace

std::unique_ptr<Backend> make_profiling_backend(Backend& inner, OpProfile& profile) {
  return std::make_unique<ProfilingBackend>(inner, profile);
}

}  // namespace tessera::kernels
