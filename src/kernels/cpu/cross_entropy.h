// CPU fused softmax + cross-entropy (threads over rows). Contract: ref/cross_entropy.h.
#pragma once

#include <cstdint>

namespace tessera::kernels::cpu {

void softmax_cross_entropy(float* dlogits, float* losses, const float* logits, const int32_t* targets, int64_t n,
                           int64_t V, float dscale);

}  // namespace tessera::kernels::cpu
