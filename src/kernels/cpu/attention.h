// CPU causal grouped-query attention: one (batch, head) at a time per thread, scores for that head
// in a T x T workspace block, recomputed in backward from the saved log-sum-exp (never B*H*T*T).
// Contract: ref/attention.h.
#pragma once

#include <cstdint>

namespace tessera::kernels::cpu {

// Floats of workspace that attention_forward/backward need for `threads` threads.
int64_t attention_workspace_floats(int64_t T, int64_t D, int threads);

void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                       int64_t D, float* workspace);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int64_t B,
                        int64_t T, int64_t H, int64_t Hkv, int64_t D, float* workspace);

// The same attention with its products (Q K^T and P V; in backward also dO V^T, dS K, Q^T dS and
// dO^T P) on bf16-rounded operands with fp32 sums (avx512_bf16), the softmax, its log-sum-exp, the
// row dots and the score gradients in fp32: the CUDA backend's bf16 variant (kernels/cuda/
// attention.h), for mixed precision. Only where attention_bf16_available(); the workspace is its
// own size.
bool attention_bf16_available();
int64_t attention_bf16_workspace_floats(int64_t T, int64_t D, int threads);
void attention_forward_bf16(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                            int64_t D, float* workspace);
void attention_backward_bf16(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                             int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, float* workspace);

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
