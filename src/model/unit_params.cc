// One acquired unit and the weight GEMM over it.
#include "model/unit_params.h"

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/vector.h"

namespace tessera::model {

namespace k = tessera::kernels::cpu;

UnitParams acquire_unit(ParamSource& params, int unit, bool bf16) {
  UnitParams p;
  if (bf16) p.bf16 = params.acquire_bf16(unit);
  if (p.bf16 == nullptr) p.f32 = params.acquire(unit);
  return p;
}

void unit_linear(float* y, const float* x, const UnitParams& p, int64_t offset, int64_t M, int64_t N, int64_t K,
                 float beta, uint16_t* x16) {
  if (p.bf16 != nullptr) {
    k::to_bf16(x16, x, M * K);
    k::gemm_bf16(false, true, M, N, K, 1.0f, x16, K, p.bf16 + offset, K, beta, y, N);
  } else {
    k::gemm(false, true, M, N, K, 1.0f, x, K, p.f32 + offset, K, beta, y, N);
  }
}

}  // namespace tessera::model
