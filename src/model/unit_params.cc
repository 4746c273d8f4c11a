// One acquired unit and the weight GEMM over it.
#include "model/unit_params.h"

#include "core/check.h"

namespace tessera::model {

UnitParams acquire_unit(ParamSource& params, int unit, bool bf16) {
  UnitParams p;
  if (bf16) p.bf16 = params.acquire_bf16(unit);
  if (p.bf16 == nullptr) p.f32 = params.acquire(unit);
  return p;
}

kernels::Bf16Weight bf16_weight(kernels::Backend& be, const uint16_t* w, int64_t N, int64_t K, kernels::WeightUse use,
                                void* pack) {
  if (pack == nullptr) return w;
  be.pack_weight_bf16(pack, w, N, K, use);
  return kernels::Bf16Weight::packed(pack);
}

void unit_linear(kernels::Backend& be, float* y, const float* x, const UnitParams& p, int64_t offset, int64_t M,
                 int64_t N, int64_t K, float beta, uint16_t* x16, void* pack) {
  if (p.bf16 != nullptr) {
    be.to_bf16(x16, x, M * K);
    unit_linear_bf16(be, y, x16, p, offset, M, N, K, beta, pack);
  } else {
    be.linear(y, x, p.f32 + offset, M, N, K, beta);
  }
}

void unit_linear_bf16(kernels::Backend& be, float* y, const uint16_t* x16, const UnitParams& p, int64_t offset,
                      int64_t M, int64_t N, int64_t K, float beta, void* pack) {
  CHECK_MSG(p.bf16 != nullptr, "bf16 input rows for a unit without a bf16 image");
  be.linear_bf16(y, x16, bf16_weight(be, p.bf16 + offset, N, K, kernels::WeightUse::kForward, pack), M, N, K, beta);
}

}  // namespace tessera::model
