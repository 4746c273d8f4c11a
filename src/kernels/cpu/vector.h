// CPU elementwise helpers. Contract: ref/vector.h. sum_squares reduces per thread in a fixed order.
#pragma once

#include <cstdint>

namespace tessera::kernels::cpu {

void add_inplace(float* y, const float* x, int64_t n);
double sum_squares(const float* x, int64_t n);
void scale_inplace(float* x, int64_t n, float s);

}  // namespace tessera::kernels::cpu
