// What the decoder's tests share (decoder_test.cc, decoder_cuda_test.cc): seeded token ids and the
// comparison of two rows of logits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/rng.h"

namespace tessera::model::testing {

inline std::vector<int32_t> random_tokens(int64_t n, int64_t V, uint64_t seed) {
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>(rng::uniform(seed, 0, i) * V) % V;
  return t;
}

// max |got - want| over a row, as a fraction of the row's largest |want|; infinite when got holds
// a NaN or an infinity (std::max would drop a NaN).
inline double row_error(const float* got, const float* want, int64_t V) {
  double err = 0.0, scale = 0.0;
  for (int64_t v = 0; v < V; ++v) {
    if (!std::isfinite(got[v])) return INFINITY;
    err = std::max(err, std::fabs(static_cast<double>(got[v]) - want[v]));
    scale = std::max(scale, std::fabs(static_cast<double>(want[v])));
  }
  return err / scale;
}

}  // namespace tessera::model::testing
