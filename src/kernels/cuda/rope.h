// CUDA rotary position embedding. Contract: kernels/ref/rope.h; the cos/sin table is the CPU's
// (kernels/cpu/rope.h, rope_table: (T, D/2, 2)), copied to the device once per run.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tessera::kernels::cuda {

// x: B*T rows `stride` floats apart; the first n_heads*D floats of each row rotate in place.
void rope_forward(float* x, const float* table, int64_t B, int64_t T, int64_t n_heads, int64_t D, int64_t stride,
                  cudaStream_t stream);
// The gradient: rotates dx by the opposite angle.
void rope_backward(float* dx, const float* table, int64_t B, int64_t T, int64_t n_heads, int64_t D, int64_t stride,
                   cudaStream_t stream);

}  // namespace tessera::kernels::cuda
