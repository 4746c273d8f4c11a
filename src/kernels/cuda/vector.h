// CUDA elementwise helpers used between ops. Contract: kernels/ref/vector.h; device pointers,
// work queued on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tessera::kernels::cuda {

// y (n) += x (n).
void add_inplace(float* y, const float* x, int64_t n, cudaStream_t stream);
// x (n) *= s.
void scale_inplace(float* x, int64_t n, float s, cudaStream_t stream);
// out (n) = in (n) rounded to bf16 bits (core/bf16.h: nearest even), and back (exact).
void to_bf16(uint16_t* out, const float* in, int64_t n, cudaStream_t stream);
void from_bf16(float* out, const uint16_t* in, int64_t n, cudaStream_t stream);
// Doubles of workspace sum_squares needs.
int64_t sum_squares_workspace_doubles();
// *out (device, one double) = sum of x[i]^2, accumulated in double in a fixed order (the same bits
// every run, whatever the launch timing). The global gradient norm is the root of sums of these.
void sum_squares(double* out, const float* x, int64_t n, double* workspace, cudaStream_t stream);

}  // namespace tessera::kernels::cuda
