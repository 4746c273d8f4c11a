// CPU causal grouped-query attention with its products on bf16 operands (avx512_bf16's
// vdpbf16ps: pairs of bf16 products summed into fp32 lanes), the rest in fp32: what mixed
// precision does to the weight GEMMs, done to attention, as the CUDA backend's tensor-core variant
// does (kernels/cuda/attention.h). The schedule is attention.cc's: a thread takes a (batch, head)
// (backward: a kv group), row tiles of 64 queries against the keys up to the tile's end, the
// probabilities recomputed in backward from the saved log-sum-exp.
//
// Every product is one shape: C = alpha A B (+ C), A row-major with the summed index along its rows
// (read as 32-bit pairs), B packed as pairs of its rows interleaved ("VNNI": pair p of column n at
// B[p][n][0..1]). The operands are packed per head into the thread's workspace:
//   S    = Q K^T     A: Q rows              B: K with pairs of head-dim entries
//   O    = P V       A: P rows (bf16)       B: V with pairs of keys
//   dP   = dO V^T    A: dO rows             B: V with pairs of head-dim entries
//   dQ   = dS K      A: dS rows (bf16)      B: K with pairs of keys
//   dK^T = Q^T dS    A: Q^T rows            B: dS with pairs of queries
//   dV^T = dO^T P    A: dO^T rows           B: P with pairs of queries
// dK and dV are summed transposed (head dim x keys) over a group's heads, then transposed once.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/bf16.h"
#include "core/check.h"
#include "core/threads.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/vec_math.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace tessera::kernels::cpu {

#if defined(__AVX512BF16__)

namespace {

constexpr int64_t kTile = 64;  // query rows per tile, as attention.cc

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// One MR x (16 NV) block of C over `pairs` pairs of the summed index. `last` masks the block's
// last 16 columns (a ragged right edge of C; B is padded, so its loads are whole).
template <int MR, int NV>
void block(int64_t pairs, const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float alpha, bool accumulate,
           __mmask16 last, float* C, int64_t ldc) {
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh b[NV];
    for (int v = 0; v < NV; ++v) b[v] = (__m512bh)_mm512_loadu_si512(B + p * ldb + 32 * v);
    for (int r = 0; r < MR; ++r) {
      int32_t pair;
      std::memcpy(&pair, A + r * lda + 2 * p, sizeof(pair));
      const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a, b[v]);
    }
  }
  const __m512 scale = _mm512_set1_ps(alpha);
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v == NV - 1 ? last : __mmask16(0xffff);
      float* c = C + r * ldc + 16 * v;
      __m512 out = _mm512_mul_ps(acc[r][v], scale);
      if (accumulate) out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(m, c));
      _mm512_mask_storeu_ps(c, m, out);
    }
  }
}

template <int NV>
void row_block(int64_t rows, int64_t pairs, const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float alpha,
               bool accumulate, __mmask16 last, float* C, int64_t ldc) {
  constexpr int kRows = 6;  // 6 x 4 accumulators, 4 B vectors and a broadcast: 29 of 32 registers
  int64_t m = 0;
  for (; m + kRows <= rows; m += kRows) {
    block<kRows, NV>(pairs, A + m * lda, lda, B, ldb, alpha, accumulate, last, C + m * ldc, ldc);
  }
  const uint16_t* a = A + m * lda;
  float* c = C + m * ldc;
  switch (rows - m) {
    case 0:
      break;
    case 1:
      block<1, NV>(pairs, a, lda, B, ldb, alpha, accumulate, last, c, ldc);
      break;
    case 2:
      block<2, NV>(pairs, a, lda, B, ldb, alpha, accumulate, last, c, ldc);
      break;
    case 3:
      block<3, NV>(pairs, a, lda, B, ldb, alpha, accumulate, last, c, ldc);
      break;
    case 4:
      block<4, NV>(pairs, a, lda, B, ldb, alpha, accumulate, last, c, ldc);
      break;
    default:
      block<5, NV>(pairs, a, lda, B, ldb, alpha, accumulate, last, c, ldc);
      break;
  }
}

