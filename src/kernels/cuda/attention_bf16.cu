// CUDA causal grouped-query attention with its products on bf16 tensor cores, FlashAttention-2's
// way: attention.h's bf16 variant. The structure is attention.cu's: a block owns a 64-row tile and
// streams the other side's tiles through shared memory with an online softmax; the backward writes
// dK and dV from one kernel and dQ from another, so nothing is summed with atomics and a rerun gives
// the same bits. A block is four warps, each owning 16 of its tile's rows.
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

// acc (16 x N) += A X^T: A rows a_row0 .. a_row0+15 of tile a, X rows x_row0 .. x_row0+N-1 of tile
// x, both (rows, D) tiles, summed over D. ldmatrix reads X's rows as B's n-by-k fragments.
template <int D, int N>
__device__ __forceinline__ void mma_abt(float (&acc)[N / 8][4], const bf16* a, int a_row0, const bf16* x, int x_row0) {
  const int lane = lane_id();
#pragma unroll
  for (int k = 0; k < D; k += 16) {
    uint32_t af[4];
    ldmatrix_x4(af, a + (a_row0 + lane % 16) * kStride<D> + k + 8 * (lane / 16));
#pragma unroll
    for (int n = 0; n < N; n += 16) {
      uint32_t bf[4];  // n-blocks n and n + 8
      ldmatrix_x4(bf, x + (x_row0 + n + lane % 8 + 8 * (lane / 16)) * kStride<D> + k + 8 * (lane / 8 % 2));
      mma_bf16(acc[n / 8], af, bf[0], bf[1]);
      mma_bf16(acc[n / 8 + 1], af, bf[2], bf[3]);
    }
  }
}

