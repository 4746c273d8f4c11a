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

// Tensor parallelism's vocabulary-parallel cross-entropy over this rank's block of Vb columns
// starting at v0 (contracts: kernels/ref/cross_entropy.h). dlogits may alias logits.
void vocab_parallel_max(float* row_max, const float* logits, const int32_t* targets, int64_t n, int64_t Vb,
                        cudaStream_t stream);
void vocab_parallel_sums(float* sum_exp, float* target_logit, const float* logits, const float* row_max,
                         const int32_t* targets, int64_t n, int64_t Vb, int64_t v0, cudaStream_t stream);
void vocab_parallel_loss(float* dlogits, float* losses, const float* logits, const float* row_max, const float* sum_exp,
                         const float* target_logit, const int32_t* targets, int64_t n, int64_t Vb, int64_t v0,
                         float dscale, cudaStream_t stream);
// out (n) = the elementwise maximum of `count` blocks of n floats (blocks: count x n).
void max_of_blocks(float* out, const float* blocks, int64_t count, int64_t n, cudaStream_t stream);

}  // namespace tessera::kernels::cuda
