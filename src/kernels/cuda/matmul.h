// CUDA GEMMs through cuBLASLt, row-major like kernels/cpu/matmul.h: fp32 or bf16 inputs, fp32
// accumulation and output. Device pointers, work queued on the given stream.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "kernels/cuda/cublaslt.h"

namespace tessera::kernels::cuda {

enum class GemmInput { kF32, kBF16 };

// One cuBLASLt handle, its workspace, and a plan (descriptors and the heuristic's algorithm) per
// GEMM shape, chosen at the shape's first call and reused after: a training step repeats a few
// shapes. Algorithms that reduce split-K parts in place are excluded, so a shape gives the same
// bits every run. One Blas per stream; not thread-safe.
class Blas {
 public:
  // allow_tf32: fp32 GEMMs on TF32 tensor cores (model.allow_tf32); off, they are IEEE fp32.
  explicit Blas(bool allow_tf32 = false, size_t workspace_bytes = size_t{32} << 20);
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  ~Blas();

  // C (M,N) = alpha op(A) op(B) + beta C, op(A) (M,K) and op(B) (K,N); A, B of `input` type (bf16
  // as uint16_t bit patterns), C fp32; lda, ldb, ldc the row strides of the stored matrices.
  void gemm(GemmInput input, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
            int64_t lda, const void* B, int64_t ldb, float beta, float* C, int64_t ldc, cudaStream_t stream);

  size_t plans() const { return plans_.size(); }

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // input, trans_a, trans_b, M, N, K, lda, ldb, ldc, the alignments of A, B and C, beta != 0.
  using Key = std::tuple<int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, bool>;
  Plan& plan(const Key& key);

  const CublasLt& lt_;  // cuBLASLt's entry points (cublaslt.h)
  bool allow_tf32_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_;
  std::map<Key, Plan> plans_;
};

// The model's linear layer, weights (out, in) as PyTorch stores them (kernels/ref/matmul.h):
// y (M,N) = x (M,K) . w (N,K)^T + beta y.
void linear_forward(Blas& blas, float* y, const float* x, const float* w, int64_t M, int64_t N, int64_t K, float beta,
                    cudaStream_t stream);
// dx (M,K) = dy . w (added to when accumulate_dx; skipped when dx is null); dw (N,K) += dy^T . x.
void linear_backward(Blas& blas, float* dx, float* dw, const float* dy, const float* x, const float* w, int64_t M,
                     int64_t N, int64_t K, bool accumulate_dx, cudaStream_t stream);
// The same on bf16 inputs (bit patterns), fp32 accumulation and outputs.
void linear_forward_bf16(Blas& blas, float* y, const uint16_t* x, const uint16_t* w, int64_t M, int64_t N, int64_t K,
                         float beta, cudaStream_t stream);
void linear_backward_bf16(Blas& blas, float* dx, float* dw, const uint16_t* dy, const uint16_t* x, const uint16_t* w,
                          int64_t M, int64_t N, int64_t K, bool accumulate_dx, cudaStream_t stream);

}  // namespace tessera::kernels::cuda
