// CPU causal grouped-query attention on AVX-512 with its own tile products, in fp32 (FMAs) or, for
// mixed precision, on bf16 operands (avx512_bf16's vdpbf16ps: pairs of bf16 products summed into
// fp32 lanes) with the softmax, lse, row dots and score gradients in fp32, as the CUDA backend's
// bf16 variant does (kernels/cuda/attention.h). The schedule is attention.cc's, but for whole kv
// groups: a thread takes a (batch, kv group) (forward: a run of a group's heads where there are
// few groups a thread), row tiles of 64 queries against the keys up to the tile's
// end, the probabilities recomputed in backward from the saved log-sum-exp. Its products are small
// (64 x T x D); oneDNN's sgemm spends as long setting each up as computing it.
//
// Operands are 32-bit units: one fp32, or a pair of bf16s along the summed index. Every product is
// one shape: C = alpha A B (+ C), A row-major with the summed index along its rows (read a unit at
// a time and broadcast), B with a row of units per summed unit ("VNNI" for bf16: pair p of column
// n at B[p][n][0..1]). The operands are packed per head into the thread's workspace:
//   S    = Q K^T     A: Q rows         B: K transposed (by head-dim units)
//   O    = P V       A: P rows         B: V (by key units)
//   dP   = dO V^T    A: dO rows        B: V transposed
//   dQ   = dS K      A: dS rows        B: K
//   dK^T = Q^T dS    A: Q^T rows       B: dS (by query units)
//   dV^T = dO^T P    A: dO^T rows      B: P
// dK and dV are summed transposed (head dim x keys) over a group's heads, then transposed once.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/bf16.h"
#include "core/check.h"
#include "core/threads.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_head.h"
#include "kernels/cpu/transpose16.h"
#include "kernels/cpu/vec_math.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace tessera::kernels::cpu {

#if defined(__AVX512F__)

namespace {

using attention_detail::Head;
using attention_detail::head_of;
using attention_detail::kTile;

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

using Unit = Unit32;

// E: float, or uint16_t for bf16. kPer: values of E in a 32-bit unit.
template <typename E>
constexpr int64_t kPer = 4 / static_cast<int64_t>(sizeof(E));

template <typename E>
__m512 multiply_add(__m512 acc, __m512i a, __m512i b) {
  if constexpr (std::is_same_v<E, float>) {
    return _mm512_fmadd_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(b), acc);
  } else {
#if defined(__AVX512BF16__)
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
#else
    static_assert(sizeof(E) == 0, "bf16 tiles need avx512_bf16");
#endif
  }
}

template <typename E>
E convert(float x) {
  if constexpr (std::is_same_v<E, float>) {
    return x;
  } else {
    return f32_to_bf16(x);
  }
}

// One MR x (16 NV) block of C over `units` units of the summed index. `last` masks the block's
// last 16 columns (a ragged right edge of C; B is padded, so its loads are whole).
template <typename E, int MR, int NV>
void block(int64_t units, const E* A, int64_t lda, const E* B, int64_t ldb, float alpha, const float* row_scale,
           bool accumulate, __mmask16 last, float* C, int64_t ldc) {
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (int64_t u = 0; u < units; ++u) {
    __m512i b[NV];
    for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_si512(B + u * ldb + 16 * kPer<E> * v);
    for (int r = 0; r < MR; ++r) {
      const __m512i a =
          _mm512_set1_epi32(static_cast<int32_t>(*reinterpret_cast<const Unit*>(A + r * lda + kPer<E> * u)));
      for (int v = 0; v < NV; ++v) acc[r][v] = multiply_add<E>(acc[r][v], a, b[v]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    const __m512 scale = _mm512_set1_ps(row_scale != nullptr ? alpha * row_scale[r] : alpha);
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v == NV - 1 ? last : __mmask16(0xffff);
      float* c = C + r * ldc + 16 * v;
      __m512 out = _mm512_mul_ps(acc[r][v], scale);
      if (accumulate) out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(m, c));
      _mm512_mask_storeu_ps(c, m, out);
    }
  }
}

