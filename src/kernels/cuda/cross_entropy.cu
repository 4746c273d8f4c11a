// CUDA softmax cross-entropy: one block per row; the row's maximum, then its sum of exponentials,
// then (with a gradient) the softmax written over the logits. A row is read three times, from L2
// after the first (a 32000-wide fp32 row is 125 KB).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cross_entropy.h"

namespace tessera::kernels::cuda {

namespace {
constexpr int kThreads = 512;

// Out: float or uint16_t (bf16 bits); dlogits null for the loss alone.
template <typename Out>
__global__ void cross_entropy_kernel(Out* dlogits, float* losses, const float* logits, const int32_t* targets,
                                     int64_t V, float dscale) {
  __shared__ float scratch[kWarp];
  const int64_t row = blockIdx.x;
  const float* z = logits + row * V;
  const int32_t target = targets[row];
  Out* d = dlogits == nullptr ? nullptr : dlogits + row * V;
  if (target < 0) {  // ignored: loss 0, gradient 0
    if (threadIdx.x == 0) losses[row] = 0.0f;
    if (d != nullptr) {
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) store_as(d + j, 0.0f);
    }
    return;
  }
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, z[j]);
  mx = block_max(mx, scratch);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) sum += expf(z[j] - mx);
  sum = block_sum(sum, scratch);
  const float target_logit = z[target];  // read before the gradient may overwrite it
  __syncthreads();
  if (threadIdx.x == 0) losses[row] = logf(sum) + mx - target_logit;
  if (d == nullptr) return;
  const float inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float p = expf(z[j] - mx) * inv;
    store_as(d + j, (p - (j == target ? 1.0f : 0.0f)) * dscale);
  }
}

// Tensor parallelism's vocabulary-parallel cross-entropy (kernels/ref/cross_entropy.h): each rank
// holds a block of Vb columns of every row; one block of threads per row, as above.
__global__ void vocab_parallel_max_kernel(float* row_max, const float* logits, const int32_t* targets, int64_t Vb) {
  __shared__ float scratch[kWarp];
  const int64_t row = blockIdx.x;
  const float* z = logits + row * Vb;
  if (targets[row] < 0) {  // ignored: 0, as the CPU writes (the row takes no part)
    if (threadIdx.x == 0) row_max[row] = 0.0f;
    return;
  }
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < Vb; j += blockDim.x) mx = fmaxf(mx, z[j]);
  mx = block_max(mx, scratch);
  if (threadIdx.x == 0) row_max[row] = mx;
}

__global__ void vocab_parallel_sums_kernel(float* sum_exp, float* target_logit, const float* logits,
                                           const float* row_max, const int32_t* targets, int64_t Vb, int64_t v0) {
  __shared__ float scratch[kWarp];
  const int64_t row = blockIdx.x;
  const float* z = logits + row * Vb;
  const int32_t target = targets[row];
  float sum = 0.0f;
  if (target >= 0) {  // the same for the whole block
    const float mx = row_max[row];
    for (int64_t j = threadIdx.x; j < Vb; j += blockDim.x) sum += expf(z[j] - mx);
    sum = block_sum(sum, scratch);
  }
  if (threadIdx.x != 0) return;
  const int64_t local = static_cast<int64_t>(target) - v0;
  sum_exp[row] = sum;
  target_logit[row] = target >= 0 && local >= 0 && local < Vb ? z[local] : 0.0f;
}

__global__ void vocab_parallel_loss_kernel(float* dlogits, float* losses, const float* logits, const float* row_max,
                                           const float* sum_exp, const float* target_logit, const int32_t* targets,
                                           int64_t Vb, int64_t v0, float dscale) {
  const int64_t row = blockIdx.x;
  const float* z = logits + row * Vb;
  float* d = dlogits == nullptr ? nullptr : dlogits + row * Vb;
  const int32_t target = targets[row];
  if (target < 0) {
    if (threadIdx.x == 0) losses[row] = 0.0f;
    if (d != nullptr) {
      for (int64_t j = threadIdx.x; j < Vb; j += blockDim.x) d[j] = 0.0f;
    }
    return;
  }
  const float mx = row_max[row];
  if (threadIdx.x == 0) losses[row] = logf(sum_exp[row]) + mx - target_logit[row];
  if (d == nullptr) return;
  const float k = dscale / sum_exp[row];
  const int64_t local = static_cast<int64_t>(target) - v0;
  for (int64_t j = threadIdx.x; j < Vb; j += blockDim.x) {
    const float g = expf(z[j] - mx) * k;  // z[j] read before d[j] (which may alias it) is written
    d[j] = j == local ? g - dscale : g;
  }
}

__global__ void max_of_blocks_kernel(float* out, const float* blocks, int64_t count, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float mx = blocks[i];
  for (int64_t b = 1; b < count; ++b) mx = fmaxf(mx, blocks[b * n + i]);
  out[i] = mx;
}

template <typename Out>
void launch(Out* dlogits, float* losses, const float* logits, const int32_t* targets, int64_t n, int64_t V,
            float dscale, cudaStream_t stream) {
  if (n == 0) return;
  cross_entropy_kernel<Out>
      <<<static_cast<unsigned>(n), kThreads, 0, stream>>>(dlogits, losses, logits, targets, V, dscale);
  CUDA_CHECK_LAUNCH();
}
}  // namespace

void softmax_cross_entropy(float* dlogits, float* losses, const float* logits, const int32_t* targets, int64_t n,
                           int64_t V, float dscale, cudaStream_t stream) {
  launch(dlogits, losses, logits, targets, n, V, dscale, stream);
}

void softmax_cross_entropy_bf16(uint16_t* dlogits, float* losses, const float* logits, const int32_t* targets,
                                int64_t n, int64_t V, float dscale, cudaStream_t stream) {
  launch(dlogits, losses, logits, targets, n, V, dscale, stream);
}

void vocab_parallel_max(float* row_max, const float* logits, const int32_t* targets, int64_t n, int64_t Vb,
                        cudaStream_t stream) {
  if (n == 0) return;
  vocab_parallel_max_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(row_max, logits, targets, Vb);
  CUDA_CHECK_LAUNCH();
}

void vocab_parallel_sums(float* sum_exp, float* target_logit, const float* logits, const float* row_max,
                         const int32_t* targets, int64_t n, int64_t Vb, int64_t v0, cudaStream_t stream) {
  if (n == 0) return;
  vocab_parallel_sums_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(sum_exp, target_logit, logits, row_max,
                                                                                targets, Vb, v0);
  CUDA_CHECK_LAUNCH();
}

void vocab_parallel_loss(float* dlogits, float* losses, const float* logits, const float* row_max, const float* sum_exp,
                         const float* target_logit, const int32_t* targets, int64_t n, int64_t Vb, int64_t v0,
                         float dscale, cudaStream_t stream) {
  if (n == 0) return;
  vocab_parallel_loss_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
      dlogits, losses, logits, row_max, sum_exp, target_logit, targets, Vb, v0, dscale);
  CUDA_CHECK_LAUNCH();
}

void max_of_blocks(float* out, const float* blocks, int64_t count, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  constexpr int kBlock = 256;
  max_of_blocks_kernel<<<static_cast<unsigned>((n + kBlock - 1) / kBlock), kBlock, 0, stream>>>(out, blocks, count, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace tessera::kernels::cuda
