// CPU SwiGLU. Contract: ref/swiglu.h.
#pragma once

#include <cstdint>

namespace tessera::kernels::cpu {

void swiglu_forward(float* out, const float* h13, int64_t n, int64_t F);
void swiglu_backward(float* dh13, const float* dout, const float* h13, int64_t n, int64_t F);

}  // namespace tessera::kernels::cpu
