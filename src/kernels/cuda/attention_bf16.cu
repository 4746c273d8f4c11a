// CUDA causal grouped-query attention with its products on bf16 tensor cores (wmma m16n16k16, fp32
// accumulators): attention.h's bf16 variant. The structure is attention.cu's: a block owns a
// 64-row tile and streams the other side's tiles through shared memory with an online softmax; the
// backward writes dK and dV from one kernel and dQ from another, so nothing is summed with atomics
// and a rerun gives the same bits. A block is four warps, each owning 16 of its tile's rows.
//
// Inputs and outputs are fp32: tiles are rounded to bf16 as they are staged into shared memory. A
// warp's 16 x 64 score tiles go through its shared scratch in fp32, where its lanes (two to a row,
// 32 columns each) do the softmax and the score gradients in fp32, then round the probabilities
// (or score gradients) to bf16 for the next product.
//
// The forward rescales its output accumulators row by row. wmma leaves which fragment element
// holds which (row, column) unspecified, so each warp learns it by loading a tile whose entries are
// their own row numbers (row_ids), and indexes its per-row factors with that.
#include <cuda_bf16.h>
#include <mma.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_common.cuh"

namespace tessera::kernels::cuda::attention_detail {
namespace {
using namespace nvcuda;
using bf16 = __nv_bfloat16;

constexpr int kF = 16;  // a fragment's side
constexpr int kWarps = kTile / kF, kThreads = kWarps * kWarp;
constexpr int kBlocks = kTile / kF;  // fragments across a 64-wide score tile
// Row strides in shared memory, in elements: multiples of 16 bytes as wmma requires, padded by 16
// bytes so that a fragment's rows start in different banks.
template <int D>
constexpr int kHStride = D + 8;      // bf16 (64, D) tiles: Q, K, V, dO
constexpr int kSStride = kTile + 4;  // fp32 (16, 64) score tiles
constexpr int kPStride = kTile + 8;  // bf16 (16, 64) probability and score-gradient tiles
template <int D>
constexpr int kOStride = D + 4;  // fp32 (16, D) output rows staged for the store to global memory
// Per warp fp32 scratch: two score tiles, or one staged output tile.
template <int D>
constexpr int scratch_floats() {
  const int scores = 2 * kF * kSStride, output = kF * kOStride<D>;
  return scores > output ? scores : output;
}
template <int D>
constexpr int kScratch = scratch_floats<D>();

using FragA = wmma::fragment<wmma::matrix_a, kF, kF, kF, bf16, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, kF, kF, kF, bf16, wmma::row_major>;
// A column-major B operand over a row-major tile X reads X^T: K^T, V^T, Q^T, dO^T in place.
using FragBT = wmma::fragment<wmma::matrix_b, kF, kF, kF, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, kF, kF, kF, float>;

constexpr size_t round32(size_t bytes) { return (bytes + 31) / 32 * 32; }

// A kernel's shared memory, taken piece by piece in a fixed order; every piece starts 32-byte
// aligned, as wmma's pointers must. smem_bytes adds up the same pieces for the launch.
struct Carve {
  uint8_t* p;
  template <typename T>
  __device__ T* take(size_t n) {
    T* r = reinterpret_cast<T*>(p);
    p += round32(n * sizeof(T));
    return r;
  }
};

// n_tiles bf16 (64, D) tiles, the warps' scratch, n_ptiles bf16 (16, 64) tiles per warp, and
// `floats` more.
template <int D>
constexpr size_t smem_bytes(int n_tiles, int n_ptiles, size_t floats) {
  return n_tiles * round32(sizeof(bf16) * kTile * kHStride<D>) + round32(sizeof(float) * kWarps * kScratch<D>) +
         n_ptiles * round32(sizeof(bf16) * kWarps * kF * kPStride) + round32(sizeof(float) * floats);
}

// A head's rows t0 .. t0+63, rounded to bf16, into a padded tile (stage_tile).
template <int D>
__device__ __forceinline__ void load_tile(bf16* dst, const float* src, int64_t src_stride, int64_t t0, int64_t T) {
  stage_tile<D, kThreads>(dst, kHStride<D>, src, src_stride, t0, T, [](bf16* p, float4 v) {
    auto* pair = reinterpret_cast<__nv_bfloat162*>(p);
    pair[0] = __floats2bfloat162_rn(v.x, v.y);
    pair[1] = __floats2bfloat162_rn(v.z, v.w);
  });
}

// dst (16, 64) fp32 = A X^T: A the warp's 16 rows of a (64, D) tile, X another (64, D) tile.
template <int D>
__device__ __forceinline__ void scores(float* dst, const bf16* a_rows, const bf16* x) {
#pragma unroll
  for (int n = 0; n < kBlocks; ++n) {
    FragC s;
    wmma::fill_fragment(s, 0.0f);
#pragma unroll
    for (int k = 0; k < D / kF; ++k) {
      FragA a;
      FragBT b;
      wmma::load_matrix_sync(a, a_rows + kF * k, kHStride<D>);
      wmma::load_matrix_sync(b, x + n * kF * kHStride<D> + kF * k, kHStride<D>);
      wmma::mma_sync(s, a, b, s);
    }
    wmma::store_matrix_sync(dst + n * kF, s, kSStride, wmma::mem_row_major);
  }
}

// acc (16, D) += P X: P a warp's bf16 (16, 64) tile, X a (64, D) tile; summed over P's columns in order.
template <int D>
__device__ __forceinline__ void accumulate(FragC (&acc)[D / kF], const bf16* p, const bf16* x) {
#pragma unroll
  for (int k = 0; k < kBlocks; ++k) {
    FragA a;
    wmma::load_matrix_sync(a, p + kF * k, kPStride);
#pragma unroll
    for (int n = 0; n < D / kF; ++n) {
      FragB b;
      wmma::load_matrix_sync(b, x + k * kF * kHStride<D> + n * kF, kHStride<D>);
      wmma::mma_sync(acc[n], a, b, acc[n]);
    }
  }
}

// Writes a warp's (16, D) accumulator times `scale` to its rows before T: tile row r is token
// t0 + r at dst + (t0 + r) * dst_stride. Staged through the warp's scratch, which the caller
// guarantees no lane still reads.
template <int D>
__device__ __forceinline__ void store_rows(float* dst, int64_t dst_stride, FragC (&acc)[D / kF], float scale,
                                           float* stage, int64_t t0, int64_t T) {
#pragma unroll
  for (int n = 0; n < D / kF; ++n) {
#pragma unroll
    for (int i = 0; i < acc[n].num_elements; ++i) acc[n].x[i] *= scale;
    wmma::store_matrix_sync(stage + n * kF, acc[n], kOStride<D>, wmma::mem_row_major);
  }
  __syncwarp();
  for (int i = threadIdx.x % kWarp; i < kF * D; i += kWarp) {
    const int r = i / D, c = i % D;
    if (t0 + r < T) dst[(t0 + r) * dst_stride + c] = stage[r * kOStride<D> + c];
  }
}

// Multiplies each row r of a warp's (16, D) accumulator by factor[r]; rows.x[i] is the row of
// element i (learned by loading row_ids, as the forward does).
template <int D>
__device__ __forceinline__ void scale_rows(FragC (&acc)[D / kF], const FragC& rows, const float* factor) {
#pragma unroll
  for (int n = 0; n < D / kF; ++n) {
#pragma unroll
    for (int i = 0; i < acc[n].num_elements; ++i) acc[n].x[i] *= factor[static_cast<int>(rows.x[i])];
  }
}

// Two bf16s rounded from fp32, stored side by side (p 4-byte aligned).
__device__ __forceinline__ void store_pair(bf16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}

// Grid (tiles, H, B), the q tile with the most key tiles first, as attention.cu's.
template <int D>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(float* out, float* lse, const float* qkv, Dims dims, float scale) {
  extern __shared__ __align__(32) uint8_t smem[];
  Carve carve{smem};
  bf16* qs = carve.take<bf16>(kTile * kHStride<D>);
  bf16* ks = carve.take<bf16>(kTile * kHStride<D>);
  bf16* vs = carve.take<bf16>(kTile * kHStride<D>);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  float* ss = carve.take<float>(kWarps * kScratch<D>) + warp * kScratch<D>;
  bf16* ps = carve.take<bf16>(kWarps * kF * kPStride) + warp * kF * kPStride;
  float* row_ids = carve.take<float>(kF * kF + kWarps * kF);
  float* factor = row_ids + kF * kF + warp * kF;  // the warp's per-row rescale factors

  const int qt = dims.tiles - 1 - static_cast<int>(blockIdx.x), h = blockIdx.y, b = blockIdx.z;
  const int g = h / dims.group, r0 = warp * kF;  // r0: the warp's first row of the tile
  const int row = lane / 2, half = lane % 2;     // softmax: lanes 2r, 2r+1 own row r, 32 columns each
  const int64_t q0 = int64_t{qt} * kTile, T = dims.T;
  const float* tokens = qkv + b * T * dims.row;
  for (int i = threadIdx.x; i < kF * kF; i += kThreads) row_ids[i] = static_cast<float>(i / kF);
  load_tile<D>(qs, tokens + int64_t{h} * D, dims.row, q0, T);
  __syncthreads();
  FragC rows;  // rows.x[i]: the tile row of element i of every accumulator
  wmma::load_matrix_sync(rows, row_ids, kF, wmma::mem_row_major);

  FragC o[D / kF];
#pragma unroll
  for (int n = 0; n < D / kF; ++n) wmma::fill_fragment(o[n], 0.0f);
  float m = -INFINITY, l = 0.0f;  // the row's running max and sum (both lanes of a row hold them)
  for (int kt = 0; kt <= qt; ++kt) {
    __syncthreads();  // every warp is done with the previous K and V tiles
    load_tile<D>(ks, tokens + int64_t{dims.H + g} * D, dims.row, int64_t{kt} * kTile, T);
    load_tile<D>(vs, tokens + int64_t{dims.H + dims.Hkv + g} * D, dims.row, int64_t{kt} * kTile, T);
    __syncthreads();
    scores<D>(ss, qs + r0 * kHStride<D>, ks);
    __syncwarp();

    // Online softmax over the lane's half row. Tiles are square: only the diagonal one has keys
    // after the query. Key 0 is never masked, so m is finite after the first tile.
    const float* srow = ss + row * kSStride + 32 * half;
    float v[32], mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const bool masked = kt == qt && 32 * half + j > r0 + row;
      v[j] = masked ? -INFINITY : srow[j] * scale;
      mx = fmaxf(mx, v[j]);
    }
    const float m_new = fmaxf(m, fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1)));
    const float alpha = expf(m - m_new);  // 0 on the first tile, where m = -inf
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 32; j += 2) {
      const float p0 = expf(v[j] - m_new), p1 = expf(v[j + 1] - m_new);
      sum += p0;
      sum += p1;
      store_pair(ps + row * kPStride + 32 * half + j, p0, p1);
    }
    l = l * alpha + (sum + __shfl_xor_sync(0xffffffffu, sum, 1));
    m = m_new;
    if (half == 0) factor[row] = alpha;
    __syncwarp();
    scale_rows<D>(o, rows, factor);
    accumulate<D>(o, ps, vs);
  }

  __syncwarp();  // every lane has read the last factors
  if (half == 0) factor[row] = 1.0f / l;
  __syncwarp();
  scale_rows<D>(o, rows, factor);
  const int64_t out_stride = int64_t{dims.H} * D;
  store_rows<D>(out + b * T * out_stride + int64_t{h} * D, out_stride, o, 1.0f, ss, q0 + r0, T);
  const int64_t t = q0 + r0 + row;
  if (half == 0 && t < T) lse[(int64_t{b} * dims.H + h) * T + t] = m + logf(l);
}

