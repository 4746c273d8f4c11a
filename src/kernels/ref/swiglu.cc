// Reference SwiGLU forward and backward in double.
#include "kernels/ref/swiglu.h"

#include <cmath>

namespace tessera::kernels::ref {

void swiglu_forward(float* out, const float* h13, int64_t n, int64_t F) {
  for (int64_t i = 0; i < n; ++i) {
    const float* gate = h13 + i * 2 * F;
    const float* up = gate + F;
    for (int64_t f = 0; f < F; ++f) {
      const double g = gate[f];
      out[i * F + f] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[f]);
    }
  }
}

void swiglu_backward(float* dh13, const float* dout, const float* h13, int64_t n, int64_t F) {
  // silu'(g) = sig(g) * (1 + g * (1 - sig(g))).
  for (int64_t i = 0; i < n; ++i) {
    const float* gate = h13 + i * 2 * F;
    const float* up = gate + F;
    float* dgate = dh13 + i * 2 * F;
    float* dup = dgate + F;
    for (int64_t f = 0; f < F; ++f) {
      const double g = gate[f], u = up[f], d = dout[i * F + f];
      const double sig = 1.0 / (1.0 + std::exp(-g));
      dgate[f] = static_cast<float>(d * u * sig * (1.0 + g * (1.0 - sig)));
      dup[f] = static_cast<float>(d * g * sig);
    }
  }
}

}  // namespace tessera::kernels::ref
