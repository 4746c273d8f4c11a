// CUDA elementwise helpers: grid-stride loops; sum_squares in two fixed-shape passes.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vector.h"

namespace tessera::kernels::cuda {

namespace {
constexpr int kThreads = 256;
constexpr int kSumBlocks = 1024;  // partial sums of the first pass (fixed: the order never changes)

__global__ void add_kernel(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    y[i] += x[i];
  }
}

__global__ void scale_kernel(float* x, int64_t n, float s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    x[i] *= s;
  }
}

__global__ void to_bf16_kernel(uint16_t* out, const float* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = to_bf16_bits(in[i]);
  }
}

__global__ void from_bf16_kernel(float* out, const uint16_t* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = from_bf16_bits(in[i]);
  }
}

// Double sums over a block, in a fixed tree (shared memory, kThreads wide).
__device__ double block_sum_double(double v) {
  __shared__ double s[kThreads];
  s[threadIdx.x] = v;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (static_cast<int>(threadIdx.x) < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  return s[0];
}

// Pass 1: block b sums the elements b, b + kSumBlocks*kThreads, ... strided by thread.
__global__ void sum_squares_partial(double* partial, const float* x, int64_t n) {
  double acc = 0.0;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n; i += int64_t{kSumBlocks} * kThreads) {
    const double xi = x[i];
    acc += xi * xi;
  }
  const double total = block_sum_double(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// Pass 2: one block sums the kSumBlocks partials.
__global__ void sum_partials(double* out, const double* partial) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < kSumBlocks; i += kThreads) acc += partial[i];
  const double total = block_sum_double(acc);
  if (threadIdx.x == 0) *out = total;
}
}  // namespace

void add_inplace(float* y, const float* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(y, x, n);
  CUDA_CHECK_LAUNCH();
}

void scale_inplace(float* x, int64_t n, float s, cudaStream_t stream) {
  if (n == 0) return;
  scale_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, n, s);
  CUDA_CHECK_LAUNCH();
}

void to_bf16(uint16_t* out, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  to_bf16_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(out, in, n);
  CUDA_CHECK_LAUNCH();
}

void from_bf16(float* out, const uint16_t* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  from_bf16_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(out, in, n);
  CUDA_CHECK_LAUNCH();
}

int64_t sum_squares_workspace_doubles() { return kSumBlocks; }

void sum_squares(double* out, const float* x, int64_t n, double* workspace, cudaStream_t stream) {
  sum_squares_partial<<<kSumBlocks, kThreads, 0, stream>>>(workspace, x, n);
  CUDA_CHECK_LAUNCH();
  sum_partials<<<1, kThreads, 0, stream>>>(out, workspace);
  CUDA_CHECK_LAUNCH();
}

}  // namespace tessera::kernels::cuda