// dK and dV for one kv tile of one kv head: grid (tiles, Hkv, B). A warp's rows are 16 keys; the
// block walks the group's query heads and, for each, the q tiles from the diagonal on, so every
// contribution to a key's gradient is summed here, in that order. The scores are computed
// transposed (keys by queries), so P^T and dS^T come out as the row-major operands of dV += P^T dO
// and dK += dS^T Q.
template <int D>
__global__ void __launch_bounds__(kThreads) dkv_kernel(float* dqkv, const float* dout, const float* qkv,
                                                       const float* lse, const float* drow, Dims dims, float scale) {
  extern __shared__ __align__(32) uint8_t smem[];
  Carve carve{smem};
  bf16* ks = carve.take<bf16>(kTile * kHStride<D>);
  bf16* vs = carve.take<bf16>(kTile * kHStride<D>);
  bf16* qs = carve.take<bf16>(kTile * kHStride<D>);
  bf16* dos = carve.take<bf16>(kTile * kHStride<D>);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  float* st = carve.take<float>(kWarps * kScratch<D>) + warp * kScratch<D>;  // S^T, then dP^T beside it
  float* dpt = st + kF * kSStride;
  bf16* pt = carve.take<bf16>(kWarps * kF * kPStride) + warp * kF * kPStride;
  bf16* dst = carve.take<bf16>(kWarps * kF * kPStride) + warp * kF * kPStride;
  float* lses = carve.take<float>(2 * kTile);
  float* drs = lses + kTile;

  const int kt = blockIdx.x, g = blockIdx.y, b = blockIdx.z, r0 = warp * kF;
  const int row = lane / 2, half = lane % 2;
  const int64_t k0 = int64_t{kt} * kTile, T = dims.T, out_stride = int64_t{dims.H} * D;
  const int64_t key = k0 + r0 + row;
  const float* tokens = qkv + b * T * dims.row;
  load_tile<D>(ks, tokens + int64_t{dims.H + g} * D, dims.row, k0, T);
  load_tile<D>(vs, tokens + int64_t{dims.H + dims.Hkv + g} * D, dims.row, k0, T);

  FragC dk[D / kF], dv[D / kF];
#pragma unroll
  for (int n = 0; n < D / kF; ++n) wmma::fill_fragment(dk[n], 0.0f), wmma::fill_fragment(dv[n], 0.0f);
  for (int h = g * dims.group; h < (g + 1) * dims.group; ++h) {
    for (int qt = kt; qt < dims.tiles; ++qt) {
      const int64_t q0 = int64_t{qt} * kTile;
      __syncthreads();  // every warp is done with the previous Q and dO tiles
      load_tile<D>(qs, tokens + int64_t{h} * D, dims.row, q0, T);
      load_tile<D>(dos, dout + b * T * out_stride + int64_t{h} * D, out_stride, q0, T);
      load_row_values(lses, lse + (int64_t{b} * dims.H + h) * T, q0, T);
      load_row_values(drs, drow + (int64_t{b} * dims.H + h) * T, q0, T);
      __syncthreads();
      scores<D>(st, ks + r0 * kHStride<D>, qs);
      scores<D>(dpt, vs + r0 * kHStride<D>, dos);
      __syncwarp();
#pragma unroll
      for (int j = 0; j < 32; j += 2) {
        float p[2], ds[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = 32 * half + j + e;  // the query's column in the tile
          const bool live = q0 + c < T && q0 + c >= key;
          p[e] = live ? expf(st[row * kSStride + c] * scale - lses[c]) : 0.0f;
          ds[e] = p[e] * (dpt[row * kSStride + c] - drs[c]);
        }
        store_pair(pt + row * kPStride + 32 * half + j, p[0], p[1]);
        store_pair(dst + row * kPStride + 32 * half + j, ds[0], ds[1]);
      }
      __syncwarp();
      accumulate<D>(dv, pt, dos);  // dV += P^T dO
      accumulate<D>(dk, dst, qs);  // dK += dS^T Q
    }
  }

  float* tok_grads = dqkv + b * T * dims.row;
  store_rows<D>(tok_grads + int64_t{dims.H + g} * D, dims.row, dk, scale, st, k0 + r0, T);
  __syncwarp();  // every lane has copied dK out of the stage
  store_rows<D>(tok_grads + int64_t{dims.H + dims.Hkv + g} * D, dims.row, dv, 1.0f, st, k0 + r0, T);
}

