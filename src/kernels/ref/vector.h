// Reference elementwise helpers used between ops.
#pragma once

#include <cstdint>

namespace tessera::kernels::ref {

// y (n) += x (n).
void add_inplace(float* y, const float* x, int64_t n);
// Sum of x[i]^2 in double.
double sum_squares(const float* x, int64_t n);
// x (n) *= s.
void scale_inplace(float* x, int64_t n, float s);

}  // namespace tessera::kernels::ref