template <typename E, int NV>
void row_block(int64_t rows, int64_t units, const E* A, int64_t lda, const E* B, int64_t ldb, float alpha,
               const float* row_scale, bool accumulate, __mmask16 last, float* C, int64_t ldc) {
  constexpr int kRows = 6;  // 6 x 4 accumulators, 4 B vectors and a broadcast: 29 of 32 registers
  auto scale_at = [&](int64_t m) { return row_scale != nullptr ? row_scale + m : nullptr; };
  int64_t m = 0;
  for (; m + kRows <= rows; m += kRows) {
    block<E, kRows, NV>(units, A + m * lda, lda, B, ldb, alpha, scale_at(m), accumulate, last, C + m * ldc, ldc);
  }
  const E* a = A + m * lda;
  const float* rs = scale_at(m);
  float* c = C + m * ldc;
  switch (rows - m) {
    case 0:
      break;
    case 1:
      block<E, 1, NV>(units, a, lda, B, ldb, alpha, rs, accumulate, last, c, ldc);
      break;
    case 2:
      block<E, 2, NV>(units, a, lda, B, ldb, alpha, rs, accumulate, last, c, ldc);
      break;
    case 3:
      block<E, 3, NV>(units, a, lda, B, ldb, alpha, rs, accumulate, last, c, ldc);
      break;
    case 4:
      block<E, 4, NV>(units, a, lda, B, ldb, alpha, rs, accumulate, last, c, ldc);
      break;
    default:
      block<E, 5, NV>(units, a, lda, B, ldb, alpha, rs, accumulate, last, c, ldc);
      break;
  }
}

// C (M x N, row stride ldc) = alpha A B, plus C when accumulate; row m of the product times
// row_scale[m] too, where given. A: M rows of `units` units (row stride lda values). B: `units` rows
// of round_up(N, 16) units (row stride ldb values), finite, and zero where the summed index runs past
// its end.
template <typename E>
void gemm_units(int64_t M, int64_t N, int64_t units, const E* A, int64_t lda, const E* B, int64_t ldb, float alpha,
                bool accumulate, float* C, int64_t ldc, const float* row_scale = nullptr) {
  for (int64_t n0 = 0; n0 < N; n0 += 64) {
    const int64_t cols = std::min<int64_t>(64, N - n0), nv = (cols + 15) / 16;
    const __mmask16 last = static_cast<__mmask16>((1u << (cols - 16 * (nv - 1))) - 1u);
    const E* b = B + kPer<E> * n0;
    float* c = C + n0;
    switch (nv) {
      case 1:
        row_block<E, 1>(M, units, A, lda, b, ldb, alpha, row_scale, accumulate, last, c, ldc);
        break;
      case 2:
        row_block<E, 2>(M, units, A, lda, b, ldb, alpha, row_scale, accumulate, last, c, ldc);
        break;
      case 3:
        row_block<E, 3>(M, units, A, lda, b, ldb, alpha, row_scale, accumulate, last, c, ldc);
        break;
      default:
        row_block<E, 4>(M, units, A, lda, b, ldb, alpha, row_scale, accumulate, last, c, ldc);
        break;
    }
  }
}

// ---- packing: fp32 rows (row stride ld) into the layouts above, zero-padded ----

// A head's rows in qkv, out and their gradients are D floats every (H + 2 Hkv) D or H D: a stride
// of kilobytes, which the hardware prefetchers follow late, so a pass over them waits on memory
// row after row. The loops below ask for the row kAhead rows on: cols floats from x.
constexpr int64_t kAhead = 8;
inline void prefetch(const float* x, int64_t cols) {
  for (int64_t c = 0; c < cols; c += 16) _mm_prefetch(reinterpret_cast<const char*>(x + c), _MM_HINT_T0);
}

// rows x cols into rows of ld_out values; zeros from cols to ld_out.
template <typename E>
void pack_rows(E* out, int64_t ld_out, const float* in, int64_t ld, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    E* o = out + r * ld_out;
    const float* x = in + r * ld;
    prefetch(x + kAhead * ld, cols);
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) o[c] = convert<E>(x[c]);
    std::fill(o + cols, o + ld_out, E{0});
  }
}