// dQ for one q tile of one query head: grid (tiles, H, B), the longest rows first.
template <int D>
__global__ void __launch_bounds__(kThreads) dq_kernel(float* dqkv, const float* dout, const float* qkv,
                                                      const float* lse, const float* drow, Dims dims, float scale) {
  extern __shared__ __align__(32) uint8_t smem[];
  Carve carve{smem};
  bf16* qs = carve.take<bf16>(kTile * kHStride<D>);
  bf16* dos = carve.take<bf16>(kTile * kHStride<D>);
  bf16* ks = carve.take<bf16>(kTile * kHStride<D>);
  bf16* vs = carve.take<bf16>(kTile * kHStride<D>);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  float* ss = carve.take<float>(kWarps * kScratch<D>) + warp * kScratch<D>;  // S, then dP beside it
  float* dps = ss + kF * kSStride;
  bf16* dss = carve.take<bf16>(kWarps * kF * kPStride) + warp * kF * kPStride;
  float* lses = carve.take<float>(2 * kTile);
  float* drs = lses + kTile;

  const int qt = dims.tiles - 1 - static_cast<int>(blockIdx.x), h = blockIdx.y, b = blockIdx.z;
  const int g = h / dims.group, r0 = warp * kF, row = lane / 2, half = lane % 2;
  const int64_t q0 = int64_t{qt} * kTile, T = dims.T, out_stride = int64_t{dims.H} * D;
  const float* tokens = qkv + b * T * dims.row;
  load_tile<D>(qs, tokens + int64_t{h} * D, dims.row, q0, T);
  load_tile<D>(dos, dout + b * T * out_stride + int64_t{h} * D, out_stride, q0, T);
  load_row_values(lses, lse + (int64_t{b} * dims.H + h) * T, q0, T);
  load_row_values(drs, drow + (int64_t{b} * dims.H + h) * T, q0, T);

  FragC dq[D / kF];
#pragma unroll
  for (int n = 0; n < D / kF; ++n) wmma::fill_fragment(dq[n], 0.0f);
  for (int kt = 0; kt <= qt; ++kt) {
    const int64_t k0 = int64_t{kt} * kTile;
    __syncthreads();  // every warp is done with the previous K and V tiles
    load_tile<D>(ks, tokens + int64_t{dims.H + g} * D, dims.row, k0, T);
    load_tile<D>(vs, tokens + int64_t{dims.H + dims.Hkv + g} * D, dims.row, k0, T);
    __syncthreads();
    scores<D>(ss, qs + r0 * kHStride<D>, ks);
    scores<D>(dps, dos + r0 * kHStride<D>, vs);
    __syncwarp();
    const float row_lse = lses[r0 + row], row_drow = drs[r0 + row];
#pragma unroll
    for (int j = 0; j < 32; j += 2) {
      float ds[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int c = 32 * half + j + e;  // the key's column in the tile
        const bool live = k0 + c <= q0 + r0 + row;
        const float p = live ? expf(ss[row * kSStride + c] * scale - row_lse) : 0.0f;
        ds[e] = p * (dps[row * kSStride + c] - row_drow);
      }
      store_pair(dss + row * kPStride + 32 * half + j, ds[0], ds[1]);
    }
    __syncwarp();
    accumulate<D>(dq, dss, ks);  // dQ += dS K
  }

  __syncwarp();  // every lane has read its scores before the stage overwrites them
  store_rows<D>(dqkv + b * T * dims.row + int64_t{h} * D, dims.row, dq, scale, ss, q0 + r0, T);
}

