// CUDA RMSNorm: one block per row for the row statistics; the weight gradient over column strips
// and row chunks in two passes.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rms_norm.h"

namespace tessera::kernels::cuda {

namespace {
constexpr int kRowThreads = 256;
constexpr int kColThreads = 256;
constexpr int64_t kMaxChunks = 256;  // row chunks of the weight gradient's first pass

int64_t weight_grad_chunks(int64_t n) { return std::min<int64_t>(n, kMaxChunks); }

template <typename Out>
__global__ void forward_kernel(Out* out, float* rstd, const float* x, const float* w, int64_t C, float eps) {
  __shared__ float scratch[kWarp];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * C;
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) ss += xr[c] * xr[c];
  ss = block_sum(ss, scratch);
  const float r = 1.0f / sqrtf(ss / static_cast<float>(C) + eps);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) store_as(out + row * C + c, xr[c] * r * w[c]);
  if (threadIdx.x == 0) rstd[row] = r;
}

// dx_c += r w_c g_c - r^3 x_c / C * sum_j(w_j g_j x_j)   (kernels/ref/rms_norm.cc).
__global__ void input_grad_kernel(float* dx, const float* dout, const float* x, const float* w, const float* rstd,
                                  int64_t C) {
  __shared__ float scratch[kWarp];
  const int64_t row = blockIdx.x;
  const float *xr = x + row * C, *gr = dout + row * C;
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += w[c] * gr[c] * xr[c];
  dot = block_sum(dot, scratch);
  const float r = rstd[row];
  const float k = r * r * r * dot / static_cast<float>(C);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dx[row * C + c] += r * w[c] * gr[c] - k * xr[c];
}

// partial[chunk][c] = sum over the chunk's rows of dout * x * rstd; chunk = blockIdx.y.
__global__ void weight_grad_partial(float* partial, const float* dout, const float* x, const float* rstd, int64_t n,
                                    int64_t C, int64_t chunks) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
  const int64_t rows = (n + chunks - 1) / chunks, begin = blockIdx.y * rows, end = min(n, begin + rows);
  float sum = 0.0f;
  for (int64_t i = begin; i < end; ++i) sum += dout[i * C + c] * x[i * C + c] * rstd[i];
  partial[blockIdx.y * C + c] = sum;
}

__global__ void weight_grad_total(float* dweight, const float* partial, int64_t C, int64_t chunks) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
  float sum = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) sum += partial[k * C + c];
  dweight[c] += sum;
}

template <typename Out>
void forward(Out* out, float* rstd, const float* x, const float* weight, int64_t n, int64_t C, float eps,
             cudaStream_t stream) {
  if (n == 0) return;
  forward_kernel<Out><<<static_cast<unsigned>(n), kRowThreads, 0, stream>>>(out, rstd, x, weight, C, eps);
  CUDA_CHECK_LAUNCH();
}
}  // namespace

void rms_norm_forward(float* out, float* rstd, const float* x, const float* weight, int64_t n, int64_t C, float eps,
                      cudaStream_t stream) {
  forward(out, rstd, x, weight, n, C, eps, stream);
}

void rms_norm_forward_bf16(uint16_t* out, float* rstd, const float* x, const float* weight, int64_t n, int64_t C,
                           float eps, cudaStream_t stream) {
  forward(out, rstd, x, weight, n, C, eps, stream);
}

int64_t rms_norm_backward_workspace_floats(int64_t n, int64_t C) { return weight_grad_chunks(n) * C; }

void rms_norm_backward(float* dx, float* dweight, const float* dout, const float* x, const float* weight,
                       const float* rstd, int64_t n, int64_t C, float* workspace, cudaStream_t stream) {
  if (n == 0) return;
  input_grad_kernel<<<static_cast<unsigned>(n), kRowThreads, 0, stream>>>(dx, dout, x, weight, rstd, C);
  CUDA_CHECK_LAUNCH();
  const int64_t chunks = weight_grad_chunks(n);
  const unsigned strips = static_cast<unsigned>((C + kColThreads - 1) / kColThreads);
  weight_grad_partial<<<dim3(strips, static_cast<unsigned>(chunks)), kColThreads, 0, stream>>>(workspace, dout, x, rstd,
                                                                                               n, C, chunks);
  CUDA_CHECK_LAUNCH();
  weight_grad_total<<<strips, kColThreads, 0, stream>>>(dweight, workspace, C, chunks);
  CUDA_CHECK_LAUNCH();
}

}  // namespace tessera::kernels::cuda
