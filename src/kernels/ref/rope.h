// Reference rotary position embedding, Meta's Llama layout: channel pairs (2i, 2i+1) of each head
// rotate by angle t * theta^(-2i/D) at position t. (Hugging Face's rotate-half layout differs by a
// permutation of the q and k projection rows; conversion applies it.)
#pragma once

#include <cstdint>

namespace tessera::kernels::ref {

// x: B*T rows, `stride` floats apart; the first n_heads*D floats of each row (n_heads heads of D
// channels) rotate in place; row t of each sequence is at position t.
void rope_forward(float* x, int64_t B, int64_t T, int64_t n_heads, int64_t D, int64_t stride, float theta);
// The gradient of rope_forward: rotates dx in place by the opposite angle.
void rope_backward(float* dx, int64_t B, int64_t T, int64_t n_heads, int64_t D, int64_t stride, float theta);

}  // namespace tessera::kernels::ref
