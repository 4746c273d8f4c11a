// Device-side helpers the kernels share: grid sizing, warp and block reductions, bf16 rounding
// with core/bf16.h's bits. Included by .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/check.h"

namespace tessera::kernels::cuda {

constexpr int kWarp = 32;

// Blocks of `threads` covering n items, one per thread, capped (grid-stride loops take the rest).
inline unsigned grid_for(int64_t n, int threads, int64_t cap = 65535LL * 8) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > cap ? cap : blocks));
}

// Sum (or max) over each aligned group of kLanes lanes (the whole warp by default), the result in
// every lane of the group. Every lane of the warp calls it.
template <int kLanes = kWarp>
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int kLanes = kWarp>
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (or max) over the whole block, the result in every thread; `scratch` holds 32 floats of shared
// memory. Fixed shapes of reduction: the same inputs give the same bits. blockDim.x a multiple of 32.
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  v = kMax ? warp_max(v) : warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : (kMax ? -INFINITY : 0.0f);
  return kMax ? warp_max(v) : warp_sum(v);
}
__device__ __forceinline__ float block_sum(float v, float* scratch) { return block_reduce<false>(v, scratch); }
__device__ __forceinline__ float block_max(float v, float* scratch) { return block_reduce<true>(v, scratch); }

// fp32 -> bf16 bits, round to nearest even, NaN kept a (quiet) NaN: core/bf16.h's f32_to_bf16.
__device__ __forceinline__ uint16_t to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
__device__ __forceinline__ float from_bf16_bits(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }
// Stores v as a kernel's output type: a float as is, or rounded by to_bf16_bits.
__device__ __forceinline__ void store_as(float* out, float v) { *out = v; }
__device__ __forceinline__ void store_as(uint16_t* out, float v) { *out = to_bf16_bits(v); }

}  // namespace tessera::kernels::cuda
