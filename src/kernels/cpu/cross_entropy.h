// CPU fused softmax + cross-entropy (threads over rows). Contract: ref/cross_entropy.h.
#pragma once

#include <cstdint>

namespace tessera::kernels::cpu {

void softmax_cross_entropy(float* dlogits, float* losses, const float* logits, const int32_t* targets, int64_t n,
                           int64_t V, float dscale);
// The same with the gradient written rounded to bf16 (core/bf16.h), for a bf16 GEMM to read: the
// bits softmax_cross_entropy's output would round to, without its fp32 pass (dlogits never
// aliases logits here).
void softmax_cross_entropy_bf16(uint16_t* dlogits, float* losses, const float* logits, const int32_t* targets,
                                int64_t n, int64_t V, float dscale);

void vocab_parallel_max(float* row_max, const float* logits, const int32_t* targets, int64_t n, int64_t Vb);
void vocab_parallel_sums(float* sum_exp, float* target_logit, const float* logits, const float* row_max,
                         const int32_t* targets, int64_t n, int64_t Vb, int64_t v0);
void vocab_parallel_loss(float* dlogits, float* losses, const float* logits, const float* row_max,
                         const float* sum_exp, const float* target_logit, const int32_t* targets, int64_t n,
                         int64_t Vb, int64_t v0, float dscale);

}  // namespace tessera::kernels::cpu
