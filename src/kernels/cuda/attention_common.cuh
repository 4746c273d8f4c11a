// What the two CUDA attentions share (attention.cu, fp32 on CUDA cores; attention_bf16.cu, bf16
// products on tensor cores): the tile, the launch dimensions, the score scale, the supported head
// dims and the softmax backward's row dots. Included by those two files only.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/check.h"
#include "kernels/cuda/common.cuh"

namespace tessera::kernels::cuda::attention_detail {

// A tile is 64 query rows or 64 keys; a block owns one and streams the other side's through
// shared memory.
constexpr int kTile = 64;
constexpr size_t kDefaultSmem = 48 * 1024;

struct Dims {
  int64_t T;
  int64_t row;  // floats per token of qkv and dqkv: (H + 2 * Hkv) * D
  int H, Hkv, group, tiles;
};

inline Dims make_dims(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  CHECK_MSG(Hkv > 0 && H % Hkv == 0, "attention: H must be a positive multiple of Hkv");
  CHECK_MSG(H <= 65535 && B <= 65535, "attention: H and B index grid dimensions (65535 at most)");
  const int64_t tiles = (T + kTile - 1) / kTile;
  CHECK_MSG(tiles <= 0x7fffffff, "attention: T too long for the grid");
  return Dims{T,
              (H + 2 * Hkv) * D,
              static_cast<int>(H),
              static_cast<int>(Hkv),
              static_cast<int>(H / Hkv),
              static_cast<int>(tiles)};
}

// Kernels over 48 KB of dynamic shared memory must say so before their launch.
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > kDefaultSmem) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  }
}

// Calls f(std::integral_constant<int, D>) for a supported head dim; the kernels unroll over D.
template <typename F>
void with_head_dim(int64_t D, F f) {
  switch (D) {
    case 16:
      return f(std::integral_constant<int, 16>{});
    case 32:
      return f(std::integral_constant<int, 32>{});
    case 64:
      return f(std::integral_constant<int, 64>{});
    case 128:
      return f(std::integral_constant<int, 128>{});
    default:
      CHECK_MSG(false, "CUDA attention supports head dims D of 16, 32, 64 and 128 only");
  }
}

// Tiles are read as float4s: the rows' strides are multiples of 4 floats (D is), the bases must be too.
inline void check_aligned(const float* p, const char* what) {
  CHECK_MSG(reinterpret_cast<uintptr_t>(p) % 16 == 0, what);
}

// 1/sqrt(D) rounded once from double, as the reference's scale.
inline float score_scale(int64_t D) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))); }

// Rows t0 .. t0+63 of one head's slice (token t at src + t * src_stride, 16-byte aligned) into a
// padded shared tile of `stride` elements a row, by the kThreads threads of a block, as float4s,
// each handed to put(where its 4 elements go, the float4); rows past T become zeros, so the
// scores they give are finite and the masks drop them. A thread's loads all go out before its
// stores, which the compiler could not move past them (it cannot rule out that the pointers alias).
template <int D, int kThreads, typename Elem, typename Put>
__device__ __forceinline__ void stage_tile(Elem* dst, int stride, const float* src, int64_t src_stride, int64_t t0,
                                           int64_t T, Put put) {
  constexpr int kQuads = D / 4, kPer = kTile * kQuads / kThreads;
  static_assert(kTile * kQuads % kThreads == 0, "whole float4s per thread");
  float4 v[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int idx = threadIdx.x + k * kThreads, r = idx / kQuads, c = idx % kQuads;
    const int64_t t = t0 + r;
    v[k] = t < T ? __ldg(reinterpret_cast<const float4*>(src + t * src_stride) + c) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int idx = threadIdx.x + k * kThreads, r = idx / kQuads, c = idx % kQuads;
    put(dst + r * stride + 4 * c, v[k]);
  }
}

// Per-row values t0 .. t0+63 (lse or dout . out) times `scale` into shared memory, zeros past T.
// A block of at least 64 threads.
__device__ __forceinline__ void load_row_values(float* dst, const float* src, int64_t t0, int64_t T,
                                                float scale = 1.0f) {
  if (threadIdx.x < kTile) {
    const int64_t t = t0 + threadIdx.x;
    dst[threadIdx.x] = t < T ? src[t] * scale : 0.0f;
  }
}

// drow[b, h, t] = dout[b, t, h] . out[b, t, h] (fp32), the softmax backward's sum p . dp, into the
// backward's workspace (attention.cu).
void row_dots(float* drow, const float* dout, const float* out, int64_t B, int64_t T, int64_t H, int64_t D,
              cudaStream_t stream);

// The tensor-core kernels (attention_bf16.cu), for attention.h's entry points: the same contracts,
// checks done by the caller, B, T and H nonzero.
void forward_bf16(float* out, float* lse, const float* qkv, const Dims& dims, int64_t B, int64_t D, int rows_per_warp,
                  cudaStream_t stream);
void backward_bf16(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* drow,
                   const Dims& dims, int64_t B, int64_t D, cudaStream_t stream);

}  // namespace tessera::kernels::cuda::attention_detail
