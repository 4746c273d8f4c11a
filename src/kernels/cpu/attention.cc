// CPU causal grouped-query attention: which implementation runs, and the one every CPU has, on
// oneDNN's sgemm (attention_tiles.cc: the AVX-512 one). Each thread takes one (batch, head) at a
// time and keeps that head's scores in a T x T workspace block; causal structure is exploited by
// row tiles (tile i needs keys [0, end of tile i)), which halves the GEMM work for long sequences.
// The backward recomputes probabilities from the saved log-sum-exp instead of storing B*H*T*T.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/threads.h"
#include "kernels/cpu/attention_head.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/vec_math.h"

namespace tessera::kernels::cpu {
namespace {

using attention_detail::Head;
using attention_detail::head_of;
using attention_detail::kTile;

// P (T,T) rows [0,T): probabilities of the causal softmax from scaled scores, using lse when it is
// given (backward) or computing it (forward). Entries right of the diagonal inside each tile are
// zeroed, since the tile GEMMs that follow read the whole tile width.
void scores(float* P, const Head& hd, int64_t T, int64_t D, float scale) {
  for (int64_t r0 = 0; r0 < T; r0 += kTile) {
    const int64_t r1 = std::min(T, r0 + kTile);
    gemm(false, true, r1 - r0, r1, D, scale, hd.q + r0 * hd.stride, hd.stride, hd.k, hd.stride, 0.0f, P + r0 * T, T);
  }
}

int64_t tile_end(int64_t i, int64_t T) { return std::min(T, (i / kTile + 1) * kTile); }

// A row of scores p[0, width): its causal softmax over p[0, last] in place, zeros after it.
// Returns the log-sum-exp of the scores it normalized.
float causal_softmax_row(float* p, int64_t last, int64_t width) {
  float mx = -INFINITY;
  for (int64_t j = 0; j <= last; ++j) mx = std::max(mx, p[j]);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j <= last; ++j) {
    p[j] = exp_fast(p[j] - mx);
    sum += p[j];
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int64_t j = 0; j <= last; ++j) p[j] *= inv;
  for (int64_t j = last + 1; j < width; ++j) p[j] = 0.0f;
  return mx + std::log(sum);
}

}  // namespace

int64_t attention_workspace_floats(int64_t T, int64_t D, int threads) {
  int64_t floats = attention_sgemm_workspace_floats(T, D, threads);
  for (const bool bf16 : {false, true}) {
    if (attention_tiles_available(bf16)) {
      floats = std::max(floats, attention_tiles_workspace_floats(bf16, T, D, threads));
    }
  }
  return floats;
}

namespace {
// The tiles' precision a call runs, or none where the CPU has no AVX-512 (the sgemm tiles).
std::optional<bool> tiles_for(bool bf16) {
  if (bf16 && attention_tiles_available(true)) return true;
  if (attention_tiles_available(false)) return false;
  return std::nullopt;
}
}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                       int64_t D, float* workspace, bool bf16) {
  if (const auto tiles_bf16 = tiles_for(bf16)) {
    attention_forward_tiles(*tiles_bf16, out, lse, qkv, B, T, H, Hkv, D, workspace);
  } else {
    attention_forward_sgemm(out, lse, qkv, B, T, H, Hkv, D, workspace);
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int64_t B,
                        int64_t T, int64_t H, int64_t Hkv, int64_t D, float* workspace, bool bf16) {
  if (const auto tiles_bf16 = tiles_for(bf16)) {
    attention_backward_tiles(*tiles_bf16, dqkv, dout, qkv, out, lse, B, T, H, Hkv, D, workspace);
  } else {
    attention_backward_sgemm(dqkv, dout, qkv, out, lse, B, T, H, Hkv, D, workspace);
  }
}

int64_t attention_sgemm_workspace_floats(int64_t T, int64_t /*D*/, int threads) { return 2 * T * T * threads; }

void attention_forward_sgemm(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                             int64_t D, float* workspace) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t out_stride = H * D;
  parallel_for_each(B * H, [&](int64_t bh, int thread) {
    const int64_t b = bh / H, h = bh % H;
    const Head hd = head_of(qkv, b, h, T, H, Hkv, D);
    float* P = workspace + thread * 2 * T * T;
    scores(P, hd, T, D, scale);
    float* lse_bh = lse + (b * H + h) * T;
    for (int64_t i = 0; i < T; ++i) lse_bh[i] = causal_softmax_row(P + i * T, i, tile_end(i, T));
    float* o = out + b * T * out_stride + h * D;
    for (int64_t r0 = 0; r0 < T; r0 += kTile) {
      const int64_t r1 = std::min(T, r0 + kTile);
      gemm(false, false, r1 - r0, D, r1, 1.0f, P + r0 * T, T, hd.v, hd.stride, 0.0f, o + r0 * out_stride, out_stride);
    }
  });
}

