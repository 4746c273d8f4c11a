// Reference rotary position embedding, angles and rotations in double.
#include "kernels/ref/rope.h"

#include <cmath>

#include "core/check.h"

namespace tessera::kernels::ref {
namespace {

// Rotates each pair by `sign` times its angle; backward is the same rotation with sign -1
// because a rotation's transpose is its inverse.
void rotate(float* x, int64_t B, int64_t T, int64_t n_heads, int64_t D, int64_t stride, float theta, double sign) {
  CHECK(D % 2 == 0);
  CHECK(stride >= n_heads * D);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < D / 2; ++i) {
      const double freq = std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(i) / static_cast<double>(D));
      const double angle = sign * static_cast<double>(t) * freq;
      const double c = std::cos(angle), s = std::sin(angle);
      for (int64_t b = 0; b < B; ++b) {
        float* row = x + (b * T + t) * stride;
        for (int64_t h = 0; h < n_heads; ++h) {
          float* pair = row + h * D + 2 * i;
          const double x0 = pair[0], x1 = pair[1];
          pair[0] = static_cast<float>(x0 * c - x1 * s);
          pair[1] = static_cast<float>(x0 * s + x1 * c);
        }
      }
    }
  }
}

}  // namespace

void rope_forward(float* x, int64_t B, int64_t T, int64_t n_heads, int64_t D, int64_t stride, float theta) {
  rotate(x, B, T, n_heads, D, stride, theta, 1.0);
}

void rope_backward(float* dx, int64_t B, int64_t T, int64_t n_heads, int64_t D, int64_t stride, float theta) {
  rotate(dx, B, T, n_heads, D, stride, theta, -1.0);
}

}  // namespace tessera::kernels::ref
