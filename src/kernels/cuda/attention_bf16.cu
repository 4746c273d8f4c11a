// CUDA causal grouped-query attention with its products on bf16 tensor cores, FlashAttention-2's
// way: attention.h's bf16 variant. The structure is attention.cu's: a block owns a tile of rows and
// streams the other side's 64-row tiles through shared memory with an online softmax; the backward
// writes dK and dV from one kernel and dQ from another, so nothing is summed with atomics and a
// rerun gives the same bits. A block is four warps, each owning 16 of its tile's 64 rows, or in the
// forward's second tiling 32 of 128.
//
// Inputs and outputs are fp32: tiles are rounded to bf16 as they are staged into shared memory.
// Products are mma.sync m16n8k16 with fp32 accumulators (mma.cuh), their operands read from the
// tiles by ldmatrix. A warp's scores stay in its registers: the softmax (or the score gradient) is
// computed there in fp32, each lane owning two rows' worth of columns, and the probabilities are
// rounded into the A operand of the next product straight from the accumulator registers (their
// layouts line up: two 16 x 8 accumulators are one 16 x 16 A fragment). The exponentials are exp2f
// of scores pre-multiplied by log2(e); the saved log-sum-exp is natural, as the reference's.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/mma.cuh"

namespace tessera::kernels::cuda::attention_detail {
namespace {
using bf16 = __nv_bfloat16;

constexpr int kRows = 16;  // a warp's rows of the block's tile
constexpr int kWarps = kTile / kRows, kThreads = kWarps * kWarp;
constexpr float kLog2e = 1.4426950408889634f;
// Row stride of a bf16 (64, D) tile in shared memory, in elements: padded by 16 bytes, so the
// eight 16-byte rows one ldmatrix tile reads start in different banks.
template <int D>
constexpr int kStride = D + 8;
template <int D>
constexpr size_t kTileBytes = sizeof(bf16) * kTile* kStride<D>;

// A kernel's shared memory: n_tiles bf16 (64, D) tiles, then `floats` floats.
template <int D>
constexpr size_t smem_bytes(int n_tiles, int floats) {
  return n_tiles * kTileBytes<D> + sizeof(float) * floats;
}
// Its tile i (i = n_tiles: where the floats start).
template <int D>
__device__ __forceinline__ bf16* smem_tile(uint8_t* smem, int i) {
  return reinterpret_cast<bf16*>(smem + i * kTileBytes<D>);
}

// A head's rows t0 .. t0+63, rounded to bf16, into a padded tile (stage_tile).
template <int D>
__device__ __forceinline__ void load_tile(bf16* dst, const float* src, int64_t src_stride, int64_t t0, int64_t T) {
  stage_tile<D, kThreads>(dst, kStride<D>, src, src_stride, t0, T, [](bf16* p, float4 v) {
    auto* pair = reinterpret_cast<__nv_bfloat162*>(p);
    pair[0] = __floats2bfloat162_rn(v.x, v.y);
    pair[1] = __floats2bfloat162_rn(v.z, v.w);
  });
}

__device__ __forceinline__ int lane_id() { return static_cast<int>(threadIdx.x % kWarp); }

// acc[i] (16 x N) += A_i X^T for i < M: A_i rows a_row0 + 64 i .. +15 of tile a, X rows x_row0 ..
// x_row0+N-1 of tile x, both (rows, D) tiles, summed over D. ldmatrix reads X's rows as B's n-by-k
// fragments, each feeding the M products.
template <int D, int N, int M = 1>
__device__ __forceinline__ void mma_abt(float (*acc)[N / 8][4], const bf16* a, int a_row0, const bf16* x, int x_row0) {
  const int lane = lane_id();
#pragma unroll
  for (int k = 0; k < D; k += 16) {
    uint32_t af[M][4];
#pragma unroll
    for (int i = 0; i < M; ++i)
      ldmatrix_x4(af[i], a + (a_row0 + kTile * i + lane % 16) * kStride<D> + k + 8 * (lane / 16));
#pragma unroll
    for (int n = 0; n < N; n += 16) {
      uint32_t bf[4];  // n-blocks n and n + 8
      ldmatrix_x4(bf, x + (x_row0 + n + lane % 8 + 8 * (lane / 16)) * kStride<D> + k + 8 * (lane / 8 % 2));
#pragma unroll
      for (int i = 0; i < M; ++i) {
        mma_bf16(acc[i][n / 8], af[i], bf[0], bf[1]);
        mma_bf16(acc[i][n / 8 + 1], af[i], bf[2], bf[3]);
      }
    }
  }
}

// A (16 x K) fp32 accumulator rounded to bf16 as K / 16 A fragments (two 16 x 8 accumulators are
// one 16 x 16 A fragment).
template <int K>
__device__ __forceinline__ void to_a_fragments(uint32_t (&a)[K / 16][4], const float (&p)[K / 8][4]) {
#pragma unroll
  for (int k = 0; k < K / 16; ++k) {
    const float(&lo)[4] = p[2 * k];
    const float(&hi)[4] = p[2 * k + 1];
    a[k][0] = pack_bf16(lo[0], lo[1]), a[k][1] = pack_bf16(lo[2], lo[3]);
    a[k][2] = pack_bf16(hi[0], hi[1]), a[k][3] = pack_bf16(hi[2], hi[3]);
  }
}

// acc[i] (16 x D) += P_i X for i < M: P_i (16 x K) as A fragments pa[i] (to_a_fragments); X rows
// x_row0 .. x_row0+K-1 of a (rows, D) tile, read transposed by ldmatrix as B's k-by-n fragments,
// each feeding the M products. Summed over P's columns in order.
template <int D, int K, int M = 1>
__device__ __forceinline__ void mma_px(float (*acc)[D / 8][4], const uint32_t (*pa)[K / 16][4], const bf16* x,
                                       int x_row0) {
  const int lane = lane_id();
#pragma unroll
  for (int k = 0; k < K; k += 16) {
#pragma unroll
    for (int n = 0; n < D; n += 16) {
      uint32_t bf[4];  // n-blocks n and n + 8
      ldmatrix_x4_trans(bf, x + (x_row0 + k + lane % 16) * kStride<D> + n + 8 * (lane / 16));
#pragma unroll
      for (int i = 0; i < M; ++i) {
        mma_bf16(acc[i][n / 8], pa[i][k / 16], bf[0], bf[1]);
        mma_bf16(acc[i][n / 8 + 1], pa[i][k / 16], bf[2], bf[3]);
      }
    }
  }
}

// Multiplies the lane's two rows of an accumulator (g and g + 8) by f[0] and f[1].
template <int N>
__device__ __forceinline__ void scale_rows(float (&acc)[N][4], const float (&f)[2]) {
#pragma unroll
  for (int n = 0; n < N; ++n) acc[n][0] *= f[0], acc[n][1] *= f[0], acc[n][2] *= f[1], acc[n][3] *= f[1];
}

template <int N>
__device__ __forceinline__ void zero(float (&acc)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
}

// Writes a warp's (16, D) accumulator times `scale`: its row r (g or g + 8) is token row0 + r at
// dst + (row0 + r) * dst_stride, written only before T. Each lane stores its pairs of columns.
template <int D>
__device__ __forceinline__ void store_rows(float* dst, int64_t dst_stride, const float (&acc)[D / 8][4], float scale,
                                           int64_t row0, int64_t T) {
  const int g = lane_id() / 4, t = lane_id() % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t row = row0 + g + 8 * half;
    if (row >= T) continue;
    float* p = dst + row * dst_stride + 2 * t;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<float2*>(p + 8 * n) = make_float2(acc[n][2 * half] * scale, acc[n][2 * half + 1] * scale);
  }
}

// Grid (q tiles of 64 M rows, H, B), the q tile with the most key tiles first. A warp owns M groups
// of 16 rows, group i at rows 64 i + 16 warp of the block's tile: each K or V fragment a warp reads
// from shared memory feeds M products (M = 2 halves those reads per product, as FlashAttention-2's
// 128-row tiles do), and every warp has the same share of the diagonal's masked work. The softmax
// takes kN of a tile's 64 keys at a time (32 holds half the scores in registers). A group's
// operations depend on kN only, not on M: the same kN gives the same bits.
template <int D, int M, int kN>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(float* out, float* lse, const float* qkv, Dims dims, float scale_log2) {
  extern __shared__ __align__(16) uint8_t smem[];
  // The block's M query tiles lie one after the other: one (64 M, D) tile.
  bf16 *qs = smem_tile<D>(smem, 0), *ks = smem_tile<D>(smem, M), *vs = smem_tile<D>(smem, M + 1);
  const int warp = threadIdx.x / kWarp, g = lane_id() / 4, t = lane_id() % 4, r0 = warp * kRows;
  const int q_tiles = (dims.tiles + M - 1) / M;
  const int qt = q_tiles - 1 - static_cast<int>(blockIdx.x), h = blockIdx.y, b = blockIdx.z;
  const int kvh = h / dims.group;
  const int64_t q0 = int64_t{qt} * kTile * M, T = dims.T;
  const float* tokens = qkv + b * T * dims.row;
#pragma unroll
  for (int i = 0; i < M; ++i) load_tile<D>(smem_tile<D>(smem, i), tokens + int64_t{h} * D, dims.row, q0 + kTile * i, T);

  float o[M][D / 8][4];
  // Rows g and g + 8 of each group: running max (in log2 units), and this lane's part of the sum.
  float m[M][2], l[M][2];
#pragma unroll
  for (int i = 0; i < M; ++i) {
    zero(o[i]);
    m[i][0] = m[i][1] = -INFINITY;
    l[i][0] = l[i][1] = 0.0f;
  }
  // Keys up to the block's last row; tiles from 64 (M - 1) keys before its first row on hold keys
  // after some of its rows (masked).
  const int last = min(dims.tiles - 1, (qt + 1) * M - 1);
  for (int kt = 0; kt <= last; ++kt) {
    __syncthreads();  // every warp is done with the previous K and V tiles
    load_tile<D>(ks, tokens + int64_t{dims.H + kvh} * D, dims.row, int64_t{kt} * kTile, T);
    load_tile<D>(vs, tokens + int64_t{dims.H + dims.Hkv + kvh} * D, dims.row, int64_t{kt} * kTile, T);
    __syncthreads();
    // Online softmax over kN keys at a time. Key 0 is never masked, so m is finite after the first
    // step; a group whose rows all come before the step's keys gets alpha = 1 and probabilities 0,
    // which change nothing.
    const bool diagonal = kt >= qt * M;
#pragma unroll 1
    for (int c0 = 0; c0 < kTile; c0 += kN) {
      float s[M][kN / 8][4];
#pragma unroll
      for (int i = 0; i < M; ++i) zero(s[i]);
      mma_abt<D, kN, M>(s, qs, r0, ks, c0);
      uint32_t p[M][kN / 16][4];  // the probabilities, rounded
#pragma unroll
      for (int i = 0; i < M; ++i) {
        // Row g's query, counted from the step's first key.
        const int row = (qt * M + i) * kTile + r0 + g - kt * kTile - c0;
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < kN / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const bool masked = diagonal && 8 * n + 2 * t + e % 2 > row + 8 * (e / 2);
            s[i][n][e] = masked ? -INFINITY : s[i][n][e] * scale_log2;
            mx[e / 2] = fmaxf(mx[e / 2], s[i][n][e]);
          }
        }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {  // a row's columns are spread over the 4 lanes of its quad
          const float m_new = fmaxf(m[i][r], warp_max<4>(mx[r]));
          alpha[r] = exp2f(m[i][r] - m_new);  // 0 on the first step, where m = -inf
          m[i][r] = m_new;
          l[i][r] *= alpha[r];
        }
#pragma unroll
        for (int n = 0; n < kN / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[i][n][e] = exp2f(s[i][n][e] - m[i][e / 2]);
            l[i][e / 2] += s[i][n][e];
          }
        }
        scale_rows(o[i], alpha);
        to_a_fragments<kN>(p[i], s[i]);
      }
      mma_px<D, kN, M>(o, p, vs, c0);
    }
  }

  const int64_t out_stride = int64_t{dims.H} * D;
