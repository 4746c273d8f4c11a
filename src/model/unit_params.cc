// One acquired unit and the weight GEMM over it.
#include "model/unit_params.h"

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
    be.linear_bf16(y, x16, bf16_weight(be, p.bf16 + offset, N, K, kernels::WeightUse::kForward, pack), M, N, K, beta);
  } else {
    be.linear(y, x, p.f32 + offset, M, N, K, beta);
  }
}

}  // namespace tessera::model
