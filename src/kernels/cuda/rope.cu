// CUDA rotary embedding: one thread per channel pair, the CPU's arithmetic (kernels/cpu/rope.cc).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rope.h"

namespace tessera::kernels::cuda {

namespace {
constexpr int kThreads = 256;

// sign = +1 rotates forward, -1 applies the transpose.
__global__ void rotate_kernel(float* x, const float* table, int64_t rows, int64_t T, int64_t n_heads, int64_t half,
                              int64_t stride, float sign) {
  const int64_t pairs = rows * n_heads * half;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < pairs; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e % half, h = e / half % n_heads, row = e / (half * n_heads);
    const float* cs = table + ((row % T) * half + i) * 2;
    const float c = cs[0], s = sign * cs[1];
    float* p = x + row * stride + h * 2 * half + 2 * i;
    const float a = p[0], b = p[1];
    p[0] = a * c - b * s;
    p[1] = a * s + b * c;
  }
}

void rotate(float* x, const float* table, int64_t B, int64_t T, int64_t n_heads, int64_t D, int64_t stride, float sign,
            cudaStream_t stream) {
  const int64_t pairs = B * T * n_heads * (D / 2);
  if (pairs == 0) return;
  rotate_kernel<<<grid_for(pairs, kThreads), kThreads, 0, stream>>>(x, table, B * T, T, n_heads, D / 2, stride, sign);
  CUDA_CHECK_LAUNCH();
}
}  // namespace

void rope_forward(float* x, const float* table, int64_t B, int64_t T, int64_t n_heads, int64_t D, int64_t stride,
                  cudaStream_t stream) {
  rotate(x, table, B, T, n_heads, D, stride, 1.0f, stream);
}

void rope_backward(float* dx, const float* table, int64_t B, int64_t T, int64_t n_heads, int64_t D, int64_t stride,
                   cudaStream_t stream) {
  rotate(dx, table, B, T, n_heads, D, stride, -1.0f, stream);
}

}  // namespace tessera::kernels::cuda
