// CUDA SwiGLU: one thread per output element, grid-stride. expf, not __expf: the accuracy of the
// CPU path's exp (a few ulp), which the tests against the reference expect.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/swiglu.h"

namespace tessera::kernels::cuda {

namespace {
constexpr int kThreads = 256;

template <typename Out>
__global__ void forward_kernel(Out* out, const float* h13, int64_t n, int64_t F) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n * F; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / F, f = e % F;
    const float g = h13[i * 2 * F + f], u = h13[i * 2 * F + F + f];
    store_as(out + e, g / (1.0f + expf(-g)) * u);
  }
}

template <typename Out>
__global__ void backward_kernel(Out* dh13, const float* dout, const float* h13, int64_t n, int64_t F) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n * F; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / F, f = e % F;
    const float g = h13[i * 2 * F + f], u = h13[i * 2 * F + F + f], d = dout[e];
    const float sig = 1.0f / (1.0f + expf(-g));
    // silu'(g) = sig(g) (1 + g (1 - sig(g))).
    store_as(dh13 + i * 2 * F + f, d * u * sig * (1.0f + g * (1.0f - sig)));
    store_as(dh13 + i * 2 * F + F + f, d * g * sig);
  }
}

template <typename Out>
void forward(Out* out, const float* h13, int64_t n, int64_t F, cudaStream_t stream) {
  if (n * F == 0) return;
  forward_kernel<Out><<<grid_for(n * F, kThreads), kThreads, 0, stream>>>(out, h13, n, F);
  CUDA_CHECK_LAUNCH();
}

template <typename Out>
void backward(Out* dh13, const float* dout, const float* h13, int64_t n, int64_t F, cudaStream_t stream) {
  if (n * F == 0) return;
  backward_kernel<Out><<<grid_for(n * F, kThreads), kThreads, 0, stream>>>(dh13, dout, h13, n, F);
  CUDA_CHECK_LAUNCH();
}
}  // namespace

void swiglu_forward(float* out, const float* h13, int64_t n, int64_t F, cudaStream_t stream) {
  forward(out, h13, n, F, stream);
}
void swiglu_forward_bf16(uint16_t* out, const float* h13, int64_t n, int64_t F, cudaStream_t stream) {
  forward(out, h13, n, F, stream);
}

void swiglu_backward(float* dh13, const float* dout, const float* h13, int64_t n, int64_t F, cudaStream_t stream) {
  backward(dh13, dout, h13, n, F, stream);
}
void swiglu_backward_bf16(uint16_t* dh13, const float* dout, const float* h13, int64_t n, int64_t F,
                          cudaStream_t stream) {
  backward(dh13, dout, h13, n, F, stream);
}

}  // namespace tessera::kernels::cuda