// C (M x N, row stride ldc) = alpha A B, plus C when accumulate. A: M rows of 2 * pairs bf16 (row
// stride lda). B: `pairs` rows of round_up(N, 16) interleaved pairs (row stride ldb bf16s), finite
// and zero where the summed index runs past its end.
void gemm_pairs(int64_t M, int64_t N, int64_t pairs, const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb,
                float alpha, bool accumulate, float* C, int64_t ldc) {
  for (int64_t n0 = 0; n0 < N; n0 += 64) {
    const int64_t cols = std::min<int64_t>(64, N - n0), nv = (cols + 15) / 16;
    const __mmask16 last = static_cast<__mmask16>((1u << (cols - 16 * (nv - 1))) - 1u);
    const uint16_t* b = B + 2 * n0;
    float* c = C + n0;
    switch (nv) {
      case 1:
        row_block<1>(M, pairs, A, lda, b, ldb, alpha, accumulate, last, c, ldc);
        break;
      case 2:
        row_block<2>(M, pairs, A, lda, b, ldb, alpha, accumulate, last, c, ldc);
        break;
      case 3:
        row_block<3>(M, pairs, A, lda, b, ldb, alpha, accumulate, last, c, ldc);
        break;
      default:
        row_block<4>(M, pairs, A, lda, b, ldb, alpha, accumulate, last, c, ldc);
        break;
    }
  }
}

// ---- packing: fp32 rows (row stride ld) into the layouts above, zero-padded ----

// rows x cols into rows of ld_out bf16s; zeros from cols to ld_out.
void pack_rows(uint16_t* out, int64_t ld_out, const float* in, int64_t ld, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    f32_to_bf16(in + r * ld, out + r * ld_out, cols);
    std::fill(out + r * ld_out + cols, out + (r + 1) * ld_out, uint16_t{0});
  }
}

// B for a product summing over the rows of `in` (rows x cols): rows 2p and 2p+1 interleaved into
// out[p * ld_out ..]; ceil(rows / 2) pair rows, zeros where rows or cols run out.
void pack_row_pairs(uint16_t* out, int64_t ld_out, const float* in, int64_t ld, int64_t rows, int64_t cols) {
  for (int64_t p = 0; p < (rows + 1) / 2; ++p) {
    uint16_t* o = out + p * ld_out;
    const float* x0 = in + 2 * p * ld;
    const float* x1 = 2 * p + 1 < rows ? x0 + ld : nullptr;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) {
      o[2 * c] = f32_to_bf16(x0[c]);
      o[2 * c + 1] = x1 != nullptr ? f32_to_bf16(x1[c]) : uint16_t{0};
    }
    std::fill(o + 2 * cols, o + ld_out, uint16_t{0});
  }
}

// out[c][r] = in[r][c] for 32-bit pairs of bf16s, in blocks that stay in cache: rows x cols of
// `in` (row stride ld_in pairs) into cols rows of ld_out pairs, zeros from rows to ld_out.
void transpose_pairs(uint16_t* out16, int64_t ld_out, const uint16_t* in16, int64_t ld_in, int64_t rows, int64_t cols) {
  using Pair = uint32_t __attribute__((__may_alias__));  // the bf16s' memory, read as pairs
  auto* out = reinterpret_cast<Pair*>(out16);
  const auto* in = reinterpret_cast<const Pair*>(in16);
  constexpr int64_t kBlock = 16;
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
    const int64_t r1 = std::min(rows, r0 + kBlock);
    for (int64_t c = 0; c < cols; ++c) {
      for (int64_t r = r0; r < r1; ++r) out[c * ld_out + r] = in[r * ld_in + c];
    }
  }
  for (int64_t c = 0; c < cols; ++c) std::fill(out + c * ld_out + rows, out + (c + 1) * ld_out, Pair{0});
}

