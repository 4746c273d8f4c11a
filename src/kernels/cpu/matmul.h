// Layer kernels/cpu: the ops of kernels/ref, for speed, with the same contracts. It knows nothing
// of models, parameters or processes.
//
// CPU GEMM through oneDNN, in fp32 and with bf16 inputs. Contract of linear_*: ref/matmul.h.
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

// gemm with A and B in bf16 (bit patterns, core/bf16.h); products and sums in fp32, C fp32.
// Threads over OpenMP; not for use inside a parallel region. The first call with a shape (and
// thread count) builds and keeps a oneDNN primitive; later calls with it allocate nothing.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
               const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);

// B (K, N) of gemm_bf16 packed in the blocked layout oneDNN's bf16 matmul reads (what it otherwise
// copies B into on every call): a weight used by several products, or one product whose B is
// large against its A, is packed once and multiplied from there. packed_b_bytes: the packed
// size, or 0 where bf16_gemm_native() is false (nothing packs). pack_b reads B row-major with row
// stride ldb, or transposed (stored N x K) when trans_b. The layout depends on K and N only.
int64_t packed_b_bytes(int64_t K, int64_t N);
void pack_b(void* packed, bool trans_b, const uint16_t* B, int64_t ldb, int64_t K, int64_t N);
// pack_b through oneDNN's own reorder (pack_b runs Tessera's vnni_pack where it knows the layout
// and the build vectorizes it): the reference its packs are checked against.
void pack_b_reorder(void* packed, bool trans_b, const uint16_t* B, int64_t ldb, int64_t K, int64_t N);
// gemm_bf16 with B packed by pack_b for the same K and N.
void gemm_bf16_packed(bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
                      const void* B_packed, float beta, float* C, int64_t ldc);

// Whether gemm_bf16 runs oneDNN's bf16 kernels (avx512_bf16, AMX) rather than widening its
// inputs for sgemm (CPUs oneDNN has no bf16 matmul for).
bool bf16_gemm_native();

// linear_* with bf16 x, w and dy; y, dx and dw fp32 (dw is added to in fp32).
void linear_forward_bf16(float* y, const uint16_t* x, const uint16_t* w, int64_t M, int64_t N, int64_t K);
void linear_backward_bf16(float* dx, float* dw, const uint16_t* dy, const uint16_t* x, const uint16_t* w, int64_t M,
                          int64_t N, int64_t K, bool accumulate_dx);

// Name of the GEMM library and version, for `tessera info` and benchmark reports.
const char* gemm_library();

}  // namespace tessera::kernels::cpu