// acc (16 x D) += P X: P (16 x K) the fp32 accumulators p, rounded to bf16; X rows x_row0 ..
// x_row0+K-1 of a (rows, D) tile, read transposed by ldmatrix as B's k-by-n fragments. Summed over
// P's columns in order.
template <int D, int K>
__device__ __forceinline__ void mma_px(float (&acc)[D / 8][4], const float (&p)[K / 8][4], const bf16* x, int x_row0) {
  const int lane = lane_id();
#pragma unroll
  for (int k = 0; k < K; k += 16) {
    const float(&lo)[4] = p[k / 8];
    const float(&hi)[4] = p[k / 8 + 1];
    const uint32_t af[4] = {pack_bf16(lo[0], lo[1]), pack_bf16(lo[2], lo[3]), pack_bf16(hi[0], hi[1]),
                            pack_bf16(hi[2], hi[3])};
#pragma unroll
    for (int n = 0; n < D; n += 16) {
      uint32_t bf[4];  // n-blocks n and n + 8
      ldmatrix_x4_trans(bf, x + (x_row0 + k + lane % 16) * kStride<D> + n + 8 * (lane / 16));
      mma_bf16(acc[n / 8], af, bf[0], bf[1]);
      mma_bf16(acc[n / 8 + 1], af, bf[2], bf[3]);
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

// Grid (tiles, H, B), the q tile with the most key tiles first, as attention.cu's.
template <int D>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(float* out, float* lse, const float* qkv, Dims dims, float scale_log2) {
  extern __shared__ __align__(16) uint8_t smem[];
  bf16 *qs = smem_tile<D>(smem, 0), *ks = smem_tile<D>(smem, 1), *vs = smem_tile<D>(smem, 2);
  const int warp = threadIdx.x / kWarp, g = lane_id() / 4, t = lane_id() % 4, r0 = warp * kRows;
  const int qt = dims.tiles - 1 - static_cast<int>(blockIdx.x), h = blockIdx.y, b = blockIdx.z;
  const int kvh = h / dims.group;
  const int64_t q0 = int64_t{qt} * kTile, T = dims.T;
  const float* tokens = qkv + b * T * dims.row;
  load_tile<D>(qs, tokens + int64_t{h} * D, dims.row, q0, T);

  float o[D / 8][4];
  zero(o);
  // Rows g and g + 8 of the warp's 16: running max (in log2 units), and this lane's part of the sum.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int kt = 0; kt <= qt; ++kt) {
    __syncthreads();  // every warp is done with the previous K and V tiles
    load_tile<D>(ks, tokens + int64_t{dims.H + kvh} * D, dims.row, int64_t{kt} * kTile, T);
    load_tile<D>(vs, tokens + int64_t{dims.H + dims.Hkv + kvh} * D, dims.row, int64_t{kt} * kTile, T);
    __syncthreads();
    float s[kTile / 8][4];
    zero(s);
    mma_abt<D, kTile>(s, qs, r0, ks, 0);

    // Online softmax. Tiles are square: only the diagonal one has keys after the query. Key 0 is
    // never masked, so m is finite after the first tile.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const bool masked = kt == qt && 8 * n + 2 * t + i % 2 > r0 + g + 8 * (i / 2);
        s[n][i] = masked ? -INFINITY : s[n][i] * scale_log2;
        mx[i / 2] = fmaxf(mx[i / 2], s[n][i]);
      }
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // a row's 64 columns are spread over the 4 lanes of its quad
      const float m_new = fmaxf(m[r], warp_max<4>(mx[r]));
      alpha[r] = exp2f(m[r] - m_new);  // 0 on the first tile, where m = -inf
      m[r] = m_new;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s[n][i] = exp2f(s[n][i] - m[i / 2]);
        l[i / 2] += s[n][i];
      }
    }
    scale_rows(o, alpha);
    mma_px<D, kTile>(o, s, vs, 0);
  }

  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] = warp_sum<4>(l[r]);  // the row's sum over its quad
    inv[r] = 1.0f / l[r];
  }
  scale_rows(o, inv);
  const int64_t out_stride = int64_t{dims.H} * D;
  store_rows<D>(out + b * T * out_stride + int64_t{h} * D, out_stride, o, 1.0f, q0 + r0, T);
  if (t == 0) {
    for (int r = 0; r < 2; ++r) {
      const int64_t row = q0 + r0 + g + 8 * r;
      if (row < T) lse[(int64_t{b} * dims.H + h) * T + row] = (m[r] + log2f(l[r])) / kLog2e;
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
        mma_abt<D, kCols>(pt, ks, r0, qs, c0);    // S^T = K Q^T
        mma_abt<D, kCols>(dst, vs, r0, dos, c0);  // dP^T = V dO^T
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
        mma_px<D, kCols>(dv, pt, dos, c0);  // dV += P^T dO
        mma_px<D, kCols>(dk, dst, qs, c0);  // dK += dS^T Q
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
      mma_abt<D, kCols>(p, qs, r0, ks, c0);    // S = Q K^T
      mma_abt<D, kCols>(ds, dos, r0, vs, c0);  // dP = dO V^T
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
      mma_px<D, kCols>(dq, ds, ks, c0);  // dQ += dS K
    }
  }
  store_rows<D>(dqkv + b * T * dims.row + int64_t{h} * D, dims.row, dq, scale, q0 + r0, T);
}

template <int D>
void forward(float* out, float* lse, const float* qkv, const Dims& dims, int64_t B, cudaStream_t stream) {
  const size_t smem = smem_bytes<D>(3, 0);
  allow_smem(forward_kernel<D>, smem);
  const dim3 grid(static_cast<unsigned>(dims.tiles), static_cast<unsigned>(dims.H), static_cast<unsigned>(B));
  forward_kernel<D><<<grid, kThreads, smem, stream>>>(out, lse, qkv, dims, score_scale(D) * kLog2e);
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

void forward_bf16(float* out, float* lse, const float* qkv, const Dims& dims, int64_t B, int64_t D,
                  cudaStream_t stream) {
  with_head_dim(D, [&](auto d) { forward<decltype(d)::value>(out, lse, qkv, dims, B, stream); });
}

void backward_bf16(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* drow,
                   const Dims& dims, int64_t B, int64_t D, cudaStream_t stream) {
  with_head_dim(D, [&](auto d) { backward<decltype(d)::value>(dqkv, dout, qkv, lse, drow, dims, B, stream); });
}

}  // namespace tessera::kernels::cuda::attention_detail