// One thread's share of the workspace; T rounded up to 16 (Tp) as every B's row of pairs is, and
// D to 16 (Dp) likewise, or to 2 (De) where D is the summed index.
struct Layout {
  int64_t Tp, Dp, De;
  int64_t bytes = 0;
  // fp32
  float *s, *dp, *dkt, *dvt;  // a tile's scores (then probabilities) and dP (then dS); dK^T, dV^T
  float* di;                  // the head's rowsum(dO * O)
  // bf16
  uint16_t *p_rows, *p_pairs, *ds_pairs;        // a tile's probabilities (backward: dS) by row, paired
  uint16_t *q, *qt, *dout, *doutt;              // the head's Q and dO by row, transposed and paired
  uint16_t *k_cols, *v_cols, *k_rows, *v_rows;  // the group's K and V, paired by head dim, by key
  uint16_t* staging;                            // rows or row pairs on their way to a transpose

  // base null: only `bytes`, the share's size.
  Layout(float* base, int64_t T, int64_t D) : Tp(round_up(T, 16)), Dp(round_up(D, 16)), De(round_up(D, 2)) {
    auto take = [&](int64_t n_bytes) {
      char* p = base == nullptr ? nullptr : reinterpret_cast<char*>(base) + bytes;
      bytes += round_up(n_bytes, 64);
      return p;
    };
    auto floats = [&](int64_t n) { return reinterpret_cast<float*>(take(4 * n)); };
    auto halves = [&](int64_t n) { return reinterpret_cast<uint16_t*>(take(2 * n)); };
    s = floats(kTile * Tp);
    dp = floats(kTile * Tp);
    dkt = floats(D * Tp);
    dvt = floats(D * Tp);
    di = floats(Tp);
    p_rows = halves(kTile * Tp);
    p_pairs = halves(kTile * Tp);
    ds_pairs = halves(kTile * Tp);
    q = halves(T * De);
    qt = halves(D * Tp);
    dout = halves(T * De);
    doutt = halves(D * Tp);
    k_cols = halves(De * Tp);
    v_cols = halves(De * Tp);
    k_rows = halves(Tp * Dp);
    v_rows = halves(Tp * Dp);
    staging = halves(Tp * Dp);
  }

  // B for a product summing over the columns of x (T x D): pair p of row r at [p][r].
  void pack_column_pairs(uint16_t* out, const float* x, int64_t ld, int64_t T, int64_t D) const {
    pack_rows(staging, De, x, ld, T, D);
    transpose_pairs(out, Tp, staging, De / 2, T, De / 2);
  }
  // A for a product summing over the rows of x (T x D): x^T with pairs of rows, (x[2p][d], x[2p+1][d]).
  void pack_transposed_pairs(uint16_t* out, const float* x, int64_t ld, int64_t T, int64_t D) const {
    pack_row_pairs(staging, 2 * Dp, x, ld, T, D);
    transpose_pairs(out, Tp / 2, staging, Dp, (T + 1) / 2, D);
  }
};

struct Head {
  const float* q;  // (T, D), row stride `stride`
  const float* k;
  const float* v;
  int64_t stride;
};

Head head_of(const float* qkv, int64_t b, int64_t h, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  const int64_t stride = (H + 2 * Hkv) * D;
  const int64_t g = h / (H / Hkv);
  const float* base = qkv + b * T * stride;
  return {base + h * D, base + (H + g) * D, base + (H + Hkv + g) * D, stride};
}

}  // namespace

bool attention_bf16_available() { return true; }

int64_t attention_bf16_workspace_floats(int64_t T, int64_t D, int threads) {
  return Layout(nullptr, T, D).bytes / 4 * threads;
}

