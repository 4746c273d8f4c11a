// CUDA causal grouped-query attention, flash-attention style: scores live in tiles in shared memory
// and registers, never as a T x T matrix. Contract: kernels/ref/attention.h; device pointers, work
// queued on `stream`. Head dims D of 16, 32, 64 or 128; others fail a CHECK.
//
// bf16 off: fp32 throughout, on CUDA cores (attention.cu). bf16 on: the products (Q K^T and P V;
// in backward also dO V^T, P^T dO, dS^T Q and dS K) take bf16-rounded operands on tensor cores with
// fp32 accumulation, while the softmax, its log-sum-exp, the row dots and the score gradients
// stay fp32 (attention_bf16.cu): what mixed precision does to the weight GEMMs, done to attention.
// qkv and dout must be 16-byte aligned (cudaMalloc and the arena give more): tiles load as float4s.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tessera::kernels::cuda {

// Floats of workspace attention_backward needs: one per (b, h, t), that row's dout . out.
int64_t attention_backward_workspace_floats(int64_t B, int64_t T, int64_t H);

// out (B, T, H*D), lse (B, H, T); qkv (B, T, (H + 2*Hkv) * D). out may not alias qkv.
// bf16_rows_per_warp: the bf16 forward's query rows per warp. 32: 128-row tiles, each K and V
// fragment read from shared memory feeding two products (FlashAttention-2's tiles); 16: 64-row
// tiles, half the registers; 0: the default, 32 for D < 128 (where either gives the same bits) and
// 16 for D = 128 (where 32 spills registers: ptxas -v). For the benchmark that compares them.
void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                       int64_t D, bool bf16, cudaStream_t stream, int bf16_rows_per_warp = 0);
// dqkv (B, T, (H + 2*Hkv) * D) overwritten, aliasing no input; dout and out (B, T, H*D) and lse
// (B, H, T) as the forward left them. No atomics: gradients sum in a fixed order, so the same
// inputs give the same bits.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int64_t B,
                        int64_t T, int64_t H, int64_t Hkv, int64_t D, bool bf16, float* workspace, cudaStream_t stream);

}  // namespace tessera::kernels::cuda