// B for a product summing over the rows of `in` (rows x cols): a row of units per kPer rows (bf16:
// rows 2p and 2p+1 interleaved) at out[p * ld_out ..]; zeros where rows or cols run out.
template <typename E>
void pack_row_units(E* out, int64_t ld_out, const float* in, int64_t ld, int64_t rows, int64_t cols) {
  if constexpr (kPer<E> == 1) {
    pack_rows(out, ld_out, in, ld, rows, cols);
  } else {
    for (int64_t p = 0; p < (rows + 1) / 2; ++p) {
      E* o = out + p * ld_out;
      const float* x0 = in + 2 * p * ld;
      const float* x1 = 2 * p + 1 < rows ? x0 + ld : nullptr;
      prefetch(x0 + kAhead * ld, cols);
      prefetch(x0 + (kAhead + 1) * ld, cols);
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) {
        o[2 * c] = convert<E>(x0[c]);
        o[2 * c + 1] = x1 != nullptr ? convert<E>(x1[c]) : E{0};
      }
      std::fill(o + 2 * cols, o + ld_out, E{0});
    }
  }
}

// out[c][r] = in[r][c] for units, in blocks that stay in cache: rows x cols of `in` (row stride
// ld_in units) into cols rows of ld_out units, zeros from rows to ld_out. (transpose16's blocks
// measured 2-3% slower here: the rows are short and the scalar loop streams them.)
void transpose_units(void* out_v, int64_t ld_out, const void* in_v, int64_t ld_in, int64_t rows, int64_t cols) {
  auto* out = static_cast<Unit*>(out_v);
  const auto* in = static_cast<const Unit*>(in_v);
  constexpr int64_t kBlock = 16;
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
    const int64_t r1 = std::min(rows, r0 + kBlock);
    for (int64_t c = 0; c < cols; ++c) {
      for (int64_t r = r0; r < r1; ++r) out[c * ld_out + r] = in[r * ld_in + c];
    }
  }
  for (int64_t c = 0; c < cols; ++c) std::fill(out + c * ld_out + rows, out + (c + 1) * ld_out, Unit{0});
}

// out (T x D, row stride ld) = in^T, in (D x T, row stride ld_in), by 16 x 16 blocks (ragged
// ones an element at a time).
void store_transposed(float* out, int64_t ld, const float* in, int64_t ld_in, int64_t T, int64_t D) {
  constexpr int64_t kBlock = 16;
  for (int64_t j0 = 0; j0 < T; j0 += kBlock) {
    for (int64_t d0 = 0; d0 < D; d0 += kBlock) {
      if (j0 + kBlock <= T && d0 + kBlock <= D) {
        transpose16(reinterpret_cast<Unit*>(out + j0 * ld + d0), ld,
                    reinterpret_cast<const Unit*>(in + d0 * ld_in + j0), ld_in);
        continue;
      }
      for (int64_t j = j0; j < std::min(T, j0 + kBlock); ++j) {
        for (int64_t d = d0; d < std::min(D, d0 + kBlock); ++d) out[j * ld + d] = in[d * ld_in + j];
      }
    }
  }
}

// The elementwise loops' vector: GCC vectorizes a loop that stores bf16 32 values at a time.
constexpr int64_t kVector = 32;

// One thread's share of the workspace. T rounds up to kVector (Tp) and D to 16 (Dp) where they
// count B's columns; D rounds up to a whole unit (De) where it is summed.
template <typename E>
struct Layout {
  int64_t Tp, Dp, De;
  int64_t bytes = 0;
  // fp32
  float *s, *dp, *dkt, *dvt;  // a tile's scores and dP; dK^T, dV^T
  float* di;                  // the head's rowsum(dO * O); forward: a tile's 1 / sum of its row
  // E
  E *p_rows, *p_units, *ds_units;        // a tile's P (backward: dS) by row; P, dS by query units
  E *q, *qt, *dout, *doutt;              // the head's Q and dO by row, and transposed by units
  E *k_cols, *v_cols, *k_rows, *v_rows;  // the group's K and V transposed, and by key units
  E* staging;                            // rows on their way to a transpose

