// CUDA attention of new rows over a key/value cache (generation): one block per (row, head). The
// row's scores against its sequence's cached keys go to shared memory, a block-wide softmax, then
// each thread sums one channel of the values in position order: no atomics, the same bits every
// run. The cache holds at most max_context positions, whose scores fit in shared memory.
#include "core/check.h"
#include "kernels/cuda/attention_cached.h"
#include "kernels/cuda/common.cuh"

namespace tessera::kernels::cuda {

namespace {
constexpr int kThreads = 128;

__global__ void cached_kernel(float* out, const float* q, int64_t q_stride, const float* k, const float* v,
                              int64_t kv_stride, int64_t max_context, const int64_t* rows, const int64_t* start,
                              int64_t B, int64_t H, int64_t Hkv, int64_t D, float scale) {
  extern __shared__ float smem[];
  float* qs = smem;                       // D
  float* scores = qs + D;                 // max_context
  float* scratch = scores + max_context;  // 32
  const int64_t r = blockIdx.y, h = blockIdx.x;
  int64_t b = 0;  // the sequence of row r: rows[b] <= r < rows[b + 1]
  while (b + 1 < B && rows[b + 1] <= r) ++b;
  const int64_t keys = start[b] + (r - rows[b]) + 1;  // causal: positions 0..its own
  const int64_t kvh = h / (H / Hkv);
  const float* kb = k + b * max_context * kv_stride + kvh * D;
  const float* vb = v + b * max_context * kv_stride + kvh * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) qs[d] = q[r * q_stride + h * D + d];
  __syncthreads();
  float top = -INFINITY;
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) {
    float s = 0.0f;
    for (int64_t d = 0; d < D; ++d) s += qs[d] * kb[j * kv_stride + d];
    scores[j] = s * scale;
    top = fmaxf(top, scores[j]);
  }
  top = block_max(top, scratch);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) sum += scores[j] = expf(scores[j] - top);
  sum = block_sum(sum, scratch);  // its __syncthreads also publishes the scores
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < keys; ++j) acc += scores[j] * vb[j * kv_stride + d];
    out[r * H * D + h * D + d] = acc / sum;
  }
}
}  // namespace

size_t attention_cached_shared_bytes(int64_t max_context, int64_t D) {
  return sizeof(float) * static_cast<size_t>(D + max_context + 32);
}

void attention_cached(float* out, const float* q, int64_t q_stride, const float* k, const float* v, int64_t kv_stride,
                      int64_t max_context, const int64_t* rows, const int64_t* start, int64_t n, int64_t B, int64_t H,
                      int64_t Hkv, int64_t D, cudaStream_t stream) {
  if (n == 0) return;
  CHECK(H % Hkv == 0 && n <= 65535 && H <= 65535);
  const size_t smem = attention_cached_shared_bytes(max_context, D);
  CHECK_MSG(smem <= 48 * 1024, "the cached attention's scores do not fit in shared memory (max_context too long)");
  cached_kernel<<<dim3(static_cast<unsigned>(H), static_cast<unsigned>(n)), kThreads, smem, stream>>>(
      out, q, q_stride, k, v, kv_stride, max_context, rows, start, B, H, Hkv, D, 1.0f / sqrtf(static_cast<float>(D)));
  CUDA_CHECK_LAUNCH();
}

}  // namespace tessera::kernels::cuda
