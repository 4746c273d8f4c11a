// CPU causal grouped-query attention: one (batch, head) at a time per thread, row tiles of 64
// queries against the keys up to the tile's end, recomputed in backward from the saved
// log-sum-exp (never B*H*T*T). Contract: ref/attention.h.
#pragma once

#include <cstdint>

namespace tessera::kernels::cpu {

// The fastest implementation this CPU has: the tiles below where it has AVX-512 (bf16: with
// avx512_bf16, else fp32), the sgemm tiles otherwise. bf16: the products may take bf16-rounded
// operands (mixed precision, Backend::attention_forward's allow_bf16). The workspace fits every
// choice.
int64_t attention_workspace_floats(int64_t T, int64_t D, int threads);
void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                       int64_t D, float* workspace, bool bf16 = false);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int64_t B,
                        int64_t T, int64_t H, int64_t Hkv, int64_t D, float* workspace, bool bf16 = false);

// Every CPU: each tile's products through oneDNN's sgemm, the scores of a head in a T x T block.
int64_t attention_sgemm_workspace_floats(int64_t T, int64_t D, int threads);
void attention_forward_sgemm(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                             int64_t D, float* workspace);
void attention_backward_sgemm(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                              int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, float* workspace);

// AVX-512 (attention_tiles.cc): the tiles' products in registers, fp32 with FMAs or, bf16, on
// bf16-rounded operands with fp32 sums (avx512_bf16's vdpbf16ps; Q K^T and P V, in backward also
// dO V^T, dS K, Q^T dS and dO^T P) while the softmax, its log-sum-exp, the row dots and the score
// gradients stay fp32: the CUDA backend's bf16 variant (kernels/cuda/attention.h). Only where
// attention_tiles_available(bf16).
bool attention_tiles_available(bool bf16);
int64_t attention_tiles_workspace_floats(bool bf16, int64_t T, int64_t D, int threads);
void attention_forward_tiles(bool bf16, float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H,
                             int64_t Hkv, int64_t D, float* workspace);
void attention_backward_tiles(bool bf16, float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                              float* workspace);

// Generation: new queries against a key/value cache, as attention_forward's causal attention
// computes them (same score GEMMs, same softmax), without the lse. Sequence b's queries are rows
// rows[b] .. rows[b+1]-1 of q (row stride q_stride, H heads x D first in each row) at positions
// start[b], start[b]+1, ...; its keys and values are rows 0 .. start[b] + rows[b+1] - rows[b] - 1
// of k and v from row b * max_context on (row stride kv_stride, Hkv heads x D, after RoPE). The
// query at position t attends keys 0 .. t. out (rows[B], H*D). The oracle is
// ref::attention_forward over the whole sequence (cpu_vs_ref_test.cc).
int64_t attention_cached_workspace_floats(int64_t max_context, int threads);
void attention_cached(float* out, const float* q, int64_t q_stride, const float* k, const float* v, int64_t kv_stride,
                      int64_t max_context, const int64_t* rows, const int64_t* start, int64_t B, int64_t H, int64_t Hkv,
                      int64_t D, float* workspace);

}  // namespace tessera::kernels::cpu
