// CUDA token embedding. Contract: kernels/ref/embedding.h (vocabulary blocks [v0, v0 + Vb) too);
// device pointers, work queued on `stream`.
//
// The backward adds each table row's gradient in a fixed order without atomics (llm.c's way): the
// host, which has the tokens first anyway, sorts the positions by token into buckets, and one
// thread per (bucket, channel) sums its positions in order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/ref/embedding.h"

namespace tessera::kernels::cuda {

using ref::kWholeVocab;

// out (n,C) = the table's row of each token, a zero row for a token outside the block; the table
// in fp32 or as bf16 bits (widened exactly).
void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t n, int64_t C, int64_t v0,
                       int64_t Vb, cudaStream_t stream);
void embedding_forward_bf16(float* out, const int32_t* tokens, const uint16_t* table, int64_t n, int64_t C, int64_t v0,
                            int64_t Vb, cudaStream_t stream);

// The positions of a batch's tokens grouped by token, on the host. `ints` is what the device needs,
// one array: the positions (token by token, each token's in increasing order), then each bucket's
// table row (token - v0), then each bucket's start in the positions and one past the last.
struct EmbeddingBuckets {
  std::vector<int32_t> ints;
  int64_t positions = 0;  // tokens inside the block
  int64_t count = 0;      // distinct tokens inside the block
};
EmbeddingBuckets embedding_buckets(const int32_t* host_tokens, int64_t n, int64_t v0 = 0, int64_t Vb = kWholeVocab);

// dtable (Vb,C) += dout (n,C) scattered by tokens; `ints` is EmbeddingBuckets::ints on the device.
void embedding_backward(float* dtable, const float* dout, const int32_t* ints, const EmbeddingBuckets& buckets,
                        int64_t C, cudaStream_t stream);

}  // namespace tessera::kernels::cuda
