// CUDA SwiGLU. Contract: kernels/ref/swiglu.h; device pointers, work queued on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tessera::kernels::cuda {

// h13 (n, 2F): gate in [0,F), up in [F,2F) of each row; out (n,F) = silu(gate) * up.
void swiglu_forward(float* out, const float* h13, int64_t n, int64_t F, cudaStream_t stream);
// dh13 (n, 2F) overwritten; dout (n,F).
void swiglu_backward(float* dh13, const float* dout, const float* h13, int64_t n, int64_t F, cudaStream_t stream);
// The same, each output rounded to bf16 as it is written (as to_bf16 rounds the fp32 ones).
void swiglu_forward_bf16(uint16_t* out, const float* h13, int64_t n, int64_t F, cudaStream_t stream);
void swiglu_backward_bf16(uint16_t* dh13, const float* dout, const float* h13, int64_t n, int64_t F,
                          cudaStream_t stream);

}  // namespace tessera::kernels::cuda
