// cuBLASLt GEMMs: a row-major product is the column-major product of the transposes with the
// operands swapped (C^T = op(B)^T op(A)^T), so no data moves.
#include "kernels/cuda/matmul.h"

#include <cstdint>

#include "core/check.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cublaslt.h"

namespace tessera::kernels::cuda {

namespace {
// The largest power of two (at most 256, cuBLASLt's default assumption) dividing the address.
int alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

cudaDataType_t data_type(GemmInput input) { return input == GemmInput::kBF16 ? CUDA_R_16BF : CUDA_R_32F; }

template <typename T>
void set_pref(const CublasLt& lt, cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, T value) {
  CUBLAS_CHECK(lt.cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof value));
}
}  // namespace

Blas::Blas(bool allow_tf32, size_t workspace_bytes)
    : lt_(cublaslt()), allow_tf32_(allow_tf32), workspace_bytes_(workspace_bytes) {
  CUBLAS_CHECK(lt_.cublasLtCreate(&handle_));
  CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

Blas::~Blas() {
  for (auto& [key, p] : plans_) {
    lt_.cublasLtMatrixLayoutDestroy(p.a);
    lt_.cublasLtMatrixLayoutDestroy(p.b);
    lt_.cublasLtMatrixLayoutDestroy(p.c);
    lt_.cublasLtMatmulDescDestroy(p.desc);
  }
  cudaFree(workspace_);
  lt_.cublasLtDestroy(handle_);
}

Blas::Plan& Blas::plan(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  const auto [in, trans_a, trans_b, M, N, K, lda, ldb, ldc, align_a, align_b, align_c, has_beta] = key;
  const GemmInput input = static_cast<GemmInput>(in);
  const cudaDataType_t type = data_type(input);
  Plan p;
  const cublasComputeType_t compute =
      input == GemmInput::kF32 && allow_tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  CUBLAS_CHECK(lt_.cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F));
  // Column-major: the library's A is our B and its B our A (the file's comment).
  const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(lt_.cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  CUBLAS_CHECK(lt_.cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  // Stored shapes, column-major: our B is (K,N) row-major = (N,K) column-major, or its transpose.
  CUBLAS_CHECK(lt_.cublasLtMatrixLayoutCreate(&p.a, type, trans_b ? K : N, trans_b ? N : K, ldb));
  CUBLAS_CHECK(lt_.cublasLtMatrixLayoutCreate(&p.b, type, trans_a ? M : K, trans_a ? K : M, lda));
  CUBLAS_CHECK(lt_.cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, N, M, ldc));

  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(lt_.cublasLtMatmulPreferenceCreate(&pref));
  set_pref(lt_, pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(workspace_bytes_));
  // Split-K parts summed in place in the output would make the sum's order (and bits) vary.
  set_pref(lt_, pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
           static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_MASK & ~CUBLASLT_REDUCTION_SCHEME_INPLACE));
  set_pref(lt_, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(align_b));
  set_pref(lt_, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(align_a));
  set_pref(lt_, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(align_c));
  set_pref(lt_, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(align_c));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  CUBLAS_CHECK(lt_.cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found));
  lt_.cublasLtMatmulPreferenceDestroy(pref);
  CHECK_MSG(found > 0, "cuBLASLt has no algorithm for a GEMM shape");
  p.algo = result.algo;
  (void)has_beta;  // beta's zeroness is in the key: a heuristic may choose differently for it
  return plans_.emplace(key, p).first->second;
}

void Blas::gemm(GemmInput input, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                const void* A, int64_t lda, const void* B, int64_t ldb, float beta, float* C, int64_t ldc,
                cudaStream_t stream) {
  if (M == 0 || N == 0) return;
  const Key key{static_cast<int>(input),
                trans_a,
                trans_b,
                M,
                N,
                K,
                lda,
                ldb,
                ldc,
                alignment(A),
                alignment(B),
                alignment(C),
                beta != 0.0f};
  const Plan& p = plan(key);
  CUBLAS_CHECK(lt_.cublasLtMatmul(handle_, p.desc, &alpha, B, p.a, A, p.b, &beta, C, p.c, C, p.c, &p.algo, workspace_,
                                  workspace_bytes_, stream));
}

void linear_forward(Blas& blas, float* y, const float* x, const float* w, int64_t M, int64_t N, int64_t K, float beta,
                    cudaStream_t stream) {
  blas.gemm(GemmInput::kF32, false, true, M, N, K, 1.0f, x, K, w, K, beta, y, N, stream);
}

void linear_backward(Blas& blas, float* dx, float* dw, const float* dy, const float* x, const float* w, int64_t M,
                     int64_t N, int64_t K, bool accumulate_dx, cudaStream_t stream) {
  if (dx != nullptr)
    blas.gemm(GemmInput::kF32, false, false, M, K, N, 1.0f, dy, N, w, K, accumulate_dx ? 1.0f : 0.0f, dx, K, stream);
  blas.gemm(GemmInput::kF32, true, false, N, K, M, 1.0f, dy, N, x, K, 1.0f, dw, K, stream);
}

void linear_forward_bf16(Blas& blas, float* y, const uint16_t* x, const uint16_t* w, int64_t M, int64_t N, int64_t K,
                         float beta, cudaStream_t stream) {
  blas.gemm(GemmInput::kBF16, false, true, M, N, K, 1.0f, x, K, w, K, beta, y, N, stream);
}

void linear_backward_bf16(Blas& blas, float* dx, float* dw, const uint16_t* dy, const uint16_t* x, const uint16_t* w,
                          int64_t M, int64_t N, int64_t K, bool accumulate_dx, cudaStream_t stream) {
  if (dx != nullptr)
    blas.gemm(GemmInput::kBF16, false, false, M, K, N, 1.0f, dy, N, w, K, accumulate_dx ? 1.0f : 0.0f, dx, K, stream);
  blas.gemm(GemmInput::kBF16, true, false, N, K, M, 1.0f, dy, N, x, K, 1.0f, dw, K, stream);
}

}  // namespace tessera::kernels::cuda
