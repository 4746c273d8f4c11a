// CUDA RMSNorm. Contract: kernels/ref/rms_norm.h; device pointers, work queued on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tessera::kernels::cuda {

// out (n,C), rstd (n) = 1/sqrt(mean(x^2)+eps); x (n,C), weight (C). out may not alias x.
void rms_norm_forward(float* out, float* rstd, const float* x, const float* weight, int64_t n, int64_t C, float eps,
                      cudaStream_t stream);
// out rounded to bf16 as it is written: rms_norm_forward's out rounded as to_bf16 rounds it.
void rms_norm_forward_bf16(uint16_t* out, float* rstd, const float* x, const float* weight, int64_t n, int64_t C,
                           float eps, cudaStream_t stream);
// Floats of workspace rms_norm_backward needs for n rows of C.
int64_t rms_norm_backward_workspace_floats(int64_t n, int64_t C);
// dx (n,C) += d/dx, dweight (C) += d/dweight. The weight gradient sums over rows in a fixed order
// (row chunks, then the chunks), never with atomics: the same inputs give the same bits.
void rms_norm_backward(float* dx, float* dweight, const float* dout, const float* x, const float* weight,
                       const float* rstd, int64_t n, int64_t C, float* workspace, cudaStream_t stream);

}  // namespace tessera::kernels::cuda
