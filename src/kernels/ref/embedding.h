// Reference token embedding: out[i] = table[tokens[i]]. n tokens, C channels, V vocabulary rows.
#pragma once

#include <cstdint>

namespace tessera::kernels::ref {

// out (n,C) = table (V,C) rows picked by tokens (n), each in [0,V).
//
// Vocabulary-parallel (tensor parallelism): a table holding only the block of token ids [v0,
// v0 + Vb) gives token t its row t - v0 and a zero row when t is outside the block, so the sum
// over the blocks' outputs is the whole lookup; the backward adds only the rows of the block.
// The defaults are the whole vocabulary.
constexpr int64_t kWholeVocab = int64_t{1} << 62;
void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t n, int64_t C, int64_t v0 = 0,
                       int64_t Vb = kWholeVocab);
// dtable (V,C) += dout (n,C) scattered by tokens (n).
void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, int64_t n, int64_t C,
                        int64_t v0 = 0, int64_t Vb = kWholeVocab);

}  // namespace tessera::kernels::ref
