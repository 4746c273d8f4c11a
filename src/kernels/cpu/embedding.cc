// CPU token embedding. The backward splits channels across threads, so every row of dtable is
// summed in token order by one thread: deterministic for any thread count.
#include "kernels/cpu/embedding.h"

#include <cstring>

#include "core/bf16.h"
#include "core/threads.h"

namespace tessera::kernels::cpu {

void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t n, int64_t C) {
  parallel_for(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) std::memcpy(out + i * C, table + int64_t{tokens[i]} * C, C * sizeof(float));
  });
}

void embedding_forward_bf16(float* out, const int32_t* tokens, const uint16_t* table, int64_t n, int64_t C) {
  parallel_for(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) bf16_to_f32(table + int64_t{tokens[i]} * C, out + i * C, C);
  });
}

void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, int64_t n, int64_t C) {
  parallel_for(C, [&](int64_t c0, int64_t c1) {
    for (int64_t i = 0; i < n; ++i) {
      float* row = dtable + int64_t{tokens[i]} * C;
      const float* g = dout + i * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) row[c] += g[c];
    }
  });
}

}  // namespace tessera::kernels::cpu