  // base null: only `bytes`, the share's size.
  Layout(float* base, int64_t T, int64_t D) : Tp(round_up(T, kVector)), Dp(round_up(D, 16)), De(round_up(D, kPer<E>)) {
    auto take = [&](int64_t n_bytes) {
      char* p = base == nullptr ? nullptr : reinterpret_cast<char*>(base) + bytes;
      bytes += round_up(n_bytes, 64);
      return p;
    };
    auto floats = [&](int64_t n) { return reinterpret_cast<float*>(take(4 * n)); };
    auto values = [&](int64_t n) { return reinterpret_cast<E*>(take(static_cast<int64_t>(sizeof(E)) * n)); };
    s = floats(kTile * Tp);
    dp = floats(kTile * Tp);
    dkt = floats(D * Tp);
    dvt = floats(D * Tp);
    di = floats(Tp);
    p_rows = values(kTile * Tp);
    p_units = values(kTile * Tp);
    // In fp32 a unit is one query row: dS by query units is dS by row, one buffer.
    ds_units = kPer<E> == 1 ? p_rows : values(kTile * Tp);
    q = values(T * De);
    qt = values(D * Tp);
    dout = values(T * De);
    doutt = values(D * Tp);
    k_cols = values(De * Tp);
    v_cols = values(De * Tp);
    k_rows = values(Tp * Dp);
    v_rows = values(Tp * Dp);
    staging = values(Tp * Dp);
  }

  // B for a product summing over the columns of x (T x D): unit u of row r at [u][r].
  void pack_transposed(E* out, const float* x, int64_t ld, int64_t T, int64_t D) const {
    pack_rows(staging, De, x, ld, T, D);
    transpose_units(out, Tp, staging, De / kPer<E>, T, De / kPer<E>);
  }
  // A for a product summing over the rows of x (T x D): x^T, its rows in units of kPer rows of x.
  void pack_transposed_units(E* out, const float* x, int64_t ld, int64_t T, int64_t D) const {
    pack_row_units(staging, kPer<E> * Dp, x, ld, T, D);
    transpose_units(out, Tp / kPer<E>, staging, Dp, (T + kPer<E> - 1) / kPer<E>, D);
  }
};

template <typename E>
int64_t workspace_floats(int64_t T, int64_t D, int threads) {
  return Layout<E>(nullptr, T, D).bytes / 4 * threads;
}

// One query head's attention against its group's K and V, packed in w: out (T x D, row stride
// out_stride) and its lse (T).
template <typename E>
void forward_head(const Layout<E>& w, float* out, int64_t out_stride, float* lse_bh, const float* q, int64_t stride,
                  int64_t T, int64_t D, float scale) {
  constexpr int64_t per = kPer<E>;
  pack_rows(w.q, w.De, q, stride, T, D);
  for (int64_t r0 = 0; r0 < T; r0 += kTile) {
    const int64_t r1 = std::min(T, r0 + kTile), keys = r1, width = round_up(keys, per);
    gemm_units(r1 - r0, keys, w.De / per, w.q + r0 * w.De, w.De, w.k_cols, per * w.Tp, scale, false, w.s, w.Tp);
    // P's rows unnormalized, exp(s - max), and O = P V / sum at the product's store: the rows
    // are read once after their max. Each pass runs whole vectors (kVector) with no condition on
    // j: the scores right of the diagonal are set to -inf for the max and their exps to zero. (A
    // masked loop is split by GCC into its two halves again, and the scalar tail of up to 31 exps
    // a row cost as much as the vectors.)
    for (int64_t i = r0; i < r1; ++i) {
      float* s = w.s + (i - r0) * w.Tp;
      const int64_t cols = round_up(i + 1, kVector);
      std::fill(s + i + 1, s + cols, -INFINITY);
      float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < cols; ++j) mx = s[j] > mx ? s[j] : mx;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) s[j] = exp_fast(s[j] - mx);
      std::fill(s + i + 1, s + cols, 0.0f);
      E* p = w.p_rows + (i - r0) * w.Tp;
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < cols; ++j) {
        p[j] = convert<E>(s[j]);
        sum += s[j];
      }
      std::fill(p + cols, p + std::max(cols, width), E{0});
      lse_bh[i] = mx + std::log(sum);
      w.di[i - r0] = 1.0f / sum;
    }
    gemm_units(r1 - r0, D, width / per, w.p_rows, w.Tp, w.v_rows, per * w.Dp, 1.0f, false, out + r0 * out_stride,
               out_stride, w.di);
  }
}