void attention_forward_bf16(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                            int64_t D, float* workspace) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t out_stride = H * D, per_thread = attention_bf16_workspace_floats(T, D, 1);
  parallel_for_each(B * H, [&](int64_t bh, int thread) {
    const int64_t b = bh / H, h = bh % H;
    const Head hd = head_of(qkv, b, h, T, H, Hkv, D);
    const Layout w(workspace + thread * per_thread, T, D);
    pack_rows(w.q, w.De, hd.q, hd.stride, T, D);
    w.pack_column_pairs(w.k_cols, hd.k, hd.stride, T, D);
    pack_row_pairs(w.v_rows, 2 * w.Dp, hd.v, hd.stride, T, D);
    float* lse_bh = lse + (b * H + h) * T;
    for (int64_t r0 = 0; r0 < T; r0 += kTile) {
      const int64_t r1 = std::min(T, r0 + kTile), keys = r1, width = round_up(keys, 2);
      gemm_pairs(r1 - r0, keys, w.De / 2, w.q + r0 * w.De, w.De, w.k_cols, 2 * w.Tp, scale, false, w.s, w.Tp);
      for (int64_t i = r0; i < r1; ++i) {
        float* s = w.s + (i - r0) * w.Tp;
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j <= i; ++j) mx = s[j] > mx ? s[j] : mx;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j <= i; ++j) {
          s[j] = exp_fast(s[j] - mx);
          sum += s[j];
        }
        lse_bh[i] = mx + std::log(sum);
        const float inv = 1.0f / sum;
        uint16_t* p = w.p_rows + (i - r0) * w.Tp;
#pragma omp simd
        for (int64_t j = 0; j < width; ++j) p[j] = j <= i ? f32_to_bf16(s[j] * inv) : uint16_t{0};
      }
      gemm_pairs(r1 - r0, D, width / 2, w.p_rows, w.Tp, w.v_rows, 2 * w.Dp, 1.0f, false,
                 out + b * T * out_stride + r0 * out_stride + h * D, out_stride);
    }
  });
}

namespace {

// A backward tile's P = exp(S - lse) and dS = P (dP - di), zero right of the diagonal, from its
// scores and dP, written as the products want them, two query rows (t, t+1) at a time: dS by row
// (for dQ), P and dS with pairs of queries (for dV^T and dK^T), up to `cols` keys. A ragged
// tile's odd last row pairs with zeros.
void tile_gradients(const Layout& w, int64_t r0, int64_t r1, int64_t cols, const float* lse) {
  using Pair = uint32_t __attribute__((__may_alias__));
  auto pair = [](float lo, float hi) {
    return static_cast<uint32_t>(f32_to_bf16(lo)) | static_cast<uint32_t>(f32_to_bf16(hi)) << 16;
  };
  for (int64_t t = 0; t < r1 - r0; t += 2) {
    const int64_t i0 = r0 + t, i1 = t + 1 < r1 - r0 ? i0 + 1 : -1;  // i1 = -1: no second row
    const float *s0 = w.s + t * w.Tp, *s1 = s0 + w.Tp, *dp0 = w.dp + t * w.Tp, *dp1 = dp0 + w.Tp;
    const float l0 = lse[i0], di0 = w.di[i0], l1 = i1 < 0 ? 0.0f : lse[i1], di1 = i1 < 0 ? 0.0f : w.di[i1];
    uint16_t *ds_row0 = w.p_rows + t * w.Tp, *ds_row1 = ds_row0 + w.Tp;
    Pair* p_pairs = reinterpret_cast<Pair*>(w.p_pairs + t * w.Tp);
    Pair* ds_pairs = reinterpret_cast<Pair*>(w.ds_pairs + t * w.Tp);
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) {
      const float p0 = j <= i0 ? exp_fast(s0[j] - l0) : 0.0f;
      const float p1 = j <= i1 ? exp_fast(s1[j] - l1) : 0.0f;
      const float ds0 = j <= i0 ? p0 * (dp0[j] - di0) : 0.0f;
      const float ds1 = j <= i1 ? p1 * (dp1[j] - di1) : 0.0f;
      p_pairs[j] = pair(p0, p1);
      ds_pairs[j] = pair(ds0, ds1);
      ds_row0[j] = f32_to_bf16(ds0);
      ds_row1[j] = f32_to_bf16(ds1);
    }
  }
}

// out (T x D, row stride ld) = in^T, in (D x T, row stride ld_in), by 16 x 16 blocks.
void store_transposed(float* out, int64_t ld, const float* in, int64_t ld_in, int64_t T, int64_t D) {
  constexpr int64_t kBlock = 16;
  for (int64_t j0 = 0; j0 < T; j0 += kBlock) {
    for (int64_t d0 = 0; d0 < D; d0 += kBlock) {
      for (int64_t j = j0; j < std::min(T, j0 + kBlock); ++j) {
        for (int64_t d = d0; d < std::min(D, d0 + kBlock); ++d) out[j * ld + d] = in[d * ld_in + j];
      }
    }
  }
}

}  // namespace

