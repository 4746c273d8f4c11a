// The CUDA backend: each op is a launch on the compute stream; copies to and from the host wait.
#include "kernels/cuda/backend.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstring>
#include <stdexcept>
#include <string>

#include "core/check.h"
#include "core/error.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_cached.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/swiglu.h"
#include "kernels/cuda/vector.h"

namespace tessera::kernels::cuda {

namespace {

void free_device(void* p) { cudaFree(p); }
void free_pinned(void* p) { cudaFreeHost(p); }

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaOptions& options) : device_(options.device), blas_(options.allow_tf32) {
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    sums_ = allocate(sizeof(double) * (1 + sum_squares_workspace_doubles()));
    baseline_ = memory_info().in_use;
  }
  ~CudaBackend() override {
    sums_.reset();
    cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device::kCuda; }

  Memory allocate(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t st = cudaMalloc(&p, bytes == 0 ? 256 : bytes);  // 256-byte aligned
    if (st == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clears it: the device is usable, only full
      const DeviceMemory m = memory_info();
      const auto free = static_cast<double>(m.total - m.in_use), total = static_cast<double>(m.total);
      constexpr double kGiB = 1 << 30;
      throw ConfigError(fmt::format(
          "the GPU cannot hold this run: an arena of {:.2f} GiB does not fit in the {:.2f} GiB free of its {:.2f} "
          "GiB; lower train.micro_batch_size, set parallel.activation_checkpointing, or see `tessera plan --hardware` "
          "for what fits",
          static_cast<double>(bytes) / kGiB, free / kGiB, total / kGiB));
    }
    if (st != cudaSuccess) {
      throw std::runtime_error("cannot allocate " + std::to_string(bytes) +
                               " bytes of device memory: " + cudaGetErrorString(st));
    }
    CUDA_CHECK(cudaMemset(p, 0, bytes));
    return Memory(static_cast<std::byte*>(p), MemoryFree{free_device});
  }
  Memory allocate_host(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t st = cudaMallocHost(&p, bytes == 0 ? 256 : bytes);
    if (st != cudaSuccess) {
      throw std::runtime_error("cannot allocate " + std::to_string(bytes) +
                               " bytes of pinned host memory: " + cudaGetErrorString(st));
    }
    std::memset(p, 0, bytes);
    return Memory(static_cast<std::byte*>(p), MemoryFree{free_pinned});
  }
  // From pageable memory the runtime stages the copy and the stream waits anyway; waiting here too
  // lets the caller reuse host_src whatever memory it is.
  void to_device(void* dst, const void* host_src, size_t bytes) override {
    CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
    synchronize();
  }
  void to_host(void* host_dst, const void* src, size_t bytes) override {
    CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    synchronize();
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows,
                 int64_t cols) override {
    if (rows == 0) return;
    CUDA_CHECK(cudaMemcpy2DAsync(dst, sizeof(float) * dst_stride, src, sizeof(float) * src_stride, sizeof(float) * cols,
                                 rows, cudaMemcpyDeviceToDevice, stream_));
  }
  void zero(void* dst, size_t bytes) override { CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_)); }
  void synchronize() override { CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  void* stream() const override { return stream_; }
  int device_index() const override { return device_; }
  std::string pci_bus_id() const override {
    char id[32] = {};
    CUDA_CHECK(cudaDeviceGetPCIBusId(id, sizeof(id), device_));
    return id;
  }
  DeviceMemory device_memory() const override {
    DeviceMemory m = memory_info();
    m.in_use -= baseline_;
    return m;
  }

  void linear(float* y, const float* x, const float* w, int64_t M, int64_t N, int64_t K, float beta) override {
    linear_forward(blas_, y, x, w, M, N, K, beta, stream_);
  }
  // No packs here (packed_weight_bytes is 0): cuBLASLt reads the plain image at full rate.
  void linear_bf16(float* y, const uint16_t* x, Bf16Weight w, int64_t M, int64_t N, int64_t K, float beta) override {
    CHECK(w.pack == nullptr);
    linear_forward_bf16(blas_, y, x, w.image, M, N, K, beta, stream_);
  }
  void linear_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, int64_t M, int64_t N,
                       int64_t K) override {
    cuda::linear_backward(blas_, dx, dw, dy, x, w, M, N, K, false, stream_);
  }
  void linear_backward_bf16(float* dx, float* dw, const uint16_t* dy, const uint16_t* x, Bf16Weight w, int64_t M,
                            int64_t N, int64_t K) override {
    CHECK(w.pack == nullptr);
    cuda::linear_backward_bf16(blas_, dx, dw, dy, x, w.image, M, N, K, false, stream_);
  }

  void to_bf16(uint16_t* out, const float* in, int64_t n) override { cuda::to_bf16(out, in, n, stream_); }
  void from_bf16(float* out, const uint16_t* in, int64_t n) override { cuda::from_bf16(out, in, n, stream_); }
  void add_inplace(float* y, const float* x, int64_t n) override { cuda::add_inplace(y, x, n, stream_); }

  void rms_norm_forward(float* out, float* rstd, const float* x, const float* weight, int64_t n, int64_t C,
                        float eps) override {
    cuda::rms_norm_forward(out, rstd, x, weight, n, C, eps, stream_);
  }
  void rms_norm_forward_bf16(uint16_t* out, float* rstd, const float* x, const float* weight, int64_t n, int64_t C,
                             float eps) override {
    cuda::rms_norm_forward_bf16(out, rstd, x, weight, n, C, eps, stream_);
  }
  int64_t rms_norm_workspace_floats(int64_t n, int64_t C) const override {
    return rms_norm_backward_workspace_floats(n, C);
  }
  void rms_norm_backward(float* dx, float* dweight, const float* dout, const float* x, const float* weight,
                         const float* rstd, int64_t n, int64_t C, float* workspace) override {
    cuda::rms_norm_backward(dx, dweight, dout, x, weight, rstd, n, C, workspace, stream_);
  }

  void rope_forward(float* x, const float* table, int64_t B, int64_t T, int64_t n_heads, int64_t D,
                    int64_t stride) override {
    cuda::rope_forward(x, table, B, T, n_heads, D, stride, stream_);
  }
  void rope_backward(float* dx, const float* table, int64_t B, int64_t T, int64_t n_heads, int64_t D,
                     int64_t stride) override {
    cuda::rope_backward(dx, table, B, T, n_heads, D, stride, stream_);
  }

  int64_t attention_workspace_floats(int64_t B, int64_t T, int64_t H, int64_t, int) const override {
    return attention_backward_workspace_floats(B, T, H);
  }
  void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                         int64_t D, bool allow_bf16, float*) override {
    cuda::attention_forward(out, lse, qkv, B, T, H, Hkv, D, allow_bf16, stream_);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                          int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, bool allow_bf16,
                          float* workspace) override {
    cuda::attention_backward(dqkv, dout, qkv, out, lse, B, T, H, Hkv, D, allow_bf16, workspace, stream_);
  }
  int64_t attention_cached_workspace_floats(int64_t, int) const override { return 0; }
  void attention_cached(float* out, const float* q, int64_t q_stride, const float* k, const float* v, int64_t kv_stride,
                        int64_t max_context, const int64_t* rows, const int64_t* start, const int64_t* host_rows,
                        const int64_t*, int64_t B, int64_t H, int64_t Hkv, int64_t D, float*) override {
    cuda::attention_cached(out, q, q_stride, k, v, kv_stride, max_context, rows, start, host_rows[B], B, H, Hkv, D,
                           stream_);
  }

  void swiglu_forward(float* out, const float* h13, int64_t n, int64_t F) override {
    cuda::swiglu_forward(out, h13, n, F, stream_);
  }
  void swiglu_backward(float* dh13, const float* dout, const float* h13, int64_t n, int64_t F) override {
    cuda::swiglu_backward(dh13, dout, h13, n, F, stream_);
  }
  void swiglu_forward_bf16(uint16_t* out, const float* h13, int64_t n, int64_t F) override {
    cuda::swiglu_forward_bf16(out, h13, n, F, stream_);
  }
  void swiglu_backward_bf16(uint16_t* dh13, const float* dout, const float* h13, int64_t n, int64_t F) override {
    cuda::swiglu_backward_bf16(dh13, dout, h13, n, F, stream_);
  }

  void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t n, int64_t C, int64_t v0,
                         int64_t Vb) override {
    cuda::embedding_forward(out, tokens, table, n, C, v0, Vb, stream_);
  }
  void embedding_forward_bf16(float* out, const int32_t* tokens, const uint16_t* table, int64_t n, int64_t C,
                              int64_t v0, int64_t Vb) override {
    cuda::embedding_forward_bf16(out, tokens, table, n, C, v0, Vb, stream_);
  }
  // Positions, bucket rows and bucket starts (kernels/cuda/embedding.h): at most 3n + 1.
  int64_t embedding_workspace_ints(int64_t n) const override { return 3 * n + 1; }
  void embedding_backward(float* dtable, const float* dout, const int32_t*, const int32_t* host_tokens, int64_t n,
                          int64_t C, int64_t v0, int64_t Vb, int32_t* workspace) override {
    const EmbeddingBuckets buckets = embedding_buckets(host_tokens, n, v0, Vb);
    to_device(workspace, buckets.ints.data(), sizeof(int32_t) * buckets.ints.size());
    cuda::embedding_backward(dtable, dout, workspace, buckets, C, stream_);
  }

  void softmax_cross_entropy(float* dlogits, float* losses, const float* logits, const int32_t* targets, int64_t n,
                             int64_t V, float dscale) override {
    cuda::softmax_cross_entropy(dlogits, losses, logits, targets, n, V, dscale, stream_);
  }
  void softmax_cross_entropy_bf16(uint16_t* dlogits, float* losses, const float* logits, const int32_t* targets,
                                  int64_t n, int64_t V, float dscale) override {
    cuda::softmax_cross_entropy_bf16(dlogits, losses, logits, targets, n, V, dscale, stream_);
  }
  void vocab_parallel_max(float* row_max, const float* logits, const int32_t* targets, int64_t n, int64_t Vb) override {
    cuda::vocab_parallel_max(row_max, logits, targets, n, Vb, stream_);
  }
  void vocab_parallel_sums(float* sum_exp, float* target_logit, const float* logits, const float* row_max,
                           const int32_t* targets, int64_t n, int64_t Vb, int64_t v0) override {
    cuda::vocab_parallel_sums(sum_exp, target_logit, logits, row_max, targets, n, Vb, v0, stream_);
  }
  void vocab_parallel_loss(float* dlogits, float* losses, const float* logits, const float* row_max,
                           const float* sum_exp, const float* target_logit, const int32_t* targets, int64_t n,
                           int64_t Vb, int64_t v0, float dscale) override {
    cuda::vocab_parallel_loss(dlogits, losses, logits, row_max, sum_exp, target_logit, targets, n, Vb, v0, dscale,
                              stream_);
  }
  void max_of_blocks(float* out, const float* blocks, int64_t count, int64_t n) override {
    cuda::max_of_blocks(out, blocks, count, n, stream_);
  }

  void adamw_update(float* param, const float* grad, float* m, float* v, const AdamWSegment* segments, int count,
                    const AdamWParams& p, uint16_t* param_bf16) override {
    cuda::adamw_update(param, grad, m, v, segments, count, p, param_bf16, stream_);
  }
  double sum_squares(const float* x, int64_t n) override {
    auto* sums = reinterpret_cast<double*>(sums_.get());
    cuda::sum_squares(sums, x, n, sums + 1, stream_);
    double total = 0.0;
    to_host(&total, sums, sizeof total);
    return total;
  }

 private:
  const int device_;
  cudaStream_t stream_ = nullptr;
  Blas blas_;
  Memory sums_;           // sum_squares' result and workspace
  int64_t baseline_ = 0;  // device bytes in use once made

  // What the device has in use (by every process) and in all.
  static DeviceMemory memory_info() {
    size_t free = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return {static_cast<int64_t>(total - free), static_cast<int64_t>(total)};
  }
};

}  // namespace

std::unique_ptr<Backend> make_backend(const CudaOptions& options) {
  int count = 0;
  const cudaError_t st = cudaGetDeviceCount(&count);
  if (st != cudaSuccess) throw std::runtime_error(std::string("no CUDA device: ") + cudaGetErrorString(st));
  if (options.device < 0 || options.device >= count) {
    throw std::runtime_error("CUDA device " + std::to_string(options.device) + " does not exist (" +
                             std::to_string(count) + " visible)");
  }
  const cudaError_t set = cudaSetDevice(options.device);
  if (set != cudaSuccess) {
    throw std::runtime_error("cannot use CUDA device " + std::to_string(options.device) + ": " +
                             cudaGetErrorString(set));
  }
  return std::make_unique<CudaBackend>(options);
}

}  // namespace tessera::kernels::cuda
