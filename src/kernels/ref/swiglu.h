// Reference SwiGLU activation over a fused gate/up activation: out = silu(gate) * up.
#pragma once

#include <cstdint>

namespace tessera::kernels::ref {

// h13 (n, 2F): each row holds gate (w1 x) in [0,F) and up (w3 x) in [F,2F); out (n,F).
void swiglu_forward(float* out, const float* h13, int64_t n, int64_t F);
// dh13 (n, 2F) overwritten; dout (n,F).
void swiglu_backward(float* dh13, const float* dout, const float* h13, int64_t n, int64_t F);

}  // namespace tessera::kernels::ref