#pragma unroll
  for (int i = 0; i < M; ++i) {
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[i][r] = warp_sum<4>(l[i][r]);  // the row's sum over its quad
      inv[r] = 1.0f / l[i][r];
    }
    scale_rows(o[i], inv);
    const int64_t row0 = q0 + kTile * i + r0;
    store_rows<D>(out + b * T * out_stride + int64_t{h} * D, out_stride, o[i], 1.0f, row0, T);
    if (t == 0) {
      for (int r = 0; r < 2; ++r) {
        const int64_t row = row0 + g + 8 * r;
        if (row < T) lse[(int64_t{b} * dims.H + h) * T + row] = (m[i][r] + log2f(l[i][r])) / kLog2e;
      }
    }
  }
}

// Score columns a warp handles at a time in the backward (registers: two such tiles of scores and
// score gradients beside the (16, D) accumulators).
constexpr int kCols = 32;

// dK and dV for one kv tile of one kv head: grid (tiles, Hkv, B). A warp's rows are 16 keys; the
// block walks the group's query heads and, for each, the q tiles from the diagonal on, so every
// contribution to a key's gradient is summed here, in that order. The scores are computed
// transposed (keys by queries), so P^T and dS^T come out as the A operands of dV += P^T dO and
// dK += dS^T Q.
template <int D>
__global__ void __launch_bounds__(kThreads) dkv_kernel(float* dqkv, const float* dout, const float* qkv,
                                                       const float* lse, const float* drow, Dims dims, float scale) {
  extern __shared__ __align__(16) uint8_t smem[];
  bf16 *ks = smem_tile<D>(smem, 0), *vs = smem_tile<D>(smem, 1), *qs = smem_tile<D>(smem, 2),
       *dos = smem_tile<D>(smem, 3);
  float *lses = reinterpret_cast<float*>(smem_tile<D>(smem, 4)), *drs = lses + kTile;
  const int warp = threadIdx.x / kWarp, g = lane_id() / 4, t = lane_id() % 4, r0 = warp * kRows;
  const int kt = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int64_t k0 = int64_t{kt} * kTile, T = dims.T, out_stride = int64_t{dims.H} * D;
  const float scale_log2 = scale * kLog2e;
  const float* tokens = qkv + b * T * dims.row;
  load_tile<D>(ks, tokens + int64_t{dims.H + kvh} * D, dims.row, k0, T);
  load_tile<D>(vs, tokens + int64_t{dims.H + dims.Hkv + kvh} * D, dims.row, k0, T);

  float dk[D / 8][4], dv[D / 8][4];
  zero(dk);
  zero(dv);
  for (int h = kvh * dims.group; h < (kvh + 1) * dims.group; ++h) {
    for (int qt = kt; qt < dims.tiles; ++qt) {
      const int64_t q0 = int64_t{qt} * kTile;
      __syncthreads();  // every warp is done with the previous Q and dO tiles
      load_tile<D>(qs, tokens + int64_t{h} * D, dims.row, q0, T);
      load_tile<D>(dos, dout + b * T * out_stride + int64_t{h} * D, out_stride, q0, T);
      load_row_values(lses, lse + (int64_t{b} * dims.H + h) * T, q0, T, kLog2e);  // log2 units
      load_row_values(drs, drow + (int64_t{b} * dims.H + h) * T, q0, T);
      __syncthreads();
#pragma unroll 1
      for (int c0 = 0; c0 < kTile; c0 += kCols) {
        float pt[kCols / 8][4], dst[kCols / 8][4];  // P^T, then dS^T in place of dP^T
        zero(pt);
        zero(dst);
        mma_abt<D, kCols>(&pt, ks, r0, qs, c0);    // S^T = K Q^T
        mma_abt<D, kCols>(&dst, vs, r0, dos, c0);  // dP^T = V dO^T
#pragma unroll
        for (int n = 0; n < kCols / 8; ++n) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int c = c0 + 8 * n + 2 * t + i % 2;  // the query's column in the tile
            const int64_t key = k0 + r0 + g + 8 * (i / 2);
            const bool live = q0 + c < T && q0 + c >= key;
            pt[n][i] = live ? exp2f(pt[n][i] * scale_log2 - lses[c]) : 0.0f;
            dst[n][i] = pt[n][i] * (dst[n][i] - drs[c]);
          }
        }
        uint32_t a[kCols / 16][4];
        to_a_fragments<kCols>(a, pt);
        mma_px<D, kCols>(&dv, &a, dos, c0);  // dV += P^T dO
        to_a_fragments<kCols>(a, dst);
        mma_px<D, kCols>(&dk, &a, qs, c0);  // dK += dS^T Q
      }
    }
  }

  float* tok_grads = dqkv + b * T * dims.row;
  store_rows<D>(tok_grads + int64_t{dims.H + kvh} * D, dims.row, dk, scale, k0 + r0, T);
  store_rows<D>(tok_grads + int64_t{dims.H + dims.Hkv + kvh} * D, dims.row, dv, 1.0f, k0 + r0, T);
}

