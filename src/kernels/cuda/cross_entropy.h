// CUDA fused softmax + cross-entropy over rows of logits. Contract: kernels/ref/cross_entropy.h;
// device pointers (targets too), work queued on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tessera::kernels::cuda {

// losses (n) = -log softmax(logits[i])[targets[i]]; logits (n,V); a negative target: loss 0,
// gradient 0. dlogits (n,V), when not null, = (softmax - onehot) * dscale; it may alias logits.
void softmax_cross_entropy(float* dlogits, float* losses, const float* logits, const int32_t* targets, int64_t n,
                           int64_t V, float dscale, cudaStream_t stream);
// The same with the gradient rounded to bf16 bits as it is written (the input of bf16 GEMMs).
void softmax_cross_entropy_bf16(uint16_t* dlogits, float* losses, const float* logits, const int32_t* targets,
                                int64_t n, int64_t V, float dscale, cudaStream_t stream);

}  // namespace tessera::kernels::cuda
