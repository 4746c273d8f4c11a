// Reference elementwise helpers.
#include "kernels/ref/vector.h"

namespace tessera::kernels::ref {

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(static_cast<double>(y[i]) + x[i]);
}

double sum_squares(const float* x, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

void scale_inplace(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(static_cast<double>(x[i]) * s);
}

}  // namespace tessera::kernels::ref
