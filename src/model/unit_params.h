// One acquired unit as the model's kernels read it, and the weight GEMM over it: shared by the
// training model (llama.h) and the decoder (decoder.h), which both take their parameters from a
// ParamSource unit by unit, in fp32 or as bf16 images.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "model/param_source.h"

namespace tessera::model {

// The unit's fp32 buffer, or (bf16 compute) its bf16 image.
struct UnitParams {
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;
};

// The unit from `params`: its bf16 image when `bf16` is asked for and the source offers one,
// else its fp32 buffer. The caller releases it.
UnitParams acquire_unit(ParamSource& params, int unit, bool bf16);

// W (N, K)'s bf16 image w as a product for `use` reads it: packed into `pack` first
// (Backend::pack_weight_bf16) when the caller planned one, else the image itself.
kernels::Bf16Weight bf16_weight(kernels::Backend& be, const uint16_t* w, int64_t N, int64_t K, kernels::WeightUse use,
                                void* pack);

// y (M, N) = x (M, K) . W^T + beta y on `be`, W the (N, K) tensor at `offset` in the unit. With a
// bf16 image the product takes bf16 inputs (x rounded into x16, M x K of them; W packed into
// `pack` first when not null) and accumulates in fp32.
void unit_linear(kernels::Backend& be, float* y, const float* x, const UnitParams& p, int64_t offset, int64_t M,
                 int64_t N, int64_t K, float beta, uint16_t* x16, void* pack = nullptr);

// The same for input rows x16 already rounded to bf16; the unit must have a bf16 image.
void unit_linear_bf16(kernels::Backend& be, float* y, const uint16_t* x16, const UnitParams& p, int64_t offset,
                      int64_t M, int64_t N, int64_t K, float beta, void* pack = nullptr);

}  // namespace tessera::model
