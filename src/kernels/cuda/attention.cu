// CUDA causal grouped-query attention in fp32, flash-attention style: a block owns a tile of 64
// query (or key) rows, streams the other side's tiles through shared memory, and keeps its
// scores and accumulators in registers. Backward recomputes the probabilities from the forward's
// log-sum-exp and writes every gradient from one block, so nothing is summed with atomics.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/check.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/common.cuh"

namespace tessera::kernels::cuda {

namespace {
// A tile is 64 query rows or 64 keys. The 256 threads form a 16 x 16 grid: thread (ty, tx) owns
// tile rows 4ty..4ty+3, score columns tx, tx+16, tx+32, tx+48 and D/16 output columns. The 16
// threads sharing a row are one half-warp, so row maxima and sums are shuffles, and a row of
// probabilities passed through shared memory is read back by the warp that wrote it (__syncwarp).
using namespace attention_detail;
constexpr int kThreads = 256;
constexpr int kGrid = 16;
constexpr int kRows = kTile / kGrid;  // rows (and score columns) per thread
constexpr int kPStride = kTile + 4;   // probability rows: the two half-warps' rows 4 apart land 16 banks apart

// Q, K, V and dO rows in shared memory are padded by 4 floats: row starts stay 16-byte aligned for
// float4 reads, and the 8 rows one quarter-warp reads at once (tx + 16j) fall in distinct banks.
template <int D>
constexpr int kStride = D + 4;
// Output columns per thread, and how many of them sit side by side (one vector load).
template <int D>
constexpr int kCols = D / kGrid;
template <int D>
constexpr int kVec = kCols<D> < 4 ? kCols<D> : 4;

// Blocks per SM the register budget aims at: two (128 registers) where shared memory lets two
// blocks of the backward fit, one for D = 128, whose tiles fill shared memory anyway.
template <int D>
constexpr int kMinBlocks = D <= 64 ? 2 : 1;

// The first of thread tx's kVec adjacent output columns in group k; its j-th column is
// group_col(tx, j / kVec) + j % kVec. Adjacent threads read adjacent vectors: no bank conflicts.
template <int D>
__device__ __forceinline__ int group_col(int tx, int k) {
  return kVec<D> * tx + kGrid * kVec<D> * k;
}

// N adjacent floats from p, aligned to N floats, into v[0..N).
template <int N>
__device__ __forceinline__ void load_floats(float* v, const float* p) {
  if constexpr (N == 4) {
    const float4 x = *reinterpret_cast<const float4*>(p);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
  } else if constexpr (N == 2) {
    const float2 x = *reinterpret_cast<const float2*>(p);
    v[0] = x.x, v[1] = x.y;
  } else {
    v[0] = *p;
  }
}

// A head's rows t0 .. t0+63 into a padded fp32 tile (stage_tile).
template <int D>
__device__ __forceinline__ void load_tile(float* dst, const float* src, int64_t src_stride, int64_t t0, int64_t T) {
  stage_tile<D, kThreads>(dst, kStride<D>, src, src_stride, t0, T,
                          [](float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; });
}

// acc[i][j] = a[4ty + i] . b[tx + 16j] over D channels, for two padded shared tiles.
template <int D>
__device__ __forceinline__ void tile_dots(float (&acc)[kRows][kRows], const float* a, const float* b, int ty, int tx) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
#pragma unroll
    for (int j = 0; j < kRows; ++j) acc[i][j] = 0.0f;
  }
  // Not unrolled: a step already has 64 independent FMAs to hide its loads behind, and unrolling
  // pushed the backward kernels' registers into spills.
#pragma unroll 1
  for (int d = 0; d < D; d += 4) {
    float4 av[kRows], bv[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) av[i] = *reinterpret_cast<const float4*>(a + (kRows * ty + i) * kStride<D> + d);
#pragma unroll
    for (int j = 0; j < kRows; ++j) bv[j] = *reinterpret_cast<const float4*>(b + (tx + kGrid * j) * kStride<D> + d);
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        acc[i][j] = fmaf(av[i].x, bv[j].x, acc[i][j]);
        acc[i][j] = fmaf(av[i].y, bv[j].y, acc[i][j]);
        acc[i][j] = fmaf(av[i].z, bv[j].z, acc[i][j]);
        acc[i][j] = fmaf(av[i].w, bv[j].w, acc[i][j]);
      }
    }
  }
}