template <typename E>
void forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
             float* workspace) {
  constexpr int64_t per = kPer<E>;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t out_stride = H * D, per_thread = workspace_floats<E>(T, D, 1);
  // A task is a run of a kv group's query heads, which packs the group's K and V once for them
  // all: a whole group where there are 4 groups a thread or more, else parts of groups (as many
  // tasks as heads for multi-head attention, whose groups are single heads).
  const int64_t group = H / Hkv, groups = B * Hkv, threads = std::max(1, omp_get_max_threads());
  if (groups == 0) return;
  const int64_t parts = std::min(group, (4 * threads + groups - 1) / groups);
  parallel_for_each(groups * parts, [&](int64_t task, int thread) {
    const int64_t b = task / parts / Hkv, g = task / parts % Hkv, part = task % parts;
    const Layout<E> w(workspace + thread * per_thread, T, D);
    const Head kv = head_of(qkv, b, g * group, T, H, Hkv, D);
    w.pack_transposed(w.k_cols, kv.k, kv.stride, T, D);
    pack_row_units(w.v_rows, per * w.Dp, kv.v, kv.stride, T, D);
    for (int64_t h = g * group + group * part / parts; h < g * group + group * (part + 1) / parts; ++h) {
      forward_head(w, out + b * T * out_stride + h * D, out_stride, lse + (b * H + h) * T,
                   head_of(qkv, b, h, T, H, Hkv, D).q, kv.stride, T, D, scale);
    }
  });
}

// Rows a and b (n values, n a multiple of 16) rounded to bf16 (round to nearest even, as
// f32_to_bf16, but subnormals flushed to zero): as units of pairs (a[j], b[j]) and, where row_a is
// given, as rows. Two rows in one vcvtne2ps2bf16, then paired by one vpermw.
[[maybe_unused]] void round_pairs(Unit* pairs, const float* a, const float* b, int64_t n, uint16_t* row_a,
                                  uint16_t* row_b) {
#if defined(__AVX512BF16__)
  // Word indexes: a[k] and b[k] side by side, and b's values first. (GCC 12's 512-to-256-bit casts
  // and extracts trip its own -Wmaybe-uninitialized, so the halves move by permutes and masks.)
  alignas(64) static constexpr uint16_t kInterleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                           21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                           11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  alignas(64) static constexpr uint16_t kHigh[32] = {16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
                                                     16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};
  const __m512i interleave = _mm512_load_si512(kInterleave), high = _mm512_load_si512(kHigh);
  for (int64_t j = 0; j < n; j += 16) {
    // a's 16 values in the low half, b's in the high half.
    const auto both = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(b + j), _mm512_loadu_ps(a + j));
    _mm512_storeu_si512(pairs + j, _mm512_permutexvar_epi16(interleave, both));
    if (row_a != nullptr) {
      _mm512_mask_storeu_epi16(row_a + j, 0xffff, both);
      _mm512_mask_storeu_epi16(row_b + j, 0xffff, _mm512_permutexvar_epi16(high, both));
    }
  }
#else
  (void)pairs, (void)a, (void)b, (void)n, (void)row_a, (void)row_b;
  CHECK_MSG(false, "bf16 tiles need avx512_bf16");
#endif
}

