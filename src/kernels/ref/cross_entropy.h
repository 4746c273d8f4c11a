// Reference fused softmax + cross-entropy over rows of logits.
#pragma once

#include <cstdint>

namespace tessera::kernels::ref {

// losses (n) = -log softmax(logits[i])[targets[i]]; logits (n,V). A negative target is ignored:
// loss 0, gradient 0. When dlogits (n,V) is not null it receives (softmax - onehot) * dscale; it
// may alias logits.
void softmax_cross_entropy(float* dlogits, float* losses, const float* logits, const int32_t* targets, int64_t n,
                           int64_t V, float dscale);

// Vocabulary-parallel softmax cross-entropy (Megatron-LM's), the part one rank of a
// tensor-parallel group computes on its block of the vocabulary: token ids [v0, v0 + Vb), logits
// (n, Vb). The whole rows are never in one place. Between the passes the group all-reduces:
// row_max by maximum after the first, sum_exp and target_logit by sum after the second. The
// third then gives each rank the losses (n) and its block of the gradient that
// softmax_cross_entropy gives over the whole vocabulary. A negative target is ignored (loss 0,
// gradient 0; its statistics are 0).
void vocab_parallel_max(float* row_max, const float* logits, const int32_t* targets, int64_t n, int64_t Vb);
// sum_exp (n) = sum over the block of exp(logit - row_max); target_logit (n) = the target's
// logit when this block holds it, else 0.
void vocab_parallel_sums(float* sum_exp, float* target_logit, const float* logits, const float* row_max,
                         const int32_t* targets, int64_t n, int64_t Vb, int64_t v0);
// losses (n) = log(sum_exp) + row_max - target_logit; dlogits (n, Vb), when not null, =
// (softmax - onehot) * dscale over the block; it may alias logits.
void vocab_parallel_loss(float* dlogits, float* losses, const float* logits, const float* row_max,
                         const float* sum_exp, const float* target_logit, const int32_t* targets, int64_t n,
                         int64_t Vb, int64_t v0, float dscale);

}  // namespace tessera::kernels::ref