// acc[i][j] += sum over the 64 tile rows c of p[4ty + i][c] * b[c][column j]: probabilities (or
// score gradients) in p times a padded shared tile, in a fixed order of c.
template <int D>
__device__ __forceinline__ void tile_accumulate(float (&acc)[kRows][kCols<D>], const float* p, const float* b, int ty,
                                                int tx) {
#pragma unroll 2
  for (int c = 0; c < kTile; c += 4) {
    float4 pv[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) pv[i] = *reinterpret_cast<const float4*>(p + (kRows * ty + i) * kPStride + c);
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) {
      float bv[kCols<D>];
#pragma unroll
      for (int k = 0; k < kCols<D> / kVec<D>; ++k) {
        load_floats<kVec<D>>(bv + k * kVec<D>, b + (c + cc) * kStride<D> + group_col<D>(tx, k));
      }
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const float pic = cc == 0 ? pv[i].x : cc == 1 ? pv[i].y : cc == 2 ? pv[i].z : pv[i].w;
#pragma unroll
        for (int j = 0; j < kCols<D>; ++j) acc[i][j] = fmaf(pic, bv[j], acc[i][j]);
      }
    }
  }
}

// Writes v[i][j] for this thread's rows 4ty + i into shared p (stride kPStride), columns tx + 16j.
__device__ __forceinline__ void store_tile(float* p, const float (&v)[kRows][kRows], int ty, int tx) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
#pragma unroll
    for (int j = 0; j < kRows; ++j) p[(kRows * ty + i) * kPStride + tx + kGrid * j] = v[i][j];
  }
}

// Max and sum over the 16 threads of a half-warp, which together hold one row of a score tile.
__device__ __forceinline__ float row_max(float v) {
#pragma unroll
  for (int o = kGrid / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float row_sum(float v) {
#pragma unroll
  for (int o = kGrid / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One step of the online softmax. s: this tile's scaled, masked scores, replaced by exp(s - m) with
// the new running max m; l (running sum) and o (output accumulator) rescaled to that max. Tiles
// run from key 0, which no query masks, so m is finite after the first and exp(m_old - m) never
// sees inf - inf.
template <int D>
__device__ __forceinline__ void online_softmax(float (&s)[kRows][kRows], float (&m)[kRows], float (&l)[kRows],
                                               float (&o)[kRows][kCols<D>]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    float mx = s[i][0];
#pragma unroll
    for (int j = 1; j < kRows; ++j) mx = fmaxf(mx, s[i][j]);
    const float m_new = fmaxf(m[i], row_max(mx));
    const float alpha = expf(m[i] - m_new);  // 0 on the first tile, where m[i] = -inf
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      s[i][j] = expf(s[i][j] - m_new);
      sum += s[i][j];
    }
    l[i] = l[i] * alpha + row_sum(sum);
    m[i] = m_new;
#pragma unroll
    for (int j = 0; j < kCols<D>; ++j) o[i][j] *= alpha;
  }
}

// Writes this thread's rows 4ty + i (those before T) of a (rows, D) accumulator times `scale` to
// dst, where tile row i's token t lands at dst + t * dst_stride.
template <int D>
__device__ __forceinline__ void store_rows(float* dst, int64_t dst_stride, const float (&acc)[kRows][kCols<D>],
                                           const float (&scale)[kRows], int64_t t0, int64_t T, int ty, int tx) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int64_t t = t0 + kRows * ty + i;
    if (t >= T) continue;
#pragma unroll
    for (int j = 0; j < kCols<D>; ++j) {
      dst[t * dst_stride + group_col<D>(tx, j / kVec<D>) + j % kVec<D>] = acc[i][j] * scale[i];
    }
  }
}

// Shared memory of the forward: Q, K and V tiles and one probability tile.
template <int D>
constexpr size_t forward_smem_floats() {
  return 3 * kTile * kStride<D> + kTile * kPStride;
}

