// CPU rotary embedding from a precomputed cos/sin table. Contract: ref/rope.h.
#pragma once

#include <cstdint>

namespace tessera::kernels::cpu {

// table (T, D/2, 2): cos and sin of t * inv_freq[i], computed in double.
void rope_table(float* table, int64_t T, int64_t D, const double* inv_freq);
// The unscaled frequencies, inv_freq[i] = theta^(-2i/D).
void rope_table(float* table, int64_t T, int64_t D, float theta);
void rope_forward(float* x, const float* table, int64_t B, int64_t T, int64_t n_heads, int64_t D, int64_t stride);
void rope_backward(float* dx, const float* table, int64_t B, int64_t T, int64_t n_heads, int64_t D, int64_t stride);

}  // namespace tessera::kernels::cpu
