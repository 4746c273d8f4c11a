// CUDA attention of new rows over a key/value cache, the contract of kernels/cpu/attention.h's
// attention_cached (model::Decoder): n packed rows, sequence b's rows [rows[b], rows[b + 1]) at
// positions start[b] + i, each attending its sequence's cached positions up to its own. rows
// (B + 1) and start (B) in device memory, like every other pointer; work queued on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace tessera::kernels::cuda {

// Shared memory a block needs: the row's query and its scores against max_context positions
// (at most 48 KiB: max_context up to about 12k).
size_t attention_cached_shared_bytes(int64_t max_context, int64_t D);

void attention_cached(float* out, const float* q, int64_t q_stride, const float* k, const float* v, int64_t kv_stride,
                      int64_t max_context, const int64_t* rows, const int64_t* start, int64_t n, int64_t B, int64_t H,
                      int64_t Hkv, int64_t D, cudaStream_t stream);

}  // namespace tessera::kernels::cuda
