// CPU RMSNorm (threads over rows; dweight over channels, so no cross-thread reduction).
// Contract: ref/rms_norm.h.
#pragma once

#include <cstdint>

namespace tessera::kernels::cpu {

void rms_norm_forward(float* out, float* rstd, const float* x, const float* weight, int64_t n, int64_t C, float eps);
// out rounded to bf16 as it is written: the bits of rms_norm_forward's out rounded by f32_to_bf16.
void rms_norm_forward_bf16(uint16_t* out, float* rstd, const float* x, const float* weight, int64_t n, int64_t C,
                           float eps);
void rms_norm_backward(float* dx, float* dweight, const float* dout, const float* x, const float* weight,
                       const float* rstd, int64_t n, int64_t C);

}  // namespace tessera::kernels::cpu
