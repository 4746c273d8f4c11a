// Reference fused softmax + cross-entropy over rows of logits.
#pragma once

#include <cstdint>

namespace tessera::kernels::ref {

// losses (n) = -log softmax(logits[i])[targets[i]]; logits (n,V). A negative target is ignored:
// loss 0, gradient 0. When dlogits (n,V) is not null it receives (softmax - onehot) * dscale; it
// may alias logits.
void softmax_cross_entropy(float* dlogits, float* losses, const float* logits, const int32_t* targets, int64_t n,
                           int64_t V, float dscale);

}  // namespace tessera::kernels::ref