// dQ for one q tile of one query head: grid (tiles, H, B), the longest rows first.
template <int D>
__global__ void __launch_bounds__(kThreads) dq_kernel(float* dqkv, const float* dout, const float* qkv,
                                                      const float* lse, const float* drow, Dims dims, float scale) {
  extern __shared__ __align__(16) uint8_t smem[];
  bf16 *qs = smem_tile<D>(smem, 0), *dos = smem_tile<D>(smem, 1), *ks = smem_tile<D>(smem, 2),
       *vs = smem_tile<D>(smem, 3);
  float *lses = reinterpret_cast<float*>(smem_tile<D>(smem, 4)), *drs = lses + kTile;
  const int warp = threadIdx.x / kWarp, g = lane_id() / 4, t = lane_id() % 4, r0 = warp * kRows;
  const int qt = dims.tiles - 1 - static_cast<int>(blockIdx.x), h = blockIdx.y, b = blockIdx.z;
  const int kvh = h / dims.group;
  const int64_t q0 = int64_t{qt} * kTile, T = dims.T, out_stride = int64_t{dims.H} * D;
  const float scale_log2 = scale * kLog2e;
  const float* tokens = qkv + b * T * dims.row;
  load_tile<D>(qs, tokens + int64_t{h} * D, dims.row, q0, T);
  load_tile<D>(dos, dout + b * T * out_stride + int64_t{h} * D, out_stride, q0, T);
  load_row_values(lses, lse + (int64_t{b} * dims.H + h) * T, q0, T, kLog2e);  // log2 units
  load_row_values(drs, drow + (int64_t{b} * dims.H + h) * T, q0, T);

  float dq[D / 8][4];
  zero(dq);
  for (int kt = 0; kt <= qt; ++kt) {
    const int64_t k0 = int64_t{kt} * kTile;
    __syncthreads();  // every warp is done with the previous K and V tiles
    load_tile<D>(ks, tokens + int64_t{dims.H + kvh} * D, dims.row, k0, T);
    load_tile<D>(vs, tokens + int64_t{dims.H + dims.Hkv + kvh} * D, dims.row, k0, T);
    __syncthreads();
    // Rows g and g + 8 of the warp's: their log-sum-exp (log2 units) and dout . out.
    const float row_lse[2] = {lses[r0 + g], lses[r0 + g + 8]};
    const float row_drow[2] = {drs[r0 + g], drs[r0 + g + 8]};
#pragma unroll 1
    for (int c0 = 0; c0 < kTile; c0 += kCols) {
      float p[kCols / 8][4], ds[kCols / 8][4];  // P, then dS in place of dP
      zero(p);
      zero(ds);
      mma_abt<D, kCols>(&p, qs, r0, ks, c0);    // S = Q K^T
      mma_abt<D, kCols>(&ds, dos, r0, vs, c0);  // dP = dO V^T
#pragma unroll
      for (int n = 0; n < kCols / 8; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int64_t key = k0 + c0 + 8 * n + 2 * t + i % 2;
          const bool live = key <= q0 + r0 + g + 8 * (i / 2);
          p[n][i] = live ? exp2f(p[n][i] * scale_log2 - row_lse[i / 2]) : 0.0f;
          ds[n][i] = p[n][i] * (ds[n][i] - row_drow[i / 2]);
        }
      }
      uint32_t a[kCols / 16][4];
      to_a_fragments<kCols>(a, ds);
      mma_px<D, kCols>(&dq, &a, ks, c0);  // dQ += dS K
    }
  }
  store_rows<D>(dqkv + b * T * dims.row + int64_t{h} * D, dims.row, dq, scale, q0 + r0, T);
}

