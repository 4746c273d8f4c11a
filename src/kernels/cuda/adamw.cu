// CUDA AdamW: one thread per element, grid-stride, a whole unit a launch; the coefficients computed
// once on the host as the CPU kernel computes them, so both backends take the same float steps.
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/common.cuh"

namespace tessera::kernels::cuda {

namespace {
constexpr int kThreads = 256;

// Up to kMaxSegments of a unit's segments, by value in the launch's parameters; a unit with more
// takes more launches.
constexpr int kMaxSegments = 16;
struct Segments {
  int count;
  int64_t end[kMaxSegments];  // relative to the launch's first element
  bool decay[kMaxSegments];
};

__global__ void adamw_kernel(const AdamWCoefficients with, const AdamWCoefficients without, const Segments segments,
                             float* __restrict__ param, const float* __restrict__ grad, float* __restrict__ m,
                             float* __restrict__ v, uint16_t* __restrict__ image) {
  const int64_t n = segments.end[segments.count - 1];
  int s = 0;  // the segment of i: i only grows
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    while (i >= segments.end[s]) ++s;
    const AdamWCoefficients& c = segments.decay[s] ? with : without;
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

void adamw_update(float* param, const float* grad, float* m, float* v, const AdamWSegment* segments, int count,
                  const AdamWParams& p, uint16_t* param_bf16, cudaStream_t stream) {
  const AdamWCoefficients with = adamw_coefficients(p, true), without = adamw_coefficients(p, false);
  int64_t begin = 0;  // the first element of the segments left
  for (int s = 0; s < count;) {
    Segments table{};
    int64_t last = begin;
    for (; s < count && table.count < kMaxSegments; ++s) {
      if (segments[s].end <= last) continue;  // empty
      last = segments[s].end;
      table.end[table.count] = last - begin;
      table.decay[table.count++] = segments[s].decay;
    }
    if (table.count == 0) break;
    adamw_kernel<<<grid_for(last - begin, kThreads), kThreads, 0, stream>>>(
        with, without, table, param + begin, grad + begin, m + begin, v + begin,
        param_bf16 == nullptr ? nullptr : param_bf16 + begin);
    CUDA_CHECK_LAUNCH();
    begin = last;
  }
}

}  // namespace tessera::kernels::cuda
