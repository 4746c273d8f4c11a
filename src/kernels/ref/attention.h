// Reference causal grouped-query attention over a fused qkv activation.
//
// qkv (B, T, (H + 2*Hkv) * D): each row holds H query heads, then Hkv key heads, then Hkv value
// heads, D channels each. Query head h uses key/value head h / (H / Hkv). Scale 1/sqrt(D).
#pragma once

#include <cstdint>

namespace tessera::kernels::ref {

// out (B, T, H*D); lse (B, H, T) = log-sum-exp of each query's scaled scores, kept for backward.
void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                       int64_t D);
// dqkv (B, T, (H + 2*Hkv) * D) is overwritten with the gradients of q, k and v.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D);

}  // namespace tessera::kernels::ref