void attention_backward_sgemm(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                              int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, float* workspace) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t group = H / Hkv, stride = (H + 2 * Hkv) * D, out_stride = H * D;
  // Threads own whole kv groups, so dk and dv (shared by the group's query heads) have one writer.
  parallel_for_each(B * Hkv, [&](int64_t bg, int thread) {
    const int64_t b = bg / Hkv, g = bg % Hkv;
    float* P = workspace + thread * 2 * T * T;
    float* dS = P + T * T;
    float* dq_base = dqkv + b * T * stride;
    float* dk = dq_base + (H + g) * D;
    float* dv = dq_base + (H + Hkv + g) * D;
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      const Head hd = head_of(qkv, b, h, T, H, Hkv, D);
      const float* lse_bh = lse + (b * H + h) * T;
      const float* o = out + b * T * out_stride + h * D;
      const float* dO = dout + b * T * out_stride + h * D;
      scores(P, hd, T, D, scale);
      // dP = dO V^T (row tiles, causal), then dS = P * (dP - rowsum(dO * O)).
      for (int64_t r0 = 0; r0 < T; r0 += kTile) {
        const int64_t r1 = std::min(T, r0 + kTile);
        gemm(false, true, r1 - r0, r1, D, 1.0f, dO + r0 * out_stride, out_stride, hd.v, hd.stride, 0.0f, dS + r0 * T,
             T);
      }
      for (int64_t i = 0; i < T; ++i) {
        float* p = P + i * T;
        float* ds = dS + i * T;
        const float l = lse_bh[i];
        // Row pointers first: out_stride read through the closure inside the loop makes `omp simd`
        // gather.
        const float *dOi = dO + i * out_stride, *oi = o + i * out_stride;
        float di = 0.0f;
#pragma omp simd reduction(+ : di)
        for (int64_t d = 0; d < D; ++d) di += dOi[d] * oi[d];
#pragma omp simd
        for (int64_t j = 0; j <= i; ++j) {
          p[j] = exp_fast(p[j] - l);
          ds[j] = p[j] * (ds[j] - di);
        }
        for (int64_t j = i + 1, e = tile_end(i, T); j < e; ++j) p[j] = ds[j] = 0.0f;
      }
      // dq = scale dS K, by query-row tiles.
      float* dq = dq_base + h * D;
      for (int64_t r0 = 0; r0 < T; r0 += kTile) {
        const int64_t r1 = std::min(T, r0 + kTile);
        gemm(false, false, r1 - r0, D, r1, scale, dS + r0 * T, T, hd.k, hd.stride, 0.0f, dq + r0 * stride, stride);
      }
      // dk += scale dS^T Q and dv += P^T dO, by key-row tiles: key j gets queries i >= j only.
      // Above-diagonal entries inside a query tile are zero, so starting at the key tile is exact.
      const float beta = h == g * group ? 0.0f : 1.0f;
      for (int64_t c0 = 0; c0 < T; c0 += kTile) {
        const int64_t c1 = std::min(T, c0 + kTile);
        gemm(true, false, c1 - c0, D, T - c0, scale, dS + c0 * T + c0, T, hd.q + c0 * stride, stride, beta,
             dk + c0 * stride, stride);
        gemm(true, false, c1 - c0, D, T - c0, 1.0f, P + c0 * T + c0, T, dO + c0 * out_stride, out_stride, beta,
             dv + c0 * stride, stride);
      }
    }
  });
}

int64_t attention_cached_workspace_floats(int64_t max_context, int threads) { return kTile * max_context * threads; }

void attention_cached(float* out, const float* q, int64_t q_stride, const float* k, const float* v, int64_t kv_stride,
                      int64_t max_context, const int64_t* rows, const int64_t* start, int64_t B, int64_t H, int64_t Hkv,
                      int64_t D, float* workspace) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t group = H / Hkv, out_stride = H * D;
  parallel_for_each(B * H, [&](int64_t bh, int thread) {
    const int64_t b = bh / H, h = bh % H, n = rows[b + 1] - rows[b];
    const float* kb = k + b * max_context * kv_stride + (h / group) * D;
    const float* vb = v + b * max_context * kv_stride + (h / group) * D;
    float* P = workspace + thread * kTile * max_context;
    // A tile of queries needs the keys up to its last query's position; P's rows are that wide.
    for (int64_t r0 = 0; r0 < n; r0 += kTile) {
      const int64_t r1 = std::min(n, r0 + kTile), keys = start[b] + r1;
      const float* qr = q + (rows[b] + r0) * q_stride + h * D;
      gemm(false, true, r1 - r0, keys, D, scale, qr, q_stride, kb, kv_stride, 0.0f, P, keys);
      for (int64_t i = r0; i < r1; ++i) causal_softmax_row(P + (i - r0) * keys, start[b] + i, keys);
      gemm(false, false, r1 - r0, D, keys, 1.0f, P, keys, vb, kv_stride, 0.0f,
           out + (rows[b] + r0) * out_stride + h * D, out_stride);
    }
  });
}

}  // namespace tessera::kernels::cpu
