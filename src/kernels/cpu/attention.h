// CPU causal grouped-query attention: one (batch, head) at a time per thread, scores for that head
// in a T x T workspace block, recomputed in backward from the saved log-sum-exp (never B*H*T*T).
// Contract: ref/attention.h.
#pragma once

#include <cstdint>

namespace tessera::kernels::cpu {

// Floats of workspace that attention_forward/backward need for `threads` threads.
int64_t attention_workspace_floats(int64_t T, int64_t D, int threads);

void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                       int64_t D, float* workspace);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, float* workspace);

}  // namespace tessera::kernels::cpu
