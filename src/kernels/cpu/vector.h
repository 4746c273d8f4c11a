// CPU elementwise helpers. Contract: ref/vector.h. sum_squares reduces per thread in a fixed order.
#pragma once

#include <cstdint>

namespace tessera::kernels::cpu {

void add_inplace(float* y, const float* x, int64_t n);
double sum_squares(const float* x, int64_t n);
void scale_inplace(float* x, int64_t n, float s);
// out (n) = in (n) rounded to bf16, bitwise as core/bf16.h's f32_to_bf16 (nearest even; NaN stays
// NaN); threads over the buffer. Feeds the bf16 GEMMs their activations.
void to_bf16(uint16_t* out, const float* in, int64_t n);
// The calling thread's fp32 scratch row of at least n floats, kept between calls (a kernel's row
// before its rounding to bf16, core/bf16.h's write_rounded).
float* thread_row(int64_t n);

}  // namespace tessera::kernels::cpu