void attention_backward_bf16(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                             int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, float* workspace) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t group = H / Hkv, stride = (H + 2 * Hkv) * D, out_stride = H * D;
  const int64_t per_thread = attention_bf16_workspace_floats(T, D, 1);
  // Threads own whole kv groups, so dk and dv (shared by the group's query heads) have one writer.
  parallel_for_each(B * Hkv, [&](int64_t bg, int thread) {
    const int64_t b = bg / Hkv, g = bg % Hkv;
    const Layout w(workspace + thread * per_thread, T, D);
    const Head kv = head_of(qkv, b, g * group, T, H, Hkv, D);
    w.pack_column_pairs(w.k_cols, kv.k, stride, T, D);
    w.pack_column_pairs(w.v_cols, kv.v, stride, T, D);
    pack_row_pairs(w.k_rows, 2 * w.Dp, kv.k, stride, T, D);
    std::fill(w.dkt, w.dkt + D * w.Tp, 0.0f);
    std::fill(w.dvt, w.dvt + D * w.Tp, 0.0f);
    float* dq_base = dqkv + b * T * stride;
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      const float* q = qkv + b * T * stride + h * D;
      const float* o = out + b * T * out_stride + h * D;
      const float* dO = dout + b * T * out_stride + h * D;
      pack_rows(w.q, w.De, q, stride, T, D);
      w.pack_transposed_pairs(w.qt, q, stride, T, D);
      pack_rows(w.dout, w.De, dO, out_stride, T, D);
      w.pack_transposed_pairs(w.doutt, dO, out_stride, T, D);
      for (int64_t i = 0; i < T; ++i) {
        const float *dOi = dO + i * out_stride, *oi = o + i * out_stride;
        float di = 0.0f;
#pragma omp simd reduction(+ : di)
        for (int64_t d = 0; d < D; ++d) di += dOi[d] * oi[d];
        w.di[i] = di;
      }
      for (int64_t r0 = 0; r0 < T; r0 += kTile) {
        const int64_t r1 = std::min(T, r0 + kTile), rows = r1 - r0, keys = r1, width = round_up(keys, 2);
        const int64_t cols = round_up(keys, 16);
        gemm_pairs(rows, keys, w.De / 2, w.q + r0 * w.De, w.De, w.k_cols, 2 * w.Tp, scale, false, w.s, w.Tp);
        gemm_pairs(rows, keys, w.De / 2, w.dout + r0 * w.De, w.De, w.v_cols, 2 * w.Tp, 1.0f, false, w.dp, w.Tp);
        tile_gradients(w, r0, r1, cols, lse + (b * H + h) * T);
        gemm_pairs(rows, D, width / 2, w.p_rows, w.Tp, w.k_rows, 2 * w.Dp, scale, false, dq_base + r0 * stride + h * D,
                   stride);
        const int64_t query_pairs = (rows + 1) / 2;
        gemm_pairs(D, keys, query_pairs, w.qt + r0, w.Tp, w.ds_pairs, 2 * w.Tp, scale, true, w.dkt, w.Tp);
        gemm_pairs(D, keys, query_pairs, w.doutt + r0, w.Tp, w.p_pairs, 2 * w.Tp, 1.0f, true, w.dvt, w.Tp);
      }
    }
    store_transposed(dq_base + (H + g) * D, stride, w.dkt, w.Tp, T, D);
    store_transposed(dq_base + (H + Hkv + g) * D, stride, w.dvt, w.Tp, T, D);
  });
}

#else  // no avx512_bf16: attention.cc's fp32 kernels serve (the backend asks first)

bool attention_bf16_available() { return false; }
int64_t attention_bf16_workspace_floats(int64_t, int64_t, int) { return 0; }
void attention_forward_bf16(float*, float*, const float*, int64_t, int64_t, int64_t, int64_t, int64_t, float*) {
  CHECK_MSG(false, "attention_forward_bf16 needs avx512_bf16");
}
void attention_backward_bf16(float*, const float*, const float*, const float*, const float*, int64_t, int64_t, int64_t,
                             int64_t, int64_t, float*) {
  CHECK_MSG(false, "attention_backward_bf16 needs avx512_bf16");
}

#endif

}  // namespace tessera::kernels::cpu
