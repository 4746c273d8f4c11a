// CPU GEMM through oneDNN. Contract of linear_*: ref/matmul.h.
#pragma once

#include <cstdint>

namespace tessera::kernels::cpu {

void linear_forward(float* y, const float* x, const float* w, int64_t M, int64_t N, int64_t K);
void linear_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, int64_t M, int64_t N,
                     int64_t K, bool accumulate_dx);

// Row-major C (M,N) = alpha * op(A) . op(B) + beta * C, op = transpose when trans_* is set;
// lda/ldb/ldc are row strides. Runs on the calling thread when called inside a parallel region.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// Name of the GEMM library and version, for `tessera info` and benchmark reports.
const char* gemm_library();

}  // namespace tessera::kernels::cpu
