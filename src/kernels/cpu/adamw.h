// CPU AdamW (threads over elements). Contract: ref/adamw.h.
#pragma once

#include <cstdint>

#include "kernels/ref/adamw.h"

namespace tessera::kernels::cpu {

void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWParams& p);

}  // namespace tessera::kernels::cpu