// Grid (tiles, H, B); the q tile with the most key tiles starts first, so the last wave is short.
template <int D>
__global__ void __launch_bounds__(kThreads, kMinBlocks<D>)
    forward_kernel(float* out, float* lse, const float* qkv, Dims dims, float scale) {
  extern __shared__ __align__(16) float smem[];
  float* qs = smem;
  float* ks = qs + kTile * kStride<D>;
  float* vs = ks + kTile * kStride<D>;
  float* ps = vs + kTile * kStride<D>;
  const int qt = dims.tiles - 1 - static_cast<int>(blockIdx.x), h = blockIdx.y, b = blockIdx.z;
  const int g = h / dims.group, tx = threadIdx.x % kGrid, ty = threadIdx.x / kGrid;
  const int64_t q0 = int64_t{qt} * kTile;
  const float* tokens = qkv + b * dims.T * dims.row;
  load_tile<D>(qs, tokens + int64_t{h} * D, dims.row, q0, dims.T);

  float o[kRows][kCols<D>] = {}, m[kRows], l[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) m[i] = -INFINITY, l[i] = 0.0f;
  for (int kt = 0; kt <= qt; ++kt) {
    __syncthreads();  // every warp is done with the previous K and V tiles
    load_tile<D>(ks, tokens + int64_t{dims.H + g} * D, dims.row, int64_t{kt} * kTile, dims.T);
    load_tile<D>(vs, tokens + int64_t{dims.H + dims.Hkv + g} * D, dims.row, int64_t{kt} * kTile, dims.T);
    __syncthreads();
    float s[kRows][kRows];
    tile_dots<D>(s, qs, ks, ty, tx);
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        // Tiles are square: only the diagonal one has keys after the query (column > row).
        const bool masked = kt == qt && tx + kGrid * j > kRows * ty + i;
        s[i][j] = masked ? -INFINITY : s[i][j] * scale;
      }
    }
    online_softmax<D>(s, m, l, o);
    store_tile(ps, s, ty, tx);
    __syncwarp();  // the half-warp's rows of ps, written above, are read back by the same warp
    tile_accumulate<D>(o, ps, vs, ty, tx);
  }

  float inv_l[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) inv_l[i] = 1.0f / l[i];
  const int64_t out_stride = int64_t{dims.H} * D;
  store_rows<D>(out + b * dims.T * out_stride + int64_t{h} * D, out_stride, o, inv_l, q0, dims.T, ty, tx);
  if (tx == 0) {
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int64_t t = q0 + kRows * ty + i;
      if (t < dims.T) lse[(int64_t{b} * dims.H + h) * dims.T + t] = m[i] + logf(l[i]);
    }
  }
}

// drow[b, h, t] = dout[b, t, h] . out[b, t, h], the softmax backward's sum p . dp: one warp per
// (token, head) row of `rows` = B * T * H, in the fixed order of warp_sum.
__global__ void row_dot_kernel(float* drow, const float* dout, const float* out, int64_t rows, int64_t T, int64_t H,
                               int D) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = int64_t{gridDim.x} * blockDim.x / kWarp;
  for (int64_t r = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / kWarp; r < rows; r += warps) {
    float sum = 0.0f;
    for (int d = lane; d < D; d += kWarp) sum += dout[r * D + d] * out[r * D + d];
    sum = warp_sum(sum);
    if (lane == 0) {
      const int64_t h = r % H, b = r / H / T, t = r / H % T;
      drow[(b * H + h) * T + t] = sum;
    }
  }
}

// P and dS for one (q tile, kv tile) pair, as a thread holds them in the two backward kernels:
// p[i][j] and dp[i][j] enter as raw q . k and dout . v, and leave as the probabilities and the
// score gradients p (dp - drow) (unscaled; the kernels scale dq and dk once at the end). live(i, j)
// says whether the pair is a query at or after its key, before T; lse_of(i, j) and drow_of(i, j)
// give the query's row values.
template <typename Live, typename Lse, typename Drow>
__device__ __forceinline__ void softmax_grad(float (&p)[kRows][kRows], float (&dp)[kRows][kRows], float scale,
                                             Live live, Lse lse_of, Drow drow_of) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      p[i][j] = live(i, j) ? expf(p[i][j] * scale - lse_of(i, j)) : 0.0f;
      dp[i][j] = p[i][j] * (dp[i][j] - drow_of(i, j));
    }
  }
}

// Shared memory of both backward kernels: four padded (64, D) tiles, one probability tile, and
// the q tile's lse and drow.
template <int D>
constexpr size_t backward_smem_floats() {
  return 4 * kTile * kStride<D> + kTile * kPStride + 2 * kTile;
}

