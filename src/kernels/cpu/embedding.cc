// CPU token embedding. The backward splits channels across threads, so every row of dtable is
// summed in token order by one thread: deterministic for any thread count.
#include "kernels/cpu/embedding.h"

#include <cstring>

#include "core/bf16.h"
#include "core/threads.h"

namespace tessera::kernels::cpu {

namespace {
bool held(int32_t token, int64_t v0, int64_t Vb) { return token - v0 >= 0 && token - v0 < Vb; }
}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t n, int64_t C, int64_t v0,
                       int64_t Vb) {
  parallel_for(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (held(tokens[i], v0, Vb)) {
        std::memcpy(out + i * C, table + (tokens[i] - v0) * C, C * sizeof(float));
      } else {
        std::memset(out + i * C, 0, C * sizeof(float));
      }
    }
  });
}

void embedding_forward_bf16(float* out, const int32_t* tokens, const uint16_t* table, int64_t n, int64_t C,
                            int64_t v0, int64_t Vb) {
  parallel_for(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (held(tokens[i], v0, Vb)) {
        bf16_to_f32(table + (tokens[i] - v0) * C, out + i * C, C);
      } else {
        std::memset(out + i * C, 0, C * sizeof(float));
      }
    }
  });
}

void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, int64_t n, int64_t C, int64_t v0,
                        int64_t Vb) {
  parallel_for(C, [&](int64_t c0, int64_t c1) {
    for (int64_t i = 0; i < n; ++i) {
      if (!held(tokens[i], v0, Vb)) continue;
      float* row = dtable + (tokens[i] - v0) * C;
      const float* g = dout + i * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) row[c] += g[c];
    }
  });
}

}  // namespace tessera::kernels::cpu
