// Reference token embedding: a gather forward, a scatter-add backward.
#include "kernels/ref/embedding.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/check.h"

namespace tessera::kernels::ref {

void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t n, int64_t C, int64_t v0,
                       int64_t Vb) {
  for (int64_t i = 0; i < n; ++i) {
    CHECK(tokens[i] >= 0);
    const int64_t local = tokens[i] - v0;
    const bool held = local >= 0 && local < Vb;
    for (int64_t c = 0; c < C; ++c) out[i * C + c] = held ? table[local * C + c] : 0.0f;
  }
}

void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, int64_t n, int64_t C, int64_t v0,
                        int64_t Vb) {
  // A repeated token sums its gradients. Adding row by row would round after every repeat, so
  // positions are grouped by token and each group's sum is formed in double before one rounding.
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return tokens[a] < tokens[b]; });
  std::vector<double> sum(static_cast<size_t>(C));
  for (int64_t begin = 0, end = 0; begin < n; begin = end) {
    const int32_t token = tokens[order[begin]];
    CHECK(token >= 0);
    for (end = begin; end < n && tokens[order[end]] == token; ++end) {
    }
    if (token - v0 < 0 || token - v0 >= Vb) continue;  // another block's row
    float* row = dtable + (token - v0) * C;
    for (int64_t c = 0; c < C; ++c) sum[c] = row[c];
    for (int64_t i = begin; i < end; ++i) {
      const float* g = dout + order[i] * C;
      for (int64_t c = 0; c < C; ++c) sum[c] += g[c];
    }
    for (int64_t c = 0; c < C; ++c) row[c] = static_cast<float>(sum[c]);
  }
}

}  // namespace tessera::kernels::ref
