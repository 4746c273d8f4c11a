// CUDA AdamW over one flat unit per launch. Contract: kernels/ref/adamw.h; the CPU kernel's
// float arithmetic (kernels/cpu/adamw.cc). Device pointers, work queued on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/ref/adamw.h"

namespace tessera::kernels::cuda {

// param_bf16 (optional): also written with each updated parameter rounded to bf16, the image the
// next step's bf16 GEMMs read, in the same pass.
void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWParams& p,
                uint16_t* param_bf16, cudaStream_t stream);

}  // namespace tessera::kernels::cuda
