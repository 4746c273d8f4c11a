// CPU token embedding (threads over channels). Contract: ref/embedding.h.
#pragma once

#include <cstdint>

namespace tessera::kernels::cpu {

void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t n, int64_t C);
// The same lookup from a bf16 table (bit patterns, core/bf16.h), widened exactly to fp32.
void embedding_forward_bf16(float* out, const int32_t* tokens, const uint16_t* table, int64_t n, int64_t C);
void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, int64_t n, int64_t C);

}  // namespace tessera::kernels::cpu