// A backward tile's P = exp(S - lse) and dS = P (dP - di), zero right of the diagonal, from its
// scores and dP, written as the products want them, a unit of query rows (t, and for bf16 t+1) at a
// time: dS by row (for dQ), P and dS by query units (for dV^T and dK^T), up to `cols` keys. A
// ragged tile's odd last bf16 row pairs with zeros.
template <typename E>
void tile_gradients(const Layout<E>& w, int64_t r0, int64_t r1, int64_t cols, const float* lse) {
  for (int64_t t = 0; t < r1 - r0; t += kPer<E>) {
    const int64_t i0 = r0 + t, i1 = t + 1 < r1 - r0 ? i0 + 1 : -1;  // i1 = -1: no second row
    const float *s0 = w.s + t * w.Tp, *dp0 = w.dp + t * w.Tp;
    const float l0 = lse[i0], di0 = w.di[i0];
    E* ds_row0 = w.p_rows + t * w.Tp;
    if constexpr (kPer<E> == 1) {
      E* p_row = w.p_units + t * w.Tp;  // dS by query units is ds_row0 (Layout)
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) {
        const float p = j <= i0 ? exp_fast(s0[j] - l0) : 0.0f;
        const float ds = j <= i0 ? p * (dp0[j] - di0) : 0.0f;
        p_row[j] = p;
        ds_row0[j] = ds;
      }
    } else {
      // P and dS of the two rows in fp32, in place of their scores and dP (read only here), then
      // rounded to bf16 16 columns at a time.
      float *p0 = w.s + t * w.Tp, *p1 = p0 + w.Tp, *ds0 = w.dp + t * w.Tp, *ds1 = ds0 + w.Tp;
      const float l1 = i1 < 0 ? 0.0f : lse[i1], di1 = i1 < 0 ? 0.0f : w.di[i1];
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) {
        const float e0 = j <= i0 ? exp_fast(p0[j] - l0) : 0.0f;
        const float e1 = j <= i1 ? exp_fast(p1[j] - l1) : 0.0f;
        ds0[j] = j <= i0 ? e0 * (ds0[j] - di0) : 0.0f;
        ds1[j] = j <= i1 ? e1 * (ds1[j] - di1) : 0.0f;
        p0[j] = e0;
        p1[j] = e1;
      }
      round_pairs(reinterpret_cast<Unit*>(w.p_units + t * w.Tp), p0, p1, cols, nullptr, nullptr);
      round_pairs(reinterpret_cast<Unit*>(w.ds_units + t * w.Tp), ds0, ds1, cols, ds_row0, ds_row0 + w.Tp);
    }
  }
}

