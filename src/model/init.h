// Parameter initialization as a pure function of (seed, unit, element): any slice of a unit,
// such as one rank's shard, initializes identically without generating the rest.
#pragma once

#include <cstdint>

#include "model/layout.h"

namespace tessera::model {

// Fills out[0, end-begin) with elements [begin, end) of `unit`'s initial flat buffer: matrices
// N(0, init_std), output projections (wo, w2) scaled by 1/sqrt(2 L) (GPT-2), norm gains 1,
// padding 0. Under tensor parallelism a rank's blocks hold their part of the whole model's
// initialization.
void init_unit_slice(const ModelLayout& layout, int unit, uint64_t seed, int64_t begin, int64_t end, float* out);

}  // namespace tessera::model
