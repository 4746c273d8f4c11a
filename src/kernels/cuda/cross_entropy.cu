// CUDA softmax cross-entropy: one block per row; the row's maximum, then its sum of exponentials,
// then (with a gradient) the softmax written over the logits. A row is read three times, from L2
// after the first (a 32000-wide fp32 row is 125 KB).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cross_entropy.h"

namespace tessera::kernels::cuda {

namespace {
constexpr int kThreads = 512;

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(uint16_t* p, float v) { *p = to_bf16_bits(v); }

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
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) store(d + j, 0.0f);
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
    store(d + j, (p - (j == target ? 1.0f : 0.0f)) * dscale);
  }
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

}  // namespace tessera::kernels::cuda
