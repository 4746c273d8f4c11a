// CPU SwiGLU. Contract: ref/swiglu.h.
#pragma once

#include <cstdint>

namespace tessera::kernels::cpu {

void swiglu_forward(float* out, const float* h13, int64_t n, int64_t F);
void swiglu_backward(float* dh13, const float* dout, const float* h13, int64_t n, int64_t F);
// The same, each output rounded to bf16 as it is written (the bits of the fp32 ones rounded by
// f32_to_bf16): for mixed precision, whose GEMMs read only the rounding.
void swiglu_forward_bf16(uint16_t* out, const float* h13, int64_t n, int64_t F);
void swiglu_backward_bf16(uint16_t* dh13, const float* dout, const float* h13, int64_t n, int64_t F);

}  // namespace tessera::kernels::cpu