// M groups of 16 rows per warp (forward_kernel); the softmax 64 keys at a time, or 32 where the M
// groups' accumulators hold the most registers (D = 128, M = 2: 60 bytes of spills instead of 196,
// ptxas -v for sm_90).
template <int D, int M>
void forward(float* out, float* lse, const float* qkv, const Dims& dims, int64_t B, cudaStream_t stream) {
  constexpr int kN = D * M > 128 ? 32 : kTile;
  const size_t smem = smem_bytes<D>(M + 2, 0);
  allow_smem(forward_kernel<D, M, kN>, smem);
  const dim3 grid(static_cast<unsigned>((dims.tiles + M - 1) / M), static_cast<unsigned>(dims.H),
                  static_cast<unsigned>(B));
  forward_kernel<D, M, kN><<<grid, kThreads, smem, stream>>>(out, lse, qkv, dims, score_scale(D) * kLog2e);
  CUDA_CHECK_LAUNCH();
}

template <int D>
void backward(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* drow, const Dims& dims,
              int64_t B, cudaStream_t stream) {
  const float scale = score_scale(D);
  const size_t smem = smem_bytes<D>(4, 2 * kTile);
  allow_smem(dkv_kernel<D>, smem);
  const dim3 kv_grid(static_cast<unsigned>(dims.tiles), static_cast<unsigned>(dims.Hkv), static_cast<unsigned>(B));
  dkv_kernel<D><<<kv_grid, kThreads, smem, stream>>>(dqkv, dout, qkv, lse, drow, dims, scale);
  CUDA_CHECK_LAUNCH();
  allow_smem(dq_kernel<D>, smem);
  const dim3 q_grid(static_cast<unsigned>(dims.tiles), static_cast<unsigned>(dims.H), static_cast<unsigned>(B));
  dq_kernel<D><<<q_grid, kThreads, smem, stream>>>(dqkv, dout, qkv, lse, drow, dims, scale);
  CUDA_CHECK_LAUNCH();
}
}  // namespace

void forward_bf16(float* out, float* lse, const float* qkv, const Dims& dims, int64_t B, int64_t D, int rows_per_warp,
                  cudaStream_t stream) {
  if (rows_per_warp == 0) rows_per_warp = D < 128 ? 32 : 16;  // the default (attention.h)
  CHECK_MSG(rows_per_warp == 16 || rows_per_warp == 32, "attention_forward: bf16 rows per warp are 16 or 32 (or 0)");
  with_head_dim(D, [&](auto d) {
    if (rows_per_warp == 32) return forward<decltype(d)::value, 2>(out, lse, qkv, dims, B, stream);
    forward<decltype(d)::value, 1>(out, lse, qkv, dims, B, stream);
  });
}

void backward_bf16(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* drow,
                   const Dims& dims, int64_t B, int64_t D, cudaStream_t stream) {
  with_head_dim(D, [&](auto d) { backward<decltype(d)::value>(dqkv, dout, qkv, lse, drow, dims, B, stream); });
}

}  // namespace tessera::kernels::cuda::attention_detail