template <typename E>
void backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int64_t B,
              int64_t T, int64_t H, int64_t Hkv, int64_t D, float* workspace) {
  constexpr int64_t per = kPer<E>;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t group = H / Hkv, stride = (H + 2 * Hkv) * D, out_stride = H * D;
  const int64_t per_thread = workspace_floats<E>(T, D, 1);
  // Threads own whole kv groups, so dk and dv (shared by the group's query heads) have one writer.
  parallel_for_each(B * Hkv, [&](int64_t bg, int thread) {
    const int64_t b = bg / Hkv, g = bg % Hkv;
    const Layout<E> w(workspace + thread * per_thread, T, D);
    const Head kv = head_of(qkv, b, g * group, T, H, Hkv, D);
    w.pack_transposed(w.k_cols, kv.k, stride, T, D);
    w.pack_transposed(w.v_cols, kv.v, stride, T, D);
    pack_row_units(w.k_rows, per * w.Dp, kv.k, stride, T, D);
    std::fill(w.dkt, w.dkt + D * w.Tp, 0.0f);
    std::fill(w.dvt, w.dvt + D * w.Tp, 0.0f);
    float* dq_base = dqkv + b * T * stride;
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      const float* q = qkv + b * T * stride + h * D;
      const float* o = out + b * T * out_stride + h * D;
      const float* dO = dout + b * T * out_stride + h * D;
      pack_rows(w.q, w.De, q, stride, T, D);
      w.pack_transposed_units(w.qt, q, stride, T, D);
      pack_rows(w.dout, w.De, dO, out_stride, T, D);
      w.pack_transposed_units(w.doutt, dO, out_stride, T, D);
      for (int64_t i = 0; i < T; ++i) {
        const float *dOi = dO + i * out_stride, *oi = o + i * out_stride;
        prefetch(oi + kAhead * out_stride, D);
        float di = 0.0f;
#pragma omp simd reduction(+ : di)
        for (int64_t d = 0; d < D; ++d) di += dOi[d] * oi[d];
        w.di[i] = di;
      }
      for (int64_t r0 = 0; r0 < T; r0 += kTile) {
        const int64_t r1 = std::min(T, r0 + kTile), rows = r1 - r0, keys = r1, width = round_up(keys, per);
        gemm_units(rows, keys, w.De / per, w.q + r0 * w.De, w.De, w.k_cols, per * w.Tp, scale, false, w.s, w.Tp);
        gemm_units(rows, keys, w.De / per, w.dout + r0 * w.De, w.De, w.v_cols, per * w.Tp, 1.0f, false, w.dp, w.Tp);
        tile_gradients(w, r0, r1, round_up(keys, 16), lse + (b * H + h) * T);
        gemm_units(rows, D, width / per, w.p_rows, w.Tp, w.k_rows, per * w.Dp, scale, false,
                   dq_base + r0 * stride + h * D, stride);
        const int64_t query_units = (rows + per - 1) / per;
        gemm_units(D, keys, query_units, w.qt + r0, w.Tp, w.ds_units, per * w.Tp, scale, true, w.dkt, w.Tp);
        gemm_units(D, keys, query_units, w.doutt + r0, w.Tp, w.p_units, per * w.Tp, 1.0f, true, w.dvt, w.Tp);
      }
    }
    store_transposed(dq_base + (H + g) * D, stride, w.dkt, w.Tp, T, D);
    store_transposed(dq_base + (H + Hkv + g) * D, stride, w.dvt, w.Tp, T, D);
  });
}

}  // namespace

bool attention_tiles_available([[maybe_unused]] bool bf16) {
#if defined(__AVX512BF16__)
  return true;
#else
  return !bf16;
#endif
}

int64_t attention_tiles_workspace_floats(bool bf16, int64_t T, int64_t D, int threads) {
  CHECK(attention_tiles_available(bf16));
#if defined(__AVX512BF16__)
  if (bf16) return workspace_floats<uint16_t>(T, D, threads);
#endif
  return workspace_floats<float>(T, D, threads);
}

void attention_forward_tiles(bool bf16, float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H,
                             int64_t Hkv, int64_t D, float* workspace) {
  CHECK(attention_tiles_available(bf16));
#if defined(__AVX512BF16__)
  if (bf16) return forward<uint16_t>(out, lse, qkv, B, T, H, Hkv, D, workspace);
#endif
  forward<float>(out, lse, qkv, B, T, H, Hkv, D, workspace);
}

void attention_backward_tiles(bool bf16, float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                              float* workspace) {
  CHECK(attention_tiles_available(bf16));
#if defined(__AVX512BF16__)
  if (bf16) return backward<uint16_t>(dqkv, dout, qkv, out, lse, B, T, H, Hkv, D, workspace);
#endif
  backward<float>(dqkv, dout, qkv, out, lse, B, T, H, Hkv, D, workspace);
}

#else  // no AVX-512: attention.cc's sgemm tiles serve (the dispatch asks first)

bool attention_tiles_available(bool) { return false; }
int64_t attention_tiles_workspace_floats(bool, int64_t, int64_t, int) {
  CHECK_MSG(false, "attention tiles need AVX-512");
  return 0;
}
void attention_forward_tiles(bool, float*, float*, const float*, int64_t, int64_t, int64_t, int64_t, int64_t, float*) {
  CHECK_MSG(false, "attention tiles need AVX-512");
}
void attention_backward_tiles(bool, float*, const float*, const float*, const float*, const float*, int64_t, int64_t,
                              int64_t, int64_t, int64_t, float*) {
  CHECK_MSG(false, "attention tiles need AVX-512");
}

#endif

}  // namespace tessera::kernels::cpu