// dK and dV for one kv tile of one kv head: grid (tiles, Hkv, B). Thread rows are keys; the block
// walks the group's query heads and, for each, the q tiles from the diagonal on, so every
// contribution to a key's gradient is summed here, in that order.
template <int D>
__global__ void __launch_bounds__(kThreads, kMinBlocks<D>)
    dkv_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* drow, Dims dims,
               float scale) {
  extern __shared__ __align__(16) float smem[];
  float* ks = smem;
  float* vs = ks + kTile * kStride<D>;
  float* qs = vs + kTile * kStride<D>;
  float* dos = qs + kTile * kStride<D>;
  float* ps = dos + kTile * kStride<D>;
  float* lses = ps + kTile * kPStride;
  float* drs = lses + kTile;
  const int kt = blockIdx.x, g = blockIdx.y, b = blockIdx.z;
  const int tx = threadIdx.x % kGrid, ty = threadIdx.x / kGrid;
  const int64_t k0 = int64_t{kt} * kTile, T = dims.T, out_stride = int64_t{dims.H} * D;
  const float* tokens = qkv + b * T * dims.row;
  load_tile<D>(ks, tokens + int64_t{dims.H + g} * D, dims.row, k0, T);
  load_tile<D>(vs, tokens + int64_t{dims.H + dims.Hkv + g} * D, dims.row, k0, T);

  float dk[kRows][kCols<D>] = {}, dv[kRows][kCols<D>] = {};
  for (int h = g * dims.group; h < (g + 1) * dims.group; ++h) {
    const float* lse_h = lse + (int64_t{b} * dims.H + h) * T;
    const float* drow_h = drow + (int64_t{b} * dims.H + h) * T;
    for (int qt = kt; qt < dims.tiles; ++qt) {
      const int64_t q0 = int64_t{qt} * kTile;
      __syncthreads();  // every warp is done with the previous Q and dO tiles
      load_tile<D>(qs, tokens + int64_t{h} * D, dims.row, q0, T);
      load_tile<D>(dos, dout + b * T * out_stride + int64_t{h} * D, out_stride, q0, T);
      load_row_values(lses, lse_h, q0, T);
      load_row_values(drs, drow_h, q0, T);
      __syncthreads();
      // Transposed tiles: entry (i, j) pairs key 4ty + i with query tx + 16j.
      float p[kRows][kRows], ds[kRows][kRows];
      tile_dots<D>(p, ks, qs, ty, tx);
      tile_dots<D>(ds, vs, dos, ty, tx);
      softmax_grad(
          p, ds, scale,
          [&](int i, int j) {
            const int64_t q = q0 + tx + kGrid * j;
            return q < T && q >= k0 + kRows * ty + i;
          },
          [&](int, int j) { return lses[tx + kGrid * j]; }, [&](int, int j) { return drs[tx + kGrid * j]; });
      store_tile(ps, p, ty, tx);
      __syncwarp();
      tile_accumulate<D>(dv, ps, dos, ty, tx);  // dV += P^T dO
      __syncwarp();                             // all of the warp has read P before dS replaces it
      store_tile(ps, ds, ty, tx);
      __syncwarp();
      tile_accumulate<D>(dk, ps, qs, ty, tx);  // dK += dS^T Q
    }
  }

  float dk_scale[kRows], one[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) dk_scale[i] = scale, one[i] = 1.0f;
  store_rows<D>(dqkv + b * T * dims.row + int64_t{dims.H + g} * D, dims.row, dk, dk_scale, k0, T, ty, tx);
  store_rows<D>(dqkv + b * T * dims.row + int64_t{dims.H + dims.Hkv + g} * D, dims.row, dv, one, k0, T, ty, tx);
}

// dQ for one q tile of one query head: grid (tiles, H, B), the longest rows first as in forward.
template <int D>
__global__ void __launch_bounds__(kThreads, kMinBlocks<D>)
    dq_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* drow, Dims dims,
              float scale) {
  extern __shared__ __align__(16) float smem[];
  float* qs = smem;
  float* dos = qs + kTile * kStride<D>;
  float* ks = dos + kTile * kStride<D>;
  float* vs = ks + kTile * kStride<D>;
  float* ps = vs + kTile * kStride<D>;
  float* lses = ps + kTile * kPStride;
  float* drs = lses + kTile;
  const int qt = dims.tiles - 1 - static_cast<int>(blockIdx.x), h = blockIdx.y, b = blockIdx.z;
  const int g = h / dims.group, tx = threadIdx.x % kGrid, ty = threadIdx.x / kGrid;
  const int64_t q0 = int64_t{qt} * kTile, T = dims.T, out_stride = int64_t{dims.H} * D;
  const float* tokens = qkv + b * T * dims.row;
  load_tile<D>(qs, tokens + int64_t{h} * D, dims.row, q0, T);
  load_tile<D>(dos, dout + b * T * out_stride + int64_t{h} * D, out_stride, q0, T);
  load_row_values(lses, lse + (int64_t{b} * dims.H + h) * T, q0, T);
  load_row_values(drs, drow + (int64_t{b} * dims.H + h) * T, q0, T);

  float dq[kRows][kCols<D>] = {};
  for (int kt = 0; kt <= qt; ++kt) {
    const int64_t k0 = int64_t{kt} * kTile;
    __syncthreads();  // every warp is done with the previous K and V tiles
    load_tile<D>(ks, tokens + int64_t{dims.H + g} * D, dims.row, k0, T);
    load_tile<D>(vs, tokens + int64_t{dims.H + dims.Hkv + g} * D, dims.row, k0, T);
    __syncthreads();
    // Entry (i, j) pairs query 4ty + i with key tx + 16j. Queries past T are not stored.
    float p[kRows][kRows], ds[kRows][kRows];
    tile_dots<D>(p, qs, ks, ty, tx);
    tile_dots<D>(ds, dos, vs, ty, tx);
    softmax_grad(
        p, ds, scale, [&](int i, int j) { return k0 + tx + kGrid * j <= q0 + kRows * ty + i; },
        [&](int i, int) { return lses[kRows * ty + i]; }, [&](int i, int) { return drs[kRows * ty + i]; });
    store_tile(ps, ds, ty, tx);
    __syncwarp();
    tile_accumulate<D>(dq, ps, ks, ty, tx);  // dQ += dS K
  }

  float dq_scale[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) dq_scale[i] = scale;
  store_rows<D>(dqkv + b * T * dims.row + int64_t{h} * D, dims.row, dq, dq_scale, q0, T, ty, tx);
}

}  // namespace

