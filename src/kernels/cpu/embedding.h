// CPU token embedding (threads over channels). Contract: ref/embedding.h.
#pragma once

#include <cstdint>

#include "kernels/ref/embedding.h"

namespace tessera::kernels::cpu {

// v0, Vb: the table's block of the vocabulary (ref/embedding.h).
using ref::kWholeVocab;
void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t n, int64_t C, int64_t v0 = 0,
                       int64_t Vb = kWholeVocab);
// The same lookup from a bf16 table (bit patterns, core/bf16.h), widened exactly to fp32.
void embedding_forward_bf16(float* out, const int32_t* tokens, const uint16_t* table, int64_t n, int64_t C,
                            int64_t v0 = 0, int64_t Vb = kWholeVocab);
void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, int64_t n, int64_t C,
                        int64_t v0 = 0, int64_t Vb = kWholeVocab);

}  // namespace tessera::kernels::cpu
