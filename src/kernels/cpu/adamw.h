// CPU AdamW (threads over elements). Contract: ref/adamw.h.
#pragma once

#include <cstdint>

#include "kernels/ref/adamw.h"

namespace tessera::kernels::cpu {

// param_bf16 (optional): also written, with each updated parameter rounded to bf16 (core/bf16.h),
// the image the next step's bf16 GEMMs read, in the same pass.
void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWParams& p,
                uint16_t* param_bf16 = nullptr);
// A whole unit in one pass: its `count` segments (AdamWSegment), each element stepped exactly as
// adamw_step steps it with the segment's weight decay (or none).
void adamw_update(float* param, const float* grad, float* m, float* v, const AdamWSegment* segments, int count,
                  const AdamWParams& p, uint16_t* param_bf16 = nullptr);

}  // namespace tessera::kernels::cpu
