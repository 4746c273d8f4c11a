// CUDA embedding: a gather forward, a bucketed deterministic backward.
#include <algorithm>
#include <utility>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/embedding.h"

namespace tessera::kernels::cuda {

namespace {
constexpr int kThreads = 256;

__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ float widen(uint16_t x) { return from_bf16_bits(x); }

template <typename Table>
__global__ void forward_kernel(float* out, const int32_t* tokens, const Table* table, int64_t n, int64_t C, int64_t v0,
                               int64_t Vb) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n * C; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / C, c = e % C, row = static_cast<int64_t>(tokens[i]) - v0;
    out[e] = row >= 0 && row < Vb ? widen(table[row * C + c]) : 0.0f;
  }
}

template <typename Table>
void forward(float* out, const int32_t* tokens, const Table* table, int64_t n, int64_t C, int64_t v0, int64_t Vb,
             cudaStream_t stream) {
  if (n * C == 0) return;
  forward_kernel<Table><<<grid_for(n * C, kThreads), kThreads, 0, stream>>>(out, tokens, table, n, C, v0, Vb);
  CUDA_CHECK_LAUNCH();
}

// Block (bucket, channel strip): each thread one channel of the bucket's row.
__global__ void backward_kernel(float* dtable, const float* dout, const int32_t* positions, const int32_t* rows,
                                const int32_t* starts, int64_t C) {
  const int64_t b = blockIdx.x, c = blockIdx.y * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
  float sum = 0.0f;
  for (int32_t k = starts[b]; k < starts[b + 1]; ++k) sum += dout[static_cast<int64_t>(positions[k]) * C + c];
  dtable[static_cast<int64_t>(rows[b]) * C + c] += sum;
}
}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t n, int64_t C, int64_t v0,
                       int64_t Vb, cudaStream_t stream) {
  forward(out, tokens, table, n, C, v0, Vb, stream);
}

void embedding_forward_bf16(float* out, const int32_t* tokens, const uint16_t* table, int64_t n, int64_t C, int64_t v0,
                            int64_t Vb, cudaStream_t stream) {
  forward(out, tokens, table, n, C, v0, Vb, stream);
}

EmbeddingBuckets embedding_buckets(const int32_t* host_tokens, int64_t n, int64_t v0, int64_t Vb) {
  // A stable sort by row: O(n log n) in the batch's tokens, nothing proportional to the vocabulary.
  std::vector<std::pair<int32_t, int32_t>> order;  // (row, position)
  order.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = static_cast<int64_t>(host_tokens[i]) - v0;
    if (row >= 0 && row < Vb) order.emplace_back(static_cast<int32_t>(row), static_cast<int32_t>(i));
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  EmbeddingBuckets out;
  out.positions = static_cast<int64_t>(order.size());
  std::vector<int32_t> rows, starts;
  for (size_t k = 0; k < order.size(); ++k) {
    if (k == 0 || order[k].first != order[k - 1].first) {
      rows.push_back(order[k].first);
      starts.push_back(static_cast<int32_t>(k));
    }
  }
  starts.push_back(static_cast<int32_t>(order.size()));
  out.count = static_cast<int64_t>(rows.size());
  out.ints.reserve(order.size() + rows.size() + starts.size());
  for (const auto& [row, pos] : order) out.ints.push_back(pos);
  out.ints.insert(out.ints.end(), rows.begin(), rows.end());
  out.ints.insert(out.ints.end(), starts.begin(), starts.end());
  return out;
}

void embedding_backward(float* dtable, const float* dout, const int32_t* ints, const EmbeddingBuckets& buckets,
                        int64_t C, cudaStream_t stream) {
  if (buckets.count == 0 || C == 0) return;
  const int32_t* positions = ints;
  const int32_t* rows = positions + buckets.positions;
  const int32_t* starts = rows + buckets.count;
  const dim3 grid(static_cast<unsigned>(buckets.count), static_cast<unsigned>((C + kThreads - 1) / kThreads));
  backward_kernel<<<grid, kThreads, 0, stream>>>(dtable, dout, positions, rows, starts, C);
  CUDA_CHECK_LAUNCH();
}

}  // namespace tessera::kernels::cuda
