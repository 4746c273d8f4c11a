// CUDA AdamW over one flat unit per launch. Contract: kernels/ref/adamw.h; the CPU kernel's
// float arithmetic (kernels/cpu/adamw.cc). Device pointers, work queued on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/ref/adamw.h"

namespace tessera::kernels::cuda {

// A whole unit in one launch (more where it has over 16 segments): its `count` segments
// (AdamWSegment), each element stepped as the CPU's adamw_update steps it. param_bf16 (optional):
// also written with each updated parameter rounded to bf16, the image the next step's bf16 GEMMs
// read, in the same pass.
void adamw_update(float* param, const float* grad, float* m, float* v, const AdamWSegment* segments, int count,
                  const AdamWParams& p, uint16_t* param_bf16, cudaStream_t stream);

}  // namespace tessera::kernels::cuda