namespace attention_detail {
void row_dots(float* drow, const float* dout, const float* out, int64_t B, int64_t T, int64_t H, int64_t D,
              cudaStream_t stream) {
  const int64_t rows = B * T * H;
  row_dot_kernel<<<grid_for(rows * kWarp, kThreads), kThreads, 0, stream>>>(drow, dout, out, rows, T, H,
                                                                            static_cast<int>(D));
  CUDA_CHECK_LAUNCH();
}
}  // namespace attention_detail

int64_t attention_backward_workspace_floats(int64_t B, int64_t T, int64_t H) { return B * H * T; }

void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                       int64_t D, bool bf16, cudaStream_t stream, int bf16_rows_per_warp) {
  with_head_dim(D, [&](auto d) {
    constexpr int kD = decltype(d)::value;
    const Dims dims = make_dims(B, T, H, Hkv, D);
    check_aligned(qkv, "attention_forward: qkv must be 16-byte aligned");
    if (B == 0 || T == 0 || H == 0) return;
    if (bf16) return forward_bf16(out, lse, qkv, dims, B, D, bf16_rows_per_warp, stream);
    const size_t smem = forward_smem_floats<kD>() * sizeof(float);
    allow_smem(forward_kernel<kD>, smem);
    const dim3 grid(static_cast<unsigned>(dims.tiles), static_cast<unsigned>(H), static_cast<unsigned>(B));
    forward_kernel<kD><<<grid, kThreads, smem, stream>>>(out, lse, qkv, dims, score_scale(D));
    CUDA_CHECK_LAUNCH();
  });
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int64_t B,
                        int64_t T, int64_t H, int64_t Hkv, int64_t D, bool bf16, float* workspace,
                        cudaStream_t stream) {
  with_head_dim(D, [&](auto d) {
    constexpr int kD = decltype(d)::value;
    const Dims dims = make_dims(B, T, H, Hkv, D);
    check_aligned(qkv, "attention_backward: qkv must be 16-byte aligned");
    check_aligned(dout, "attention_backward: dout must be 16-byte aligned");
    if (B == 0 || T == 0 || H == 0) return;
    row_dots(workspace, dout, out, B, T, H, D, stream);
    if (bf16) return backward_bf16(dqkv, dout, qkv, lse, workspace, dims, B, D, stream);

    const size_t smem = backward_smem_floats<kD>() * sizeof(float);
    const float scale = score_scale(D);
    allow_smem(dkv_kernel<kD>, smem);
    const dim3 kv_grid(static_cast<unsigned>(dims.tiles), static_cast<unsigned>(Hkv), static_cast<unsigned>(B));
    dkv_kernel<kD><<<kv_grid, kThreads, smem, stream>>>(dqkv, dout, qkv, lse, workspace, dims, scale);
    CUDA_CHECK_LAUNCH();
    allow_smem(dq_kernel<kD>, smem);
    const dim3 q_grid(static_cast<unsigned>(dims.tiles), static_cast<unsigned>(H), static_cast<unsigned>(B));
    dq_kernel<kD><<<q_grid, kThreads, smem, stream>>>(dqkv, dout, qkv, lse, workspace, dims, scale);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace tessera::kernels::cuda
