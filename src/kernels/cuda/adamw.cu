// CUDA AdamW: one thread per element, grid-stride; the coefficients computed once on the host as
// the CPU kernel computes them, so both backends take the same float steps.
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/common.cuh"

namespace tessera::kernels::cuda {

namespace {
constexpr int kThreads = 256;

__global__ void adamw_kernel(const AdamWCoefficients c, int64_t n, float* __restrict__ param,
                             const float* __restrict__ grad, float* __restrict__ m, float* __restrict__ v,
                             uint16_t* __restrict__ image) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    // __fmul_rn and friends keep each product and sum rounded as the CPU rounds it (nvcc would
    // contract a * b + c into one fma, with different bits).
    const float g = __fmul_rn(grad[i], c.scale);
    const float mi = __fadd_rn(__fmul_rn(c.b1, m[i]), __fmul_rn(1.0f - c.b1, g));
    const float vi = __fadd_rn(__fmul_rn(c.b2, v[i]), __fmul_rn(__fmul_rn(1.0f - c.b2, g), g));
    m[i] = mi;
    v[i] = vi;
    const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), c.inv_sqrt_bc2), c.eps);
    const float p = __fsub_rn(__fmul_rn(param[i], c.decay), __fdiv_rn(__fmul_rn(c.step_size, mi), denom));
    param[i] = p;
    if (image != nullptr) image[i] = to_bf16_bits(p);
  }
}
}  // namespace

void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWParams& p,
                uint16_t* param_bf16, cudaStream_t stream) {
  if (n == 0) return;
  adamw_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(adamw_coefficients(p), n, param, grad, m, v, param_bf16);
  CUDA_CHECK_LAUNCH();
}

}  // namespace tessera::kernels::cuda