template <int D>
void forward(float* out, float* lse, const float* qkv, const Dims& dims, int64_t B, cudaStream_t stream) {
  const size_t smem = smem_bytes<D>(3, 1, kF * kF + kWarps * kF);
  allow_smem(forward_kernel<D>, smem);
  const dim3 grid(static_cast<unsigned>(dims.tiles), static_cast<unsigned>(dims.H), static_cast<unsigned>(B));
  forward_kernel<D><<<grid, kThreads, smem, stream>>>(out, lse, qkv, dims, score_scale(D));
  CUDA_CHECK_LAUNCH();
}

template <int D>
void backward(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* drow, const Dims& dims,
              int64_t B, cudaStream_t stream) {
  const float scale = score_scale(D);
  const size_t kv_smem = smem_bytes<D>(4, 2, 2 * kTile);
  allow_smem(dkv_kernel<D>, kv_smem);
  const dim3 kv_grid(static_cast<unsigned>(dims.tiles), static_cast<unsigned>(dims.Hkv), static_cast<unsigned>(B));
  dkv_kernel<D><<<kv_grid, kThreads, kv_smem, stream>>>(dqkv, dout, qkv, lse, drow, dims, scale);
  CUDA_CHECK_LAUNCH();
  const size_t q_smem = smem_bytes<D>(4, 1, 2 * kTile);
  allow_smem(dq_kernel<D>, q_smem);
  const dim3 q_grid(static_cast<unsigned>(dims.tiles), static_cast<unsigned>(dims.H), static_cast<unsigned>(B));
  dq_kernel<D><<<q_grid, kThreads, q_smem, stream>>>(dqkv, dout, qkv, lse, drow, dims, scale);
  CUDA_CHECK_LAUNCH();
}
}  // namespace

void forward_bf16(float* out, float* lse, const float* qkv, const Dims& dims, int64_t B, int64_t D,
                  cudaStream_t stream) {
  with_head_dim(D, [&](auto d) { forward<decltype(d)::value>(out, lse, qkv, dims, B, stream); });
}

void backward_bf16(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* drow,
                   const Dims& dims, int64_t B, int64_t D, cudaStream_t stream) {
  with_head_dim(D, [&](auto d) { backward<decltype(d)::value>(dqkv, dout, qkv, lse, drow, dims, B, stream); });
}

}  // namespace tessera::kernels::cuda::attention_detail
