// Reference token embedding: out[i] = table[tokens[i]]. n tokens, C channels, V vocabulary rows.
#pragma once

#include <cstdint>

namespace tessera::kernels::ref {

// out (n,C) = table (V,C) rows picked by tokens (n), each in [0,V).
void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t n, int64_t C);
// dtable (V,C) += dout (n,C) scattered by tokens (n).
void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, int64_t n, int64_t C);

}  // namespace tessera::kernels::ref
